"""docs/quickstart.md, run as written.

The blocks marked ``<!-- test: NAME -->`` in the quickstart are run here by
bash, in a working directory of the test's own that holds ``.venv`` (this
interpreter's environment) and ``examples/``, so ``./tierstore-data`` lands
there. The only changes: the gateway's ports (TIERSTORE_PORT and
TIERSTORE_ADMIN_PORT, free ones, in the environment of every block) and,
for the S3 section, the values of the exported capacity variables (a moto
server's, instead of the example's).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.integration.conftest import clean_env
from tests.servers import free_ports, stop_process, wait_http

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
BLOCK = re.compile(r"<!-- test: (\w+) -->\n```sh\n(.*?)```", re.S)
EXPORT = re.compile(r"^export (.*)$", re.M)


def blocks(name: str) -> list[str]:
    found = [text for kind, text in BLOCK.findall(QUICKSTART.read_text()) if kind == name]
    assert found, f"docs/quickstart.md has no block marked 'test: {name}'"
    return found


def readme_serve_command() -> str:
    text = (ROOT / "README.md").read_text()
    return next(line for line in text.splitlines() if line.endswith("tierstore serve"))


class Site:
    """The working directory a newcomer would be in, and the blocks' environment."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "clone"
        self.dir.mkdir()
        (self.dir / ".venv").symlink_to(Path(sys.prefix))
        (self.dir / "examples").symlink_to(ROOT / "examples")
        self.port, self.admin_port = free_ports(2)
        self.env = clean_env(
            root,
            PIP_DISABLE_PIP_VERSION_CHECK="1",
            TIERSTORE_PORT=str(self.port),
            TIERSTORE_ADMIN_PORT=str(self.admin_port),
        )

    def serve(self, command: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.dir.parent / "gateway.log", "ab")
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=self.dir, env=env or self.env,
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        wait_http(f"http://127.0.0.1:{self.admin_port}/health", proc=proc)
        return proc

    def run(self, script: str) -> str:
        done = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + script], cwd=self.dir, env=self.env,
            capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def log(self) -> str:
        return (self.dir.parent / "gateway.log").read_text(errors="replace")


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    yield Site(tmp_path)


def test_the_serve_command_is_the_readmes() -> None:
    (serve,) = blocks("serve")
    assert serve.strip() == readme_serve_command().strip()


def test_embedded_defaults_first_epoch_then_evict_warm_and_a_hot_epoch(site: Site) -> None:
    (serve,) = blocks("serve")
    first, second = blocks("client")
    # The install is the README's, which the test command has already run.
    proc = site.serve(serve.strip().rsplit(" && ", 1)[1])
    try:
        out = site.run(first)
        assert "OK: webdataset verified 512 samples" in out, out
        assert (site.dir / "tierstore-data" / "credentials.toml").exists()
        out = site.run(first.splitlines()[0] + "\n" + second)  # the same shell: env evaluated
    finally:
        stop_process(proc)
    assert proc.returncode == 0, site.log()[-3000:]
    assert "OK: webdataset verified 512 samples" in out, out
    hit_ratio = re.search(r"epoch e\w+: \w+, 16/16 objects read, hit ratio ([\d.]+)", out)
    assert hit_ratio and float(hit_ratio[1]) == 1.0, out
    assert "Traceback" not in site.log()


def test_in_front_of_an_s3_store(site: Site, moto_endpoint: str, tmp_path: Path) -> None:
    (capacity,) = blocks("capacity")
    exported = dict(
        item.split("=", 1) for line in EXPORT.findall(capacity) for item in shlex.split(line)
    )
    ours = {
        "TIERSTORE_CAPACITY": "s3://quickstart-capacity/tierstore",
        "TIERSTORE_CAPACITY_ENDPOINT": moto_endpoint,
        "TIERSTORE_CAPACITY_ACCESS_KEY": "testing",
        "TIERSTORE_CAPACITY_SECRET_KEY": "testing",
        "TIERSTORE_DATA_DIR": str(tmp_path / "nvme" / "tierstore"),
        "TIERSTORE_HOT_SIZE": exported["TIERSTORE_HOT_SIZE"],
    }
    assert set(exported) == set(ours), exported
    moto = boto3.client(
        "s3", endpoint_url=moto_endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )
    moto.create_bucket(Bucket="quickstart-capacity")
    site.env.update(ours)
    (command,) = [line for line in capacity.splitlines() if line and not line.startswith("export ")]
    proc = site.serve(command)
    try:
        out = site.run(blocks("client")[0] + ".venv/bin/tierstore flush\n")
    finally:
        stop_process(proc)
    assert "OK: webdataset verified 512 samples" in out, out
    stored = moto.list_objects_v2(Bucket="quickstart-capacity", Prefix="tierstore/")
    assert stored.get("KeyCount", 0) > 0, stored
    assert (tmp_path / "nvme" / "tierstore" / "credentials.toml").exists()
