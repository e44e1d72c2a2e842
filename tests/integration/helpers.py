"""Small helpers shared by the integration tests."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def gateway_over_moto(data_dir: Path, moto_endpoint: str, store_endpoint: str, name: str,
                      *extra: str) -> Iterator[Any]:
    """A gateway on ``data_dir`` whose capacity store is a new moto bucket
    ``name`` reached at ``store_endpoint`` (moto, or a proxy in front of
    it), with ``extra`` serve flags; stopped and checked at the end."""
    import boto3

    from tests.conftest import running_gateway

    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=name)
    with running_gateway(data_dir, "--capacity", f"s3://{name}/tier", "--capacity-endpoint", store_endpoint,
                         "--capacity-access-key", "testing", "--capacity-secret-key", "testing", *extra) as gw:
        yield gw


@contextlib.contextmanager
def peered_nodes(root: Path, names: Sequence[str], moto_endpoint: str, store_endpoint: str,
                 extra: Sequence[str] = ()) -> Iterator[list[Any]]:
    """Gateways ``names`` with ``--node-id`` and ``--peers`` naming them all,
    over a new capacity bucket in moto reached at ``store_endpoint`` (moto
    itself, or a proxy in front of it); stopped by PID at the end."""
    import boto3

    from tests.servers import Gateway, free_ports

    capacity = f"tierstore-peered-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=capacity)
    free = iter(free_ports(2 * len(names)))
    ports = {name: (next(free), next(free)) for name in names}
    peers = ",".join(f"{name}=http://127.0.0.1:{s3}" for name, (s3, _) in ports.items())
    started: list[Gateway] = []
    try:
        for name in names:
            gw = Gateway(root / name, extra_args=[
                "--capacity", f"s3://{capacity}", "--capacity-endpoint", store_endpoint,
                "--capacity-access-key", "testing", "--capacity-secret-key", "testing",
                "--node-id", name, "--peers", peers, *extra,
            ])
            started.append(gw.start(ports[name]))
        yield started
    finally:
        for gw in started:
            gw.stop()


@contextlib.contextmanager
def counting_proxy(moto_endpoint: str) -> Iterator[Any]:
    """A request-counting proxy in front of moto (benchmarks/delay_proxy.py):
    ``operations``, ``paths`` and ``requests_to`` say what went through it."""
    added = str(BENCHMARKS) not in sys.path
    if added:
        sys.path.insert(0, str(BENCHMARKS))
    try:
        from delay_proxy import DelayProxy

        proxy = DelayProxy(int(moto_endpoint.rsplit(":", 1)[1])).start()
    finally:
        if added:
            sys.path.remove(str(BENCHMARKS))
    try:
        yield proxy
    finally:
        proxy.stop()


def sha256_file(path: Path, block: int = 8 * 1024 * 1024) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def random_file(path: Path, size: int, block: int = 8 * 1024 * 1024) -> str:
    """Write ``size`` random bytes to ``path`` in blocks; return their sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            data = os.urandom(min(block, left))
            digest.update(data)
            f.write(data)
            left -= len(data)
    return digest.hexdigest()


def tree_digest(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root``."""
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def wait_until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait for a state the gateway reaches on its own (not a speed check)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)
