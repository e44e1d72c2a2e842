"""Several nodes over one capacity directory, in one process: a write lease
per bucket, following, takeover and the seal on an ended term. Rounds are
driven by hand (no timers), so each step is deterministic. Lost leases,
ended terms and late flushes: ``test_cluster_terms.py``."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from tests.unit.tiering.cluster_nodes import (
    get,
    node,
    pause,
    put,
    running,
    seal,
    segment_names,
    term,
    wait_out_lease,
)
from tiering import pool
from tiering.capacity import LocalDirStore
from tiering.errors import (
    NoSuchBucket,
    NoSuchKey,
    NotWriter,
)
from tiering.index.db import Index
from tiering.index.keys import TERM_SHIFT, term_of
from tiering.maintenance.recover import recover
from tiering.maintenance.tiers import ForeignSegments
from tiering.node import Node
from tiering.settings import TierSettings


def test_two_writers_of_two_buckets_follow_each_other(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path, "a", "b") as (a, b):
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
        async with running(tmp_path, "a", "b") as (a, b):
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
