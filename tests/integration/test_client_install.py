"""The trainer-side client installed alone: a fresh virtual environment gets
``pip install <checkout>`` (the base install, no extra), and a script run in
it reads a hinted epoch from a real gateway with ``HintedSampler``, plain
botocore GETs and one ``get_batch``, with none of the server's dependencies
installed and no server module loaded."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.conftest import make_client
from tests.servers import ACCESS_KEY, ADMIN_TOKEN, SECRET_KEY, Gateway

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ["fastapi", "uvicorn", "rocksdict", "aiobotocore", "zstandard", "typer", "msgpack"]

SCRIPT = r"""
import hashlib, importlib.util, json, sys
import botocore.session
from gateway.client import HintedSampler, Hints, get_batch

args = json.loads(sys.argv[1])
installed = [name for name in args["server_only"] if importlib.util.find_spec(name) is not None]
s3 = botocore.session.get_session().create_client(
    "s3", endpoint_url=args["endpoint"], aws_access_key_id=args["access_key"],
    aws_secret_access_key=args["secret_key"], region_name="us-east-1")
keys = sorted(args["digests"])
hints = Hints(args["admin_url"], args["token"], strict=True)
sampler = HintedSampler(range(len(keys))[::-1], keys, bucket=args["bucket"], hints=hints)
wrong = []
for i in sampler:  # the epoch, in the order it was hinted
    body = s3.get_object(Bucket=args["bucket"], Key=keys[i])["Body"].read()
    if hashlib.sha256(body).hexdigest() != args["digests"][keys[i]]:
        wrong.append(keys[i])
batch = {key: hashlib.sha256(data).hexdigest() for key, data in get_batch(
    args["bucket"], keys[:8], endpoint_url=args["endpoint"], access_key=args["access_key"],
    secret_key=args["secret_key"], region="us-east-1")}
server = sorted(m for m in sys.modules if m.split(".")[0] in ("tiering", "packer")
                or (m.startswith("gateway.") and not m.startswith("gateway.client")))
print(json.dumps({"installed": installed, "wrong": wrong, "epoch": sampler.epoch_id,
                  "status": hints.status(sampler.epoch_id), "batch": batch, "server_modules": server}))
"""


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the checkout installed plainly, built from a copy of the
    sources so the checkout gets no build/ or egg-info of its own."""
    root = tmp_path_factory.mktemp("client-alone")
    source = root / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("gateway", "tiering", "packer"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)],
                   check=True, env=env, timeout=600)
    return python


def test_the_client_alone_reads_a_hinted_epoch(client_venv: Path, gateway: Gateway, tmp_path: Path) -> None:
    s3 = make_client(gateway.endpoint)
    bucket = "client-alone"
    s3.create_bucket(Bucket=bucket)
    digests = {}
    for i in range(40):
        body = os.urandom(4096 + i)
        s3.put_object(Bucket=bucket, Key=f"train/{i:03d}.bin", Body=body)
        digests[f"train/{i:03d}.bin"] = hashlib.sha256(body).hexdigest()
    args = {"endpoint": gateway.endpoint, "admin_url": gateway.admin_url, "token": ADMIN_TOKEN,
            "access_key": ACCESS_KEY, "secret_key": SECRET_KEY, "bucket": bucket, "digests": digests,
            "server_only": SERVER_ONLY}
    # Run from an empty directory: the checkout must not be importable from the cwd.
    out = subprocess.run([client_venv, "-c", SCRIPT, json.dumps(args)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["installed"] == [], "the client's install brought the server's dependencies"
    assert result["server_modules"] == []
    assert result["wrong"] == []
    assert result["batch"] == {key: digests[key] for key in sorted(digests)[:8]}
    status = result["status"]
    assert status["objects"] == 40 and status["consumed"] == 40, status
    assert gateway.admin("GET", f"/epochs/{result['epoch']}").json()["consumed"] == 40


def test_the_server_check_sees_what_the_test_venv_has() -> None:
    """The dependency check itself: the suite's own venv has the server installed."""
    import importlib.util
    assert all(importlib.util.find_spec(name) is not None for name in SERVER_ONLY), sys.prefix
