"""A large object read whole and by ranges through boto3, cold (its extents
streamed from moto as they arrive) and hot (its cache files sent with
sendfile), byte for byte; and a store that corrupts bodies never gets a
wrong answer through: a cold GET either fails or returns the object."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from tests.conftest import assert_consistent, make_client
from tests.faults import FaultProxy, Rates, get_object
from tests.integration.helpers import gateway_over_moto, wait_until
from tests.servers import Gateway

MiB = 1024 * 1024
SIZE = 5 * 8 * MiB + 12345  # five extents of 8 MiB and a short sixth


@pytest.fixture(scope="module")
def gw(proxy: FaultProxy, moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway over moto (through a proxy that injects nothing unless told)."""
    with gateway_over_moto(tmp_path_factory.mktemp("large-reads") / "data", moto_endpoint, proxy.endpoint,
                           f"large-reads-{os.getpid()}", "--flush-delay", "600") as gw:
        yield gw
    assert_consistent(gw)


@pytest.fixture(scope="module")
def stored(gw: Gateway) -> bytes:
    """The object, flushed into the store (random bytes: stored as they are)."""
    data = os.urandom(SIZE)
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="large")
    s3.put_object(Bucket="large", Key="object", Body=data)
    gw.flush()
    return data


RANGES = [(0, 99), (100, 8 * MiB + 99), (8 * MiB - 1, 8 * MiB), (3 * MiB, 29 * MiB), (SIZE - 100, SIZE - 1)]


def test_a_large_object_reads_back_cold_and_hot(gw: Gateway, stored: bytes, proxy: FaultProxy) -> None:
    s3 = make_client(gw.endpoint)
    gw.evict()
    gets = proxy.forwarded
    cold = s3.get_object(Bucket="large", Key="object")
    assert cold["ContentLength"] == SIZE
    assert cold["Body"].read() == stored
    assert proxy.forwarded - gets == 6, "one store GET per extent"
    # The fills run behind the answer: the last extent's may still be being
    # written when the client has read its last byte.
    wait_until(lambda: gw.admin("GET", "/tiers").json()["hot_cached"] >= SIZE, "the answer filled the hot tier")
    gets = proxy.forwarded
    assert s3.get_object(Bucket="large", Key="object")["Body"].read() == stored
    assert proxy.forwarded == gets, "hot: nothing from the store"
    for first, last in RANGES:
        got = s3.get_object(Bucket="large", Key="object", Range=f"bytes={first}-{last}")
        assert got["ContentRange"] == f"bytes {first}-{last}/{SIZE}"
        assert got["Body"].read() == stored[first : last + 1], (first, last)


def test_cold_ranges_read_back_exactly(gw: Gateway, stored: bytes) -> None:
    s3 = make_client(gw.endpoint)
    for first, last in RANGES:
        gw.evict()
        got = s3.get_object(Bucket="large", Key="object", Range=f"bytes={first}-{last}")
        assert got["Body"].read() == stored[first : last + 1], (first, last)


def test_conditions_are_answered_before_any_byte(gw: Gateway, stored: bytes) -> None:
    s3 = make_client(gw.endpoint)
    gw.evict()
    etag = s3.head_object(Bucket="large", Key="object")["ETag"]
    with pytest.raises(ClientError) as failed:
        s3.get_object(Bucket="large", Key="object", IfNoneMatch=etag)
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    with pytest.raises(ClientError, match="PreconditionFailed"):
        s3.get_object(Bucket="large", Key="object", IfMatch='"0123"')
    assert s3.get_object(Bucket="large", Key="object", IfMatch=etag)["Body"].read() == stored


@pytest.mark.parametrize("streak", [None, 1], ids=["always", "once"])
def test_a_store_that_corrupts_bodies_never_gets_a_wrong_answer_through(
    gw: Gateway, stored: bytes, proxy: FaultProxy, streak: int | None,
) -> None:
    """Every store GET's body has bytes flipped (``always``), or each GET's
    first try (``once``: a refetch is intact). The answer is the object, or
    an error (an S3 error before the body, or a body cut short): never a
    complete answer with a wrong byte in it."""
    s3 = make_client(gw.endpoint)
    gw.evict()
    proxy.rates = Rates(flip=1.0, max_streak=streak, only=get_object)
    try:
        try:
            got = s3.get_object(Bucket="large", Key="object")["Body"].read()
        except (ClientError, BotoCoreError) as exc:  # refused, or cut short mid-body
            failed: Exception | None = exc
        else:
            failed = None
            assert got == stored, "a complete answer must be the object"
        _settled(proxy)  # the fetches ahead of the answer finish (and fail) under the same faults
    finally:
        proxy.rates = Rates()
    if streak is None:
        assert failed is not None, "bytes corrupt every time cannot be served"
    assert proxy.injected["flip"] > 0
    assert s3.get_object(Bucket="large", Key="object")["Body"].read() == stored  # the store is fine again


def _settled(proxy: FaultProxy, quiet: float = 0.5) -> None:
    """Until the store has had no request for ``quiet`` seconds."""
    seen, since = proxy.forwarded, time.monotonic()
    while time.monotonic() - since < quiet:
        time.sleep(0.05)
        if proxy.forwarded != seen:
            seen, since = proxy.forwarded, time.monotonic()
