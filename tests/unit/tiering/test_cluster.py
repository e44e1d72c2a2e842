"""Several nodes over one capacity directory, in one process: a write lease
per bucket, following, takeover and the seal on an ended term. Rounds are
driven by hand (no timers), so each step is deterministic."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.unit.tiering.test_objects import body
from tiering import pool
from tiering.capacity import LocalDirStore
from tiering.capacity.layout import SEGMENTS
from tiering.cluster.catchup import catch_up
from tiering.cluster.terms import SEALS
from tiering.errors import (
    InsufficientStorage,
    NoSuchBucket,
    NoSuchKey,
    NotWriter,
    ServiceUnavailable,
    SlowDown,
)
from tiering.index.db import Index
from tiering.index.keys import TERM_SHIFT, term_of
from tiering.maintenance.recover import recover
from tiering.maintenance.tiers import ForeignSegments
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node
from tiering.settings import TierSettings

TTL = 2.0  # the lease's skew is a quarter of it


def node(root: Path, name: str, **settings: object) -> Node:
    tiers = TierSettings(node_id=name, lease_ttl=TTL, follow_interval=3600.0, follow_fallback=3600.0,
                         flush_delay=3600.0, **settings)
    return Node(root / name, tiers, LocalDirStore(root / "capacity"))


@contextlib.asynccontextmanager
async def running(root: Path, *names: str) -> AsyncIterator[list[Node]]:
    """Nodes started in order, closed at the end."""
    services = [node(root, name) for name in names]
    for svc in services:
        await svc.start()
    try:
        yield services
    finally:
        for svc in services:
            await svc.close()


async def put(svc: Node, bucket: str, key: str, data: bytes) -> None:
    await svc.objects.put(bucket, key, body(data), NewObject(), Integrity(expected_size=len(data)))


async def get(svc: Node, bucket: str, key: str) -> bytes:
    return await svc.objects.read_all(await svc.objects.head(bucket, key))


async def pause(svc: Node) -> None:
    """The node stops renewing (a long GC pause, a partition) but keeps its state."""
    task = svc.tiers.cluster._task
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    svc.tiers.cluster._task = None


async def wait_out_lease() -> None:
    await asyncio.sleep(TTL + TTL / 4 + 0.2)


async def seal(svc: Node, term: int) -> str:
    data, _ = await svc.tiers.capacity.read_versioned(f"{SEALS}{term:08x}")
    return data.decode()


async def segment_names(svc: Node) -> list[str]:
    return [p[len(SEGMENTS):] async for p, _ in svc.tiers.capacity.list(SEGMENTS)]


def term(svc: Node, bucket: str) -> int:
    return svc.tiers.cluster._held[bucket].term



def test_two_writers_of_two_buckets_follow_each_other(tmp_path: Path) -> None:
    async def go() -> None:
        a, b = node(tmp_path, "a"), node(tmp_path, "b")
        await a.start()
        await b.start()
        try:
            assert (a.tiers.cluster.status().role, b.tiers.cluster.status().role) == ("replica", "replica")
            await a.objects.create_bucket("data")  # a takes the lease of "data"
            await b.objects.create_bucket("more")  # and b that of "more", at the same time
            await put(a, "data", "one", b"1" * 1000)
            await put(a, "data", "two", b"2" * 100_000)
            await put(b, "more", "m", b"from b")
            await a.tiers.flush()
            await b.tiers.flush()
            assert await b.tiers.cluster.follow() >= 1
            assert await a.tiers.cluster.follow() >= 1
            assert await get(b, "data", "one") == b"1" * 1000
            assert await get(b, "data", "two") == b"2" * 100_000
            assert await get(a, "more", "m") == b"from b"
            assert [x.name for x in await a.objects.list_buckets()] == ["data", "more"]

            # Each segment holds one bucket, named in its writer's term.
            names = await segment_names(a)
            assert {term_of(n) for n in names} == {term(a, "data"), term(b, "more")}
            assert term(a, "data") != term(b, "more")

            # Overwrite, delete and a bucket's deletion reach the other node.
            await put(a, "data", "one", b"one again")
            await a.objects.delete("data", "two")
            await b.objects.delete("more", "m")
            await b.objects.delete_bucket("more")
            await a.tiers.flush()
            await b.tiers.flush()
            await b.tiers.cluster.follow()
            await a.tiers.cluster.follow()
            assert await get(b, "data", "one") == b"one again"
            with pytest.raises(NoSuchKey):
                await b.objects.head("data", "two")
            with pytest.raises(NoSuchBucket):
                await a.objects.bucket("more")

            # A policy change reaches the other node's settings.
            assert b.policies.settings("data").compression is True
            await a.objects.set_policy(replace(await a.objects.bucket("data"), compression=False))
            await a.tiers.flush()
            await b.tiers.cluster.follow()
            assert b.policies.settings("data").compression is False

            # Compaction by the bucket's writer moves its live data and says
            # so in the follow head; the other node follows the new segment
            # and forgets the deleted ones.
            report = await a.tiers.compact(threshold=1.0)
            await a.tiers.cluster.publisher._task  # the deletions reach the head beside compaction, later
            deleted = report.deleted + report.rewritten + report.merged
            assert a.tiers.cluster._head.entries["data"].deleted == deleted > 0
            lists = b.tiers.capacity.stats.lists
            await b.tiers.cluster.follow_news(now=True)
            assert b.tiers.capacity.stats.lists - lists == 4  # the round's three, and the prune's
            assert await get(b, "data", "one") == b"one again"
            on_a = {s.name for s in await pool.run(a.index.segments)}
            on_b = {s.name for s in await pool.run(b.index.segments)}
            assert on_a == on_b
            # b compacts nothing of a's bucket, a nothing of b's.
            assert all(not b.tiers.writing.compactable(n) for n in on_a if term_of(n) == term(a, "data"))

            status = b.tiers.cluster_status()
            assert status is not None and status.role == "writer" and status.writing == ["more"]
            assert status.writers == {"data": "a", "more": "b"} and status.lag_segments == 0

            # A round costs two LISTs of the term registry and one of the
            # term b writes in: none of a's own, none of the closed term 0.
            lists = a.tiers.capacity.stats.lists
            await a.tiers.cluster.follow()
            assert a.tiers.capacity.stats.lists - lists == 3

            # b refuses writes to a's bucket and names a.
            with pytest.raises(NotWriter) as refused:
                await put(b, "data", "three", b"3")
            assert refused.value.detail == {"Writer": "a"}
            with pytest.raises(NotWriter):
                await b.objects.delete("data", "one")
            with pytest.raises(NotWriter):
                await b.objects.set_policy(await b.objects.bucket("data"))
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())


def test_takeover_keeps_every_acknowledged_write_and_seals_the_old_term(tmp_path: Path) -> None:
    """The writer of a bucket stops renewing; after its lease runs out a write
    through another node takes the bucket over with a new term. A segment the
    old writer uploads after that (its flush was already under way) sorts
    after the seal and no node applies it."""

    async def go() -> None:
        async with running(tmp_path, "a", "b", "c") as (a, b, c):
            await a.objects.create_bucket("data")
            for i in range(5):
                await put(a, "data", f"k{i}", bytes([i]) * 5000)
            await a.tiers.flush()
            old_term = term(a, "data")
            await pause(a)
            await put(a, "data", "late", b"late")  # staged before the lease ran out, flushed after
            await wait_out_lease()
            assert not a.tiers.writing.may_write("data")  # ran out on a's own clock

            await b.tiers.cluster.follow()
            await c.tiers.cluster.follow()
            await put(b, "data", "new", b"from b")  # takes the bucket over
            new_term = term(b, "data")
            assert new_term > old_term
            for i in range(5):
                assert await get(b, "data", f"k{i}") == bytes([i]) * 5000
            last_of_a = max(s.name for s in await pool.run(a.index.segments))
            assert await seal(b, old_term) == last_of_a

            # The old writer's upload lands after the seal: valid for nobody.
            a.tiers.cluster.check = lambda bucket, segment=None: None
            a.tiers.cluster.may_write = lambda bucket: True
            await a.tiers.flusher.flush_round(force=True)
            late = max(s.name for s in await pool.run(a.index.segments))
            assert term_of(late) == old_term and late > last_of_a

            await b.tiers.flush()
            names = await segment_names(b)
            assert min(n for n in names if term_of(n) == new_term) >= f"{new_term << TERM_SHIFT:016x}"
            await c.tiers.cluster.follow()
            assert await get(c, "data", "new") == b"from b"
            for i in range(5):
                assert await get(c, "data", f"k{i}") == bytes([i]) * 5000
            with pytest.raises(NoSuchKey):
                await c.objects.head("data", "late")
            with pytest.raises(NotWriter) as refused:
                await put(c, "data", "x", b"x")
            assert refused.value.detail == {"Writer": "b"}

            # A rebuild from the footers leaves the sealed-out segment out too.
            rebuilt = Index(tmp_path / "rebuilt")
            try:
                await recover(LocalDirStore(tmp_path / "capacity"), rebuilt)
                assert rebuilt.get_object("data", "late") is None
                assert rebuilt.get_object("data", "new") is not None
                assert late not in {s.name for s in rebuilt.segments()}
            finally:
                rebuilt.close()

            # The next takeover of the bucket removes the late upload.
            await pause(b)
            await b.tiers.flush()
            await wait_out_lease()
            await put(c, "data", "by-c", b"c")
            assert late not in await segment_names(c)
            assert await get(c, "data", "new") == b"from b"

    asyncio.run(go())


def test_racing_nodes_one_writer_per_bucket(tmp_path: Path) -> None:
    async def go() -> None:
        nodes = [node(tmp_path, f"n{i}") for i in range(5)]
        await asyncio.gather(*(svc.start() for svc in nodes))
        try:
            outcomes = await asyncio.gather(
                *(svc.objects.create_bucket("shared") for svc in nodes), return_exceptions=True
            )
            won = [svc for svc, out in zip(nodes, outcomes) if not isinstance(out, BaseException)]
            assert len(won) == 1, outcomes
            for out in outcomes:
                assert not isinstance(out, BaseException) or isinstance(out, NotWriter), out
            writers = [svc.tiers.cluster.node for svc in nodes if svc.tiers.writing.may_write("shared")]
            assert writers == [won[0].tiers.cluster.node]
            # A claim that lost the race (a term never written into the
            # lease, newer than the winner's) holds no follower back.
            other = next(svc for svc in nodes if svc is not won[0])
            ghost = await other.tiers.cluster._terms.claim("shared", "ghost", 0)
            assert ghost > term(won[0], "shared")
            await put(won[0], "shared", "k", b"by the winner")
            await won[0].tiers.flush()
            assert await other.tiers.cluster.follow() >= 1
            assert await get(other, "shared", "k") == b"by the winner"
            assert other.tiers.cluster.status().writers == {"shared": won[0].tiers.cluster.node}  # not "ghost"
        finally:
            for svc in nodes:
                await svc.close()

    asyncio.run(go())


def test_clean_stop_releases_the_lease_after_flushing(tmp_path: Path) -> None:
    async def go() -> None:
        a, b = node(tmp_path, "a"), node(tmp_path, "b")
        await a.start()
        await b.start()
        try:
            await a.objects.create_bucket("data")
            await put(a, "data", "staged", b"write-back")  # not flushed yet
            await a.close()
            await b.tiers.cluster.follow()
            await put(b, "data", "by-b", b"b")  # no wait: a let the lease go
            assert b.tiers.writing.may_write("data")
            assert await get(b, "data", "staged") == b"write-back"
        finally:
            await b.close()

    asyncio.run(go())


def test_a_gateway_without_node_id_refuses_a_shared_store(tmp_path: Path) -> None:
    async def go() -> None:
        a = node(tmp_path, "a")
        await a.start()
        await a.objects.create_bucket("data")
        await a.close()
        alone = Node(tmp_path / "alone", TierSettings(flush_delay=3600.0), LocalDirStore(tmp_path / "capacity"))
        with pytest.raises(ForeignSegments, match="--node-id"):
            await alone.start()
        await alone.close()

    asyncio.run(go())


def test_a_single_gateway_restarted_with_a_node_id_writes_its_buckets(tmp_path: Path) -> None:
    """The move from one gateway to several: its history is term 0, sealed
    when the first lease is taken; at start it takes the buckets it has
    unflushed writes of, and flushes them in their new terms."""

    async def go() -> None:
        capacity = tmp_path / "capacity"
        alone = Node(tmp_path / "a", TierSettings(flush_delay=3600.0), LocalDirStore(capacity))
        await alone.start()
        await alone.objects.create_bucket("data")
        await alone.objects.create_bucket("quiet")
        await put(alone, "data", "flushed", b"in a term-0 segment")
        await put(alone, "quiet", "q", b"term 0 too")
        await alone.tiers.flush()
        await put(alone, "data", "staged", b"not flushed yet")
        await alone.close()
        a, b = node(tmp_path, "a"), node(tmp_path, "b")
        await a.start()
        await b.start()
        try:
            assert a.tiers.cluster.status().writing == ["data"]
            assert term_of(await seal(a, 0)) == 0
            await a.tiers.flush()
            await b.tiers.cluster.follow()
            assert await get(b, "data", "flushed") == b"in a term-0 segment"
            assert await get(b, "data", "staged") == b"not flushed yet"
            assert await get(b, "quiet", "q") == b"term 0 too"
            assert sorted({term_of(n) for n in await segment_names(a)}) == [0, term(a, "data")]
            await put(b, "quiet", "q2", b"b writes the other bucket")  # free: b takes it
            assert b.tiers.cluster.status().writing == ["quiet"]
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())


def test_a_node_joins_with_recover_then_follows_from_there(tmp_path: Path) -> None:
    """`tierstore recover` into the new node's data dir, then start it: it
    reads no footer twice and applies only what came after."""

    async def go() -> None:
        a = node(tmp_path, "a")
        await a.start()
        try:
            await a.objects.create_bucket("data")
            for i in range(3):
                await put(a, "data", f"old{i}", b"before the join %d" % i)
                await a.tiers.flush()
            index = Index(tmp_path / "c" / "index")
            try:
                await recover(LocalDirStore(tmp_path / "capacity"), index)
            finally:
                index.close()
            c = node(tmp_path, "c")
            reads = c.tiers.capacity.stats
            await c.start()
            try:
                assert c.tiers.cluster.status().writing == []
                assert reads.gets <= 3, reads  # the follow head, the term's record and term 0's seal: no footer
                await put(a, "data", "new", b"after the join")
                await a.tiers.flush()
                assert await c.tiers.cluster.follow() == 1
                assert await get(c, "data", "new") == b"after the join"
                assert await get(c, "data", "old1") == b"before the join 1"
            finally:
                await c.close()
        finally:
            await a.close()

    asyncio.run(go())


def test_a_writer_that_lost_a_lease_can_take_it_back(tmp_path: Path) -> None:
    async def go() -> None:
        a, b = node(tmp_path, "a"), node(tmp_path, "b")
        await a.start()
        await b.start()
        try:
            await a.objects.create_bucket("data", write_through=True)
            await a.tiers.flush()
            first = term(a, "data")
            running = list(a.tiers._tasks)
            await pause(a)
            await wait_out_lease()
            await b.tiers.cluster.follow()
            await put(b, "data", "by-b", b"b")
            await pause(b)
            await wait_out_lease()
            await a.tiers.cluster.follow()
            await put(a, "data", "by-a", b"a")  # write-through: flushed under a's new term
            assert term(a, "data") > term(b, "data") > first
            assert a.tiers._tasks == running  # the same flusher and compactor, not a second pair
            assert await get(a, "data", "by-b") == b"b"
        finally:
            await a.close()
            await b.close()

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
        a, b = node(tmp_path, "a", lease_idle=1.0), node(tmp_path, "b", lease_idle=1.0)
        await a.start()
        await b.start()
        idle = 1.0 + TTL / 6 + 0.3  # the idle time and one renewal tick
        try:
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
        finally:
            await a.close()
            await b.close()

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
