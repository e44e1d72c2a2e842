"""Conditional writes on every capacity backend, and the write lease built
on them (tiering/cluster/lease.py): one holder, takeover after expiry, release."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.contract.conftest import capacity_of
from tests.faults import FaultProxy, Rates, put
from tiering.capacity import CapacityStore
from tiering.capacity.s3 import S3Store
from tiering.cluster.lease import Lease, LeaseRecord, check_conditional_writes
from tiering.errors import CapacityConflict, CapacityError, CapacityNotFound

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["local", "s3"])
def unstarted_capacity(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CapacityStore]:
    """The stores with conditional writes (rclone serve s3 has none: a
    gateway with a node id refuses it, tested below)."""
    yield from capacity_of(request.param, request, tmp_path)


@pytest.mark.parametrize("kind", ["local", "s3", "rclone"])
async def test_a_store_is_probed_for_conditional_writes(kind: str, request: pytest.FixtureRequest,
                                                        tmp_path: Path) -> None:
    stores = capacity_of(kind, request, tmp_path)
    store = next(stores)
    await store.start()
    try:
        if kind == "rclone":
            with pytest.raises(CapacityError, match="ignores conditional writes"):
                await check_conditional_writes(store, "node-a")
        else:
            await check_conditional_writes(store, "node-a")
            await check_conditional_writes(store, "node-a")  # a restart finds its probe: still fine
    finally:
        await store.close()
        stores.close()


async def test_conditional_writes(capacity: CapacityStore) -> None:
    with pytest.raises(CapacityNotFound):
        await capacity.read_versioned("leases/b")
    tag = await capacity.put_conditional("leases/b", b"one", None)
    assert await capacity.read_versioned("leases/b") == (b"one", tag)
    with pytest.raises(CapacityConflict):
        await capacity.put_conditional("leases/b", b"two", None)  # exists
    with pytest.raises(CapacityConflict):
        await capacity.put_conditional("leases/b", b"two", '"0123"')  # another version
    new = await capacity.put_conditional("leases/b", b"three", tag)
    assert new != tag
    with pytest.raises(CapacityConflict):
        await capacity.put_conditional("leases/b", b"four", tag)  # stale
    assert await capacity.read_versioned("leases/b") == (b"three", new)


async def test_a_conditional_read_of_an_unchanged_object_is_none(capacity: CapacityStore) -> None:
    """If-None-Match: the body comes only when the version tag moved on."""
    with pytest.raises(CapacityNotFound):
        await capacity.read_if_changed("leases/h", '"0123"')
    tag = await capacity.put_conditional("leases/h", b"one", None)
    gets, read = capacity.stats.gets, capacity.stats.bytes_read
    assert await capacity.read_if_changed("leases/h", tag) is None
    assert (capacity.stats.gets - gets, capacity.stats.bytes_read - read) == (1, 0)  # one request, no body
    assert await capacity.read_if_changed("leases/h", '"0123"') == (b"one", tag)
    new = await capacity.put_conditional("leases/h", b"two", tag)
    assert await capacity.read_if_changed("leases/h", tag) == (b"two", new)
    assert await capacity.read_if_changed("leases/h", new) is None


async def test_racing_conditional_creates_one_wins(capacity: CapacityStore) -> None:
    results = await asyncio.gather(
        *(capacity.put_conditional("leases/race", f"node-{i}".encode(), None) for i in range(8)),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, str)]
    assert len(won) == 1
    assert all(isinstance(r, CapacityConflict) for r in results if not isinstance(r, str))


class Clock:
    """Wall and monotonic time that tests move by hand."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def wall(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


def lease(store: CapacityStore, node: str, clock: Clock) -> Lease:
    return Lease(store, "bkt", node, ttl=30, skew=5, wall=clock.wall, monotonic=clock.monotonic)


async def test_one_holder_takeover_after_expiry_and_release(capacity: CapacityStore) -> None:
    clock = Clock()
    a, b = lease(capacity, "node-a", clock), lease(capacity, "node-b", clock)
    assert await a.acquire() and a.held
    assert not await b.acquire() and not b.held and b.holder == "node-a"
    clock.now += 20
    assert await a.renew() and a.held  # expires 30 s from now
    clock.now += 29
    assert not await b.acquire()  # expired 0 s ago... not past the skew
    assert not a.held  # but a no longer counts on it: ttl - skew has passed
    clock.now += 7
    assert await b.acquire() and b.held and b.record.term == 2  # taken over
    assert not await a.renew() and not a.held and a.holder == "node-b"
    await b.release()
    assert not b.held
    assert await a.acquire() and a.record.term == 3  # at once, no wait for the TTL


async def test_racing_nodes_exactly_one_holds(capacity: CapacityStore) -> None:
    clock = Clock()
    nodes = [lease(capacity, f"node-{i}", clock) for i in range(6)]
    held = await asyncio.gather(*(n.acquire() for n in nodes))
    assert sum(held) == 1
    clock.now += 40  # everyone's view: expired
    held = await asyncio.gather(*(n.acquire() for n in nodes))
    assert sum(held) == 1
    assert len({n.holder for n in nodes}) == 1


async def test_a_retried_write_that_had_landed_still_holds(
    make_s3: Callable[..., S3Store], moto_endpoint: str, anyio_backend: str
) -> None:
    """The store applied the conditional PUT but the answer was lost; the
    retry gets 412 from the write itself. The lease reads back its nonce."""
    with FaultProxy(moto_endpoint, Rates(reset_after=1.0, max_streak=1, only=put), seed=3) as proxy:
        store = make_s3(endpoint=proxy.endpoint)
        await store.start()
        try:
            clock = Clock()
            a = lease(store, "node-a", clock)
            assert await a.acquire() and a.held
            assert proxy.injected["reset_after"] >= 1
            data, _ = await store.read_versioned(a.name)
            assert LeaseRecord.decode(data) == a.record
        finally:
            await store.close()
