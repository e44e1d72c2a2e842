"""moto's S3 server as the benchmarks' capacity store: started patched (its
ranged GETs read only the range), with a client for it, the gateway flags
that point at it, and the delay proxy in front of it.

Every server started here binds 127.0.0.1 on a free port and is stopped by
the handle that started it (its PID for subprocesses).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import boto3
from _common import REGION  # first: puts the repo root on sys.path
from botocore.config import Config as BotoConfig
from delay_proxy import DelayProxy

from tests.servers import free_port, stop_process, wait_http

CAPACITY_BUCKET = "bench"  # in moto: the gateway's segments
MOTO_KEY = "testing"  # moto accepts any credentials
HERE = Path(__file__).resolve().parent


# -- moto, with ranged GETs that read only the range -----------------------------


def serve_moto(port: int) -> None:
    """Run moto's S3 server on 127.0.0.1:``port`` (in this process, until
    killed), its ranged GETs reading only the range.

    moto 5 answers ``GET`` with ``Range`` by building the whole body
    (``FakeKey.value`` reads the object's spooled buffer end to end) and
    slicing it afterwards, in ``S3Response._handle_range_header``. Here, for
    the duration of a ranged GET, ``value`` is a view whose slices read just
    their bytes from the same buffer under the key's lock. Whatever else the
    response turns out to be (no range applied) gets the full bytes."""
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response
    from moto.server import main as moto_main

    ranged = threading.local()
    full_value = FakeKey.value

    class RangedValue:
        def __init__(self, key: FakeKey) -> None:
            self.key = key

        def __len__(self) -> int:
            return self.key.contentsize

        def __getitem__(self, item: slice) -> bytes:
            start, stop, _ = item.indices(len(self))
            with self.key.lock:
                self.key._value_buffer.seek(start)
                return self.key._value_buffer.read(max(0, stop - start))

    def value(key: FakeKey) -> bytes | RangedValue:
        return RangedValue(key) if getattr(ranged, "on", False) else full_value.fget(key)

    original = S3Response.key_response

    def key_response(self, request, full_url, headers):  # type: ignore[no-untyped-def]
        ranged.on = request.method == "GET" and bool(request.headers.get("range"))
        try:
            status, response_headers, body = original(self, request, full_url, headers)
        finally:
            ranged.on = False
        if isinstance(body, RangedValue):
            body = body[:]
        return status, response_headers, body

    FakeKey.value = property(value, full_value.fset)
    S3Response.key_response = key_response
    moto_main(["-H", "127.0.0.1", "-p", str(port)])


@contextlib.contextmanager
def moto_store() -> Iterator[tuple[int, int]]:
    """(port, pid) of a moto S3 server subprocess holding an empty
    ``CAPACITY_BUCKET``."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import _moto; _moto.serve_moto({port})"],
        cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/moto-api/", timeout=60, proc=proc)
        moto_client(f"http://127.0.0.1:{port}").create_bucket(Bucket=CAPACITY_BUCKET)
        yield port, proc.pid
    finally:
        stop_process(proc, timeout=15)


def moto_client(endpoint: str):  # type: ignore[no-untyped-def]
    """A plain boto3 client for moto (or the proxy in front of it)."""
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=REGION,
        aws_access_key_id=MOTO_KEY, aws_secret_access_key=MOTO_KEY,
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def s3_capacity_args(endpoint: str) -> list[str]:
    """Gateway flags for a capacity store in moto, reached at ``endpoint``."""
    return ["--capacity", f"s3://{CAPACITY_BUCKET}", "--capacity-endpoint", endpoint,
            "--capacity-access-key", MOTO_KEY, "--capacity-secret-key", MOTO_KEY]


# -- moto behind the delay proxy ---------------------------------------------------


@dataclass(frozen=True)
class DelayedMoto:
    """moto's S3 server and the delay proxy in front of it."""

    endpoint: str  # moto itself: set-up traffic, without the delay
    pid: int
    proxy: DelayProxy  # proxy.endpoint: the capacity store, and reads that pay the delay


@contextlib.contextmanager
def delayed_moto(latency_ms: float, buckets: Sequence[str] = ()) -> Iterator[DelayedMoto]:
    """moto (``moto_store``: ranged GETs read only the range, the
    capacity bucket made) behind a ``delay_proxy.DelayProxy`` that adds
    ``latency_ms`` to every request, half each way; ``buckets`` made in it too."""
    with moto_store() as (port, pid), DelayProxy(port) as proxy:
        endpoint = f"http://127.0.0.1:{port}"
        for bucket in buckets:
            moto_client(endpoint).create_bucket(Bucket=bucket)
        proxy.delay_s = latency_ms / 2000
        yield DelayedMoto(endpoint, pid, proxy)
