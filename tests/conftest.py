"""Fixtures shared by the integration and contract tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config as BotoConfig

from tests import summary
from tests.servers import ACCESS_KEY, SECRET_KEY, Gateway, free_port
from tiering import fsck


@contextlib.contextmanager
def running_gateway(data_dir: Path, *args: str) -> Iterator[Gateway]:
    """A gateway on ``data_dir`` with extra ``serve`` flags, stopped
    afterwards, its data directory then checked."""
    gw = Gateway(data_dir, extra_args=list(args)).start()
    try:
        yield gw
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


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # type: ignore[no-untyped-def]
    """xdist: a worker ended; keep the summary lines its modules reported."""
    summary.collect(node.config, getattr(node, "workeroutput", {}))


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    for line in summary.lines(config):
        terminalreporter.write_line(line)
