"""The client recipes in examples/, run as a user runs them: a subprocess
whose environment holds only what ``eval "$(tierstore env)"`` exports (the
standard AWS variables and the admin API's), pointed at a real gateway.
Each recipe checks every byte it reads and exits non-zero on a mismatch;
each test asserts the exit status and the recipe's summary lines."""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.integration.conftest import AWS_BIN, aws_env
from tests.servers import ADMIN_TOKEN, Gateway

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def recipe_env(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A clean environment (no AWS_* or TIERSTORE_* of the caller, HOME of
    its own, no AWS config files) with the gateway's variables, and the
    venv's bin first on PATH for the AWS CLI."""
    env = aws_env(tmp_path_factory.mktemp("recipes-home"))
    env.update(
        AWS_ENDPOINT_URL=gateway.endpoint,
        TIERSTORE_ADMIN_URL=gateway.admin_url,
        TIERSTORE_ADMIN_TOKEN=ADMIN_TOKEN,
        PATH=f"{AWS_BIN.parent}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def run(env: dict[str, str], script: str, *args: str, expect: int = 0,
        timeout: float = 120) -> list[str]:
    """Run one recipe from the repository root; its stdout lines."""
    path = EXAMPLES / script
    command = ["bash", str(path)] if path.suffix == ".sh" else [sys.executable, str(path)]
    done = subprocess.run([*command, *args], cwd=EXAMPLES.parent, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == expect, (
        f"{script} {' '.join(args)} exited {done.returncode}, expected {expect}\n"
        f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    )
    return done.stdout.splitlines() if expect == 0 else done.stderr.splitlines()


def test_boto3(recipe_env: dict[str, str]) -> None:
    out = run(recipe_env, "boto3_basics.py", "--bucket", "recipe-boto3")
    assert out[0].startswith("uploaded 7 files, 9.3 MiB, to s3://recipe-boto3 at http://127.0.0.1:")
    assert "listed 7 keys in 4 pages" in out
    assert out[-1] == "OK: boto3 verified 7 objects, 9749517 bytes"


def test_fsspec(recipe_env: dict[str, str]) -> None:
    out = run(recipe_env, "fsspec_files.py", "--bucket", "recipe-fsspec")
    assert "glob, ls and info agree; read back 6 text files" in out
    assert out[-1] == "OK: fsspec verified 7 objects"


def test_awscli(recipe_env: dict[str, str]) -> None:
    out = run(recipe_env, "awscli.sh", "recipe-awscli")
    assert "aws s3 ls --recursive: 25 objects" in out
    assert "synced back down: identical; a second sync copies nothing" in out
    assert out[-1] == "OK: awscli verified 25 objects"


def test_pyarrow(recipe_env: dict[str, str]) -> None:
    out = run(recipe_env, "pyarrow_parquet.py", "--bucket", "recipe-arrow")
    assert out[0] == ("wrote 6000 rows as 12 Parquet files in 4 partitions "
                      "to s3://recipe-arrow/scores")
    assert out[1].startswith("filter + projection read 500 rows x 2 columns")
    assert out[-1] == "OK: pyarrow verified 6000 rows in 12 files"


def test_webdataset_reads_the_hinted_order_and_catches_a_bad_sample(
    recipe_env: dict[str, str], s3, gateway: Gateway
) -> None:
    assert shutil.which("curl", path=recipe_env["PATH"]), "WebDataset reads http(s) URLs with curl"
    bucket = "recipe-wds"
    out = run(recipe_env, "webdataset_shards.py", "--bucket", bucket, "--seed", "3")
    assert out[0] == ("wrote 16 shards x 32 samples (3.1 MiB) and shards/manifest.json "
                      f"to s3://{bucket}")
    assert out[1].startswith("read 512 samples from 16 shards in the hinted order (seed 3")
    assert ": finished, 16/16 objects read" in out[2]
    assert out[-1] == "OK: webdataset verified 512 samples"

    # One byte of one sample changed: the next epoch must fail on it.
    shard = "shards/train-0005.tar"
    body = bytearray(s3.get_object(Bucket=bucket, Key=shard)["Body"].read())
    with tarfile.open(fileobj=io.BytesIO(bytes(body))) as tar:
        member = tar.getmember("sample-0005-007.bin")
    body[member.offset_data + 100] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=shard, Body=bytes(body))
    err = run(recipe_env, "webdataset_shards.py", "--bucket", bucket, "--read-only", expect=1)
    assert err[-1] == f"FAILED: sample-0005-007.bin in {shard}: checksum mismatch"
    # The failed epoch stopped halfway: end it, so its hints leave the shared gateway.
    for epoch in gateway.admin("GET", "/epochs").json()["epochs"]:
        if epoch["bucket"] == bucket and epoch["state"] == "active":
            gateway.admin("DELETE", f"/epochs/{epoch['id']}")


def test_torch_style_datasets(recipe_env: dict[str, str]) -> None:
    out = run(recipe_env, "torch_datasets.py", "--bucket", "recipe-torch", "--workers", "2")
    assert out[0].startswith("wrote 128 samples to s3://recipe-torch/samples/")
    assert out[1].startswith("map-style epoch: 128 samples in random order")
    assert ": finished, 128/128 objects read" in out[2]
    assert out[3] == "iterable epoch: 128 samples split across 2 workers, each read once"
    assert out[-1] == "OK: torch-style data sets verified 256 reads"


def test_s3torchconnector_client(recipe_env: dict[str, str]) -> None:
    out = run(recipe_env, "s3torch_client.py", "--bucket", "recipe-s3torch", "--skip-datasets")
    assert out[0] == ("put 9 objects (9.2 MiB) to s3://recipe-s3torch/images/ "
                      "with MountpointS3Client")
    assert out[1] == "listed, headed and read back 9 objects, and a range across a part boundary"
    assert out[-1] == "OK: s3torchconnector verified 9 objects"


@pytest.mark.skipif(importlib.util.find_spec("s3torchconnector") is None,
                    reason="s3torchconnector (needs torch, not a test extra) is not installed")
def test_s3torchconnector_datasets(recipe_env: dict[str, str]) -> None:
    out = run(recipe_env, "s3torch_client.py", "--bucket", "recipe-s3torch-datasets")
    assert "S3MapDataset and S3IterableDataset (2 workers, sharded) read 9 objects each" in out
    assert out[-1] == "OK: s3torchconnector verified 9 objects"


def test_batch_dataset(recipe_env: dict[str, str]) -> None:
    out = run(recipe_env, "batch_dataset.py", "--bucket", "recipe-batch", "--batch-size", "32")
    assert out[0].startswith("wrote 256 samples to s3://recipe-batch/samples/")
    assert out[1].startswith("batched epoch: 256 samples in 8 requests of up to 32, ")
    assert ": finished, 256/256 objects read" in out[2]
    assert out[3].startswith("one GET per sample: 256 requests, ")
    assert out[-1] == "OK: batch data set verified 256 samples"


def test_virtual_shards_with_webdataset(recipe_env: dict[str, str]) -> None:
    assert shutil.which("curl", path=recipe_env["PATH"]), "WebDataset reads http(s) URLs with curl"
    out = run(recipe_env, "virtual_shards.py", "--bucket", "recipe-vshards")
    assert out[0] == "wrote 256 samples as 512 objects; 8 virtual shards of 32 samples"
    assert out[1].startswith("webdataset read 256 samples from 8 virtual shards in order: ")
    assert out[-1] == "OK: virtual shards verified 256 samples"
