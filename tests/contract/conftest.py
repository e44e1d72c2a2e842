"""One CapacityStore suite, every backend: a local directory, and S3 on
moto and on ``rclone serve s3`` (two servers, each with its own answers).

``capacity`` is a started store, parametrized over the backends; each test
gets an empty one (a fresh tmp dir, or a fresh bucket and a random prefix).
After the test the store is closed and checked: no temp files left in the
directory, no multipart upload left open in the bucket.
"""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tiering.capacity import TMP_PREFIX, CapacityStore, LocalDirStore
from tiering.capacity.s3 import MIN_PART_SIZE, S3Store

KEY = SECRET = "testing"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module", autouse=True)
def _no_garbage_from_earlier_modules() -> None:
    """Collect the garbage earlier test modules of this worker left, before
    this module's tests run an event loop on this thread.

    An s3fs filesystem freed by the cyclic collector runs s3fs's finalizer,
    which, finding an event loop running on the thread, schedules the
    close of its aiobotocore client there: on a loop that is not the one
    its connections belong to. The task fails ("attached to a different
    loop"), and anyio's test runner reports that as an error of whichever
    test was running (it happened once in CI, at the setup of a
    test_lease test). Collected here, with no loop running, the finalizer
    closes the client on s3fs's own loop."""
    gc.collect()


@pytest.fixture(scope="session")
def moto_s3(moto_endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )


@pytest.fixture
def s3_bucket(moto_s3: Any) -> Iterator[str]:
    """A new bucket; checked at the end for multipart uploads left open."""
    name = f"cap-{uuid.uuid4().hex[:20]}"
    moto_s3.create_bucket(Bucket=name)
    yield name
    left = moto_s3.list_multipart_uploads(Bucket=name).get("Uploads", [])
    assert not left, f"multipart uploads left open: {[u['Key'] for u in left]}"


@pytest.fixture
def make_s3(moto_endpoint: str, s3_bucket: str) -> Callable[..., S3Store]:
    """Build (not start) an S3Store on the test's bucket under a random prefix.

    Small parts and a millisecond backoff keep the suite fast; keyword
    arguments override any option."""
    prefix = f"run-{uuid.uuid4().hex[:8]}/cap"

    def make(**options: Any) -> S3Store:
        settings: dict[str, Any] = {
            "endpoint": moto_endpoint,
            "access_key": KEY,
            "secret_key": SECRET,
            "part_size": MIN_PART_SIZE,
            "backoff_base": 0.001,
            "backoff_cap": 0.005,
        }
        settings.update(options)
        bucket = settings.pop("bucket", s3_bucket)
        return S3Store(bucket, settings.pop("prefix", prefix), **settings)

    return make


@pytest.fixture
async def s3store(make_s3: Callable[..., S3Store], anyio_backend: str) -> Any:
    """A started S3Store on moto, closed after the test."""
    store = make_s3()
    await store.start()
    yield store
    await store.close()


def temp_files(root: Path) -> list[str]:
    return [
        os.path.join(dirpath, f)
        for dirpath, _, files in os.walk(root)
        for f in files
        if f.startswith(TMP_PREFIX)
    ]


@pytest.fixture(params=["local", "s3", "rclone"])
def unstarted_capacity(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CapacityStore]:
    yield from capacity_of(request.param, request, tmp_path)


def capacity_of(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CapacityStore]:
    """The store ``kind`` names (local, s3, rclone), not started; checked after the test."""
    if kind == "local":
        root = tmp_path / "capacity"
        yield LocalDirStore(root)
        assert not temp_files(root), "temp files left behind"
    elif kind == "s3":
        yield request.getfixturevalue("make_s3")()
    else:  # another S3 server than moto, with its own answers
        endpoint = request.getfixturevalue("rclone_endpoint")
        bucket = f"cap-{uuid.uuid4().hex[:20]}"
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                              region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        yield S3Store(bucket, "cap", endpoint=endpoint, access_key=KEY, secret_key=SECRET,
                      part_size=MIN_PART_SIZE, backoff_base=0.001, backoff_cap=0.005)


@pytest.fixture
async def capacity(
    unstarted_capacity: CapacityStore, anyio_backend: str
) -> AsyncIterator[CapacityStore]:
    store = unstarted_capacity
    await store.start()
    try:
        yield store
    finally:
        await store.close()
