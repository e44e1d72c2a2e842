"""Several nodes over one capacity directory, in one process: the writer
lease, following, takeover and the seal on an ended term. Rounds are driven
by hand (no timers), so each step is deterministic."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from tests.unit.tiering.test_objects import body
from tiering import _pool
from tiering.capacity import LocalDirStore
from tiering.cluster import TERM_SHIFT, seal_name, term_of
from tiering.errors import NoSuchBucket, NoSuchKey, NotWriter
from tiering.fetch import SEGMENTS
from tiering.inputs import Integrity, NewObject
from tiering.index import Index
from tiering.objects import ObjectService
from tiering.recover import recover
from tiering.settings import TierSettings
from tiering.tiers import ForeignSegments

TTL = 2.0  # the lease's skew is a quarter of it


def node(root: Path, name: str, **settings: object) -> ObjectService:
    tiers = TierSettings(node_id=name, lease_ttl=TTL, follow_interval=3600.0, flush_delay=3600.0, **settings)
    return ObjectService(root / name, tiers, LocalDirStore(root / "capacity"))


async def put(svc: ObjectService, bucket: str, key: str, data: bytes) -> None:
    await svc.put(bucket, key, body(data), NewObject(), Integrity(expected_size=len(data)))


async def get(svc: ObjectService, bucket: str, key: str) -> bytes:
    return await svc.read_all(await svc.head(bucket, key))


async def pause(svc: ObjectService) -> None:
    """The node stops renewing (a long GC pause, a partition) but keeps its state."""
    task = svc.tiers.cluster._task
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    svc.tiers.cluster._task = None


async def wait_out_lease() -> None:
    await asyncio.sleep(TTL + TTL / 4 + 0.2)


def test_one_writer_and_replicas_follow_its_segments(tmp_path: Path) -> None:
    async def go() -> None:
        a, b = node(tmp_path, "a"), node(tmp_path, "b")
        await a.start()
        await b.start()
        try:
            assert (a.tiers.cluster.role, b.tiers.cluster.role) == ("writer", "replica")
            await a.create_bucket("data")
            await put(a, "data", "one", b"1" * 1000)
            await put(a, "data", "two", b"2" * 100_000)
            await a.tiers.flush()
            assert await b.tiers.cluster.follow() == 1
            assert await get(b, "data", "one") == b"1" * 1000
            assert await get(b, "data", "two") == b"2" * 100_000

            # Overwrite, delete and a new bucket reach the replica too.
            await put(a, "data", "one", b"one again")
            await a.delete("data", "two")
            await a.create_bucket("more")
            await a.tiers.flush()
            await b.tiers.cluster.follow()
            assert await get(b, "data", "one") == b"one again"
            with pytest.raises(NoSuchKey):
                await b.head("data", "two")
            assert [x.name for x in await b.list_buckets()] == ["data", "more"]
            await a.delete_bucket("more")
            await a.tiers.flush()
            await b.tiers.cluster.follow()
            with pytest.raises(NoSuchBucket):
                await b.bucket("more")

            # A policy change reaches the replica's settings, cached or not
            # (they are the writer's if it takes over).
            assert b.policies.settings("data").compression is True
            await a.set_policy(replace(await a.bucket("data"), compression=False))
            await a.tiers.flush()
            await b.tiers.cluster.follow()
            assert b.policies.settings("data").compression is False

            # Compaction on the writer moves the live data; the replica follows
            # the new segment and forgets the deleted ones.
            await a.tiers.compact(threshold=1.0)
            await b.tiers.cluster.follow()
            await b.tiers.cluster._prune()
            assert await get(b, "data", "one") == b"one again"
            on_a = {s.name for s in await _pool.run(a.index.segments)}
            on_b = {s.name for s in await _pool.run(b.index.segments)}
            assert on_a == on_b
            status = b.tiers.cluster_status()
            assert status is not None and status.writer == "a" and status.lag_segments == 0

            # The replica refuses writes and names the writer.
            with pytest.raises(NotWriter) as refused:
                await put(b, "data", "three", b"3")
            assert refused.value.detail == {"Writer": "a"}
            with pytest.raises(NotWriter):
                await b.create_bucket("other")
            with pytest.raises(NotWriter):
                await b.delete("data", "one")
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())


def test_takeover_keeps_every_acknowledged_write_and_seals_the_old_term(tmp_path: Path) -> None:
    """The writer stops renewing; after the lease runs out another node takes
    it over with a higher term. A segment the old writer uploads after that
    (its flush was already under way) sorts after the seal and no node
    applies it."""

    async def go() -> None:
        a, b, c = node(tmp_path, "a"), node(tmp_path, "b"), node(tmp_path, "c")
        for svc in (a, b, c):
            await svc.start()
        try:
            await a.create_bucket("data", write_through=True)
            await a.create_bucket("back", write_through=False)
            for i in range(5):
                await put(a, "data", f"k{i}", bytes([i]) * 5000)  # acknowledged after the flush
            await pause(a)
            await put(a, "back", "late", b"late")  # write-back: staged on a, not flushed
            await wait_out_lease()
            assert not a.tiers.cluster.writing
            with pytest.raises(Exception):  # refused: a's lease ran out on its own clock
                await put(a, "data", "refused", b"x")

            await b.tiers.cluster.follow()
            await b.tiers.cluster._take_if_free()
            assert b.tiers.cluster.role == "writer"
            assert b.tiers.cluster.lease.record.term == 2
            for i in range(5):
                assert await get(b, "data", f"k{i}") == bytes([i]) * 5000
            last_of_a = max(s.name for s in await _pool.run(a.index.segments))
            sealed, _ = await b.tiers.capacity.read_versioned(seal_name(1))
            assert sealed.decode() == last_of_a

            # The old writer's upload lands after the seal: valid for nobody.
            a.tiers.flusher._check_writer = lambda: None
            await a.tiers.flusher.flush_round(force=True)
            late = max(s.name for s in await _pool.run(a.index.segments))
            assert term_of(late) == 1 and late > sealed.decode()

            await put(b, "data", "new", b"from b")
            await b.tiers.flush()
            names = [p[len(SEGMENTS):] async for p, _ in b.tiers.capacity.list(SEGMENTS)]
            assert any(term_of(n) == 2 for n in names)
            assert min(n for n in names if term_of(n) == 2) >= f"{2 << TERM_SHIFT:016x}"
            await c.tiers.cluster.follow()
            assert await get(c, "data", "new") == b"from b"
            for i in range(5):
                assert await get(c, "data", f"k{i}") == bytes([i]) * 5000
            with pytest.raises(NoSuchKey):
                await c.head("back", "late")
            with pytest.raises(NotWriter) as refused:
                await put(c, "data", "x", b"x")
            assert refused.value.detail == {"Writer": "b"}

            # A rebuild from the footers leaves the sealed-out segment out too.
            rebuilt = Index(tmp_path / "rebuilt")
            try:
                await recover(LocalDirStore(tmp_path / "capacity"), rebuilt)
                assert rebuilt.get_object("back", "late") is None
                assert rebuilt.get_object("data", "new") is not None
                assert late not in {s.name for s in rebuilt.segments()}
            finally:
                rebuilt.close()
        finally:
            for svc in (a, b, c):
                await svc.close()

    asyncio.run(go())


def test_racing_nodes_one_writer(tmp_path: Path) -> None:
    async def go() -> None:
        nodes = [node(tmp_path, f"n{i}") for i in range(5)]
        await asyncio.gather(*(svc.start() for svc in nodes))
        try:
            roles = sorted(svc.tiers.cluster.role for svc in nodes)
            assert roles == ["replica"] * 4 + ["writer"]
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
            await a.create_bucket("data")
            await put(a, "data", "staged", b"write-back")  # not flushed yet
            await a.close()
            await b.tiers.cluster.follow()
            await b.tiers.cluster._take_if_free()  # no wait: a let it go
            assert b.tiers.cluster.role == "writer"
            assert await get(b, "data", "staged") == b"write-back"
        finally:
            await b.close()

    asyncio.run(go())


def test_a_gateway_without_node_id_refuses_a_shared_store(tmp_path: Path) -> None:
    async def go() -> None:
        a = node(tmp_path, "a")
        await a.start()
        await a.close()
        alone = ObjectService(tmp_path / "alone", TierSettings(flush_delay=3600.0), LocalDirStore(tmp_path / "capacity"))
        with pytest.raises(ForeignSegments, match="--node-id"):
            await alone.start()
        await alone.close()

    asyncio.run(go())


def test_a_single_gateway_restarted_with_a_node_id_becomes_the_writer(tmp_path: Path) -> None:
    """The move from one gateway to several: its history becomes term 0,
    sealed; its unflushed writes are flushed as term 1."""

    async def go() -> None:
        capacity = tmp_path / "capacity"
        alone = ObjectService(tmp_path / "a", TierSettings(flush_delay=3600.0), LocalDirStore(capacity))
        await alone.start()
        await alone.create_bucket("data")
        await put(alone, "data", "flushed", b"in a term-0 segment")
        await alone.tiers.flush()
        await put(alone, "data", "staged", b"not flushed yet")
        await alone.close()
        a, b = node(tmp_path, "a"), node(tmp_path, "b")
        await a.start()
        await b.start()
        try:
            assert a.tiers.cluster.role == "writer" and a.tiers.cluster.lease.record.term == 1
            sealed, _ = await a.tiers.capacity.read_versioned(seal_name(0))
            assert term_of(sealed.decode()) == 0
            await a.tiers.flush()
            await b.tiers.cluster.follow()
            assert await get(b, "data", "flushed") == b"in a term-0 segment"
            assert await get(b, "data", "staged") == b"not flushed yet"
            names = [p[len(SEGMENTS):] async for p, _ in a.tiers.capacity.list(SEGMENTS)]
            assert sorted(term_of(n) for n in names) == [0, 1]
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
            await a.create_bucket("data")
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
                assert c.tiers.cluster.role == "replica"
                assert reads.gets <= 2, reads  # the lease, and no footer: all known from recover
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


def test_a_writer_that_lost_the_lease_can_take_it_back(tmp_path: Path) -> None:
    async def go() -> None:
        a, b = node(tmp_path, "a"), node(tmp_path, "b")
        await a.start()
        await b.start()
        try:
            await a.create_bucket("data", write_through=True)
            await a.tiers.flush()
            running = list(a.tiers._tasks)
            await pause(a)
            await wait_out_lease()
            await b.tiers.cluster.follow()
            await b.tiers.cluster._take_if_free()
            await put(b, "data", "by-b", b"b")
            await pause(b)
            await wait_out_lease()
            await a.tiers.cluster.follow()
            await a.tiers.cluster._take_if_free()
            assert a.tiers.cluster.role == "writer" and a.tiers.cluster.lease.record.term == 3
            assert a.tiers._tasks == running  # the same flusher and compactor, not a second pair
            await put(a, "data", "by-a", b"a")  # write-through: flushed under term 3
            assert await get(a, "data", "by-b") == b"b"
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())
