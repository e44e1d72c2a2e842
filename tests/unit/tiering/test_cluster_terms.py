"""Cluster terms over one capacity directory, in one process: a writer that
lost its lease takes it back, followers and the seal of an ended term, an
idle lease given up, and the writes of an ended term that come late."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.tiering.cluster_nodes import (
    TTL,
    get,
    pause,
    put,
    running,
    seal,
    segment_names,
    term,
    wait_out_lease,
)
from tiering.capacity import LocalDirStore
from tiering.capacity.layout import SEGMENTS
from tiering.cluster.catchup import catch_up
from tiering.errors import (
    InsufficientStorage,
    NoSuchBucket,
    NotWriter,
    ServiceUnavailable,
    SlowDown,
)
from tiering.index.keys import term_of
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node
from tiering.settings import TierSettings


def test_a_writer_that_lost_a_lease_can_take_it_back(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path, "a", "b") as (a, b):
            await a.objects.create_bucket("data", write_through=True)
            await a.tiers.flush()
            first = term(a, "data")
            tasks = list(a.tiers._tasks)
            await pause(a)
            await wait_out_lease()
            await b.tiers.cluster.follow()
            await put(b, "data", "by-b", b"b")
            await pause(b)
            await wait_out_lease()
            await a.tiers.cluster.follow()
            await put(a, "data", "by-a", b"a")  # write-through: flushed under a's new term
            assert term(a, "data") > term(b, "data") > first
            assert a.tiers._tasks == tasks  # the same flusher and compactor, not a second pair
            assert await get(a, "data", "by-b") == b"b"

    asyncio.run(go())


def test_a_follower_waits_for_the_seal_of_a_term_whose_lease_moved_on(tmp_path: Path) -> None:
    """Between a takeover's lease write and its seal, a segment of the old
    term might still be an upload that lands after the seal: followers wait."""

    async def go() -> None:
        async with running(tmp_path, "a", "b", "c") as (a, b, c):
            await a.objects.create_bucket("data")
            await put(a, "data", "k", b"by a")
            await a.tiers.flush()
            await pause(a)
            await wait_out_lease()
            await b.tiers.cluster.follow()
            # b takes the lease but stops before its catch-up and seal.
            cluster = b.tiers.cluster
            lease = cluster._lease("data")
            assert await lease.acquire(lambda above: cluster._terms.claim("data", "b", above))
            assert await c.tiers.cluster.follow() == 0
            assert c.tiers.cluster.status().lag_segments > 0
            with pytest.raises(NoSuchBucket):
                await c.objects.bucket("data")
            await catch_up(cluster._earlier, "data", lease.record.term,  # seals a's term
                           cluster._apply, cluster._close_if_done)
            assert await c.tiers.cluster.follow() >= 1
            assert await get(c, "data", "k") == b"by a"
            assert c.tiers.cluster.status().lag_segments == 0

    asyncio.run(go())


def test_a_lagging_follower_closes_a_term_whose_segments_compaction_deleted(tmp_path: Path) -> None:
    """c has applied only the first segment of a's term when b takes the
    bucket over and compacts the rest away, the seal's own segment
    included: c still closes a's term and applies b's."""

    async def go() -> None:
        async with running(tmp_path, "a", "b", "c") as (a, b, c):
            await a.objects.create_bucket("data")
            await put(a, "data", "k0", b"zero")
            await a.tiers.flush()
            await c.tiers.cluster.follow()  # c stops following here
            for key in ("k1", "k2"):
                await put(a, "data", key, b"old " + key.encode())
                await a.tiers.flush()
            old_term = term(a, "data")
            await pause(a)
            await wait_out_lease()
            await b.tiers.cluster.follow()
            for key in ("k1", "k2"):
                await put(b, "data", key, b"new " + key.encode())  # a's later segments all dead
            await b.tiers.flush()
            sealed_at = await seal(b, old_term)
            await b.tiers.compact(threshold=1.0)
            assert sealed_at not in await segment_names(b)  # deleted: c can never apply up to it
            for _ in range(2):  # the first round reads the seal, the next closes the term
                await c.tiers.cluster.follow()
            assert c.tiers.cluster.status().lag_segments == 0
            for key in ("k1", "k2"):
                assert await get(c, "data", key) == b"new " + key.encode()
            assert await get(c, "data", "k0") == b"zero"

    asyncio.run(go())


def test_an_idle_lease_is_given_up_so_another_node_takes_the_bucket_at_once(tmp_path: Path) -> None:
    """With lease_idle, a writer gives a bucket's lease up once nothing was
    written to it for that long, but not while a write is under way, its
    writes are unflushed or a multipart upload is open."""

    async def go() -> None:
        async with running(tmp_path, "a", "b", lease_idle=1.0) as (a, b):
            idle = 1.0 + TTL / 6 + 0.3  # the idle time and one renewal tick
            await a.objects.create_bucket("data")
            await put(a, "data", "queued", b"flushed first")
            gate = asyncio.Event()

            async def slow() -> AsyncIterator[bytes]:
                yield b"first half, "
                await gate.wait()
                yield b"second half"

            writing = asyncio.create_task(  # under way before the bucket could be idle, however long the flush
                a.objects.put("data", "slow", slow(), NewObject(), Integrity(expected_size=23)))
            await a.tiers.flush()
            await asyncio.sleep(idle)
            assert a.tiers.cluster.status().writing == ["data"]  # a write under way
            gate.set()
            await writing
            await asyncio.sleep(idle)
            assert a.tiers.cluster.status().writing == ["data"]  # its data not flushed
            upload = await a.objects.create_upload("data", "parts", NewObject())
            await a.tiers.flush()
            await asyncio.sleep(idle)
            assert a.tiers.cluster.status().writing == ["data"]  # the open upload
            await a.objects.abort_upload("data", "parts", upload.upload_id)
            await asyncio.sleep(idle)
            assert a.tiers.cluster.status().writing == []  # given up

            await b.tiers.cluster.follow()
            await put(b, "data", "by-b", b"no wait for the TTL")
            assert b.tiers.cluster.status().writing == ["data"]
            assert await get(b, "data", "slow") == b"first half, second half"
            assert await get(b, "data", "queued") == b"flushed first"
            with pytest.raises(NotWriter):
                await put(a, "data", "back", b"b holds it now")

    asyncio.run(go())


def test_a_segment_of_an_ended_term_never_counts_though_the_node_took_the_bucket_again(tmp_path: Path) -> None:
    """The writer's lease lapses while it uploads a segment, and it takes
    the bucket again (a new term, the old one sealed) before the upload
    lands: the segment is sealed out, so its writes are not acknowledged
    and are flushed again in the new term."""

    async def go() -> None:
        async with running(tmp_path, "a", "b") as (a, b):
            await a.objects.create_bucket("data", write_through=True)
            old_term = term(a, "data")
            real_put = a.tiers.capacity.put
            late: list[str] = []

            async def slow_put(path: str, data: bytes | memoryview) -> None:
                if not late:
                    late.append(path[len(SEGMENTS):])
                    await pause(a)
                    await wait_out_lease()
                    await a.tiers.cluster.check_write("data")  # a new term; the old one sealed
                    a.tiers.cluster._task = asyncio.create_task(a.tiers.cluster._run())
                await real_put(path, data)

            a.tiers.capacity.put = slow_put  # type: ignore[method-assign]
            with pytest.raises(ServiceUnavailable):
                await put(a, "data", "k", b"written once, flushed twice")
            assert term(a, "data") > old_term and term_of(late[0]) == old_term
            assert await seal(a, old_term) < late[0]  # sealed out: no node counts it
            await a.tiers.flush()
            assert await a.tiers.cluster.follow() == 0
            await b.tiers.cluster.follow()
            assert await get(b, "data", "k") == b"written once, flushed twice"
            meta = await b.objects.head("data", "k")
            assert all(term_of(c.extent.segment) == term(a, "data") for c in meta.chunks if c.extent)

    asyncio.run(go())



def test_a_full_disk_during_a_follow_round_is_counted_and_the_rounds_go_on(tmp_path: Path) -> None:
    """A round whose index write is refused for lack of room (SlowDown, or
    InsufficientStorage) is an error of that round, as a store's failure
    is: the background task keeps running and follows once there is room."""

    async def go() -> None:
        settings = {"lease_ttl": TTL, "flush_delay": 3600.0}
        a = Node(tmp_path / "a", TierSettings(node_id="a", follow_interval=3600.0, **settings),
                 LocalDirStore(tmp_path / "capacity"))
        b = Node(tmp_path / "b", TierSettings(node_id="b", follow_interval=0.05, follow_fallback=0.05, **settings),
                 LocalDirStore(tmp_path / "capacity"))
        await a.start()
        await b.start()
        try:
            await a.objects.create_bucket("data", write_through=True)
            cluster = b.tiers.cluster
            real_follow = cluster.follow
            refusals = [SlowDown("no room", cause="disk"), InsufficientStorage("no room", cause="floor")]

            async def full() -> int:
                if refusals:
                    raise refusals.pop(0)
                return await real_follow()

            cluster.follow = full  # type: ignore[method-assign]
            await put(a, "data", "k", b"followed once there is room")
            await a.tiers.flush()
            for _ in range(400):
                status = cluster.status()
                if not refusals and status.errors >= 2 and status.last_error is None:
                    break
                await asyncio.sleep(0.05)
            status = cluster.status()
            assert status.errors >= 2 and status.last_error is None, status
            for _ in range(400):
                if "k" in [m.key for m in (await b.objects.list("data", "", "", "", 10)).contents]:
                    break
                await asyncio.sleep(0.05)
            assert await get(b, "data", "k") == b"followed once there is room"
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())


def test_writes_a_lost_writer_flushes_late_never_overwrite_the_next_writers(tmp_path: Path) -> None:
    """a acknowledges writes (write-back, unflushed) and stops renewing; b
    takes the bucket over and overwrites one key; a takes the bucket back
    and flushes: its other key survives, b's newer version of the first
    stays, on a and on a node that follows afterwards, though a's sequence
    counter ran far ahead of b's."""

    async def go() -> None:
        async with running(tmp_path, "a", "b") as (a, b):
            await a.objects.create_bucket("data")
            await a.tiers.flush()
            await b.tiers.cluster.follow()
            for n in range(50):  # a's counter runs ahead of anything b has seen
                await put(a, "data", "k", b"a %d" % n)
            await put(a, "data", "only-a", b"by a")
            await pause(a)
            await wait_out_lease()
            await put(b, "data", "k", b"by b")  # takes the bucket over
            await b.tiers.flush()
            await pause(b)
            await wait_out_lease()
            await put(a, "data", "again", b"a again")  # takes it back: catch-up, then its queue
            await a.tiers.flush()
            async with running(tmp_path, "c") as (c,):  # follows the store from scratch
                for svc in (a, c):
                    assert await get(svc, "data", "k") == b"by b"
                    assert await get(svc, "data", "only-a") == b"by a"
                    assert await get(svc, "data", "again") == b"a again"

    asyncio.run(go())
