"""The follow head (tiering/cluster/head.py) and when a node follows
(tiering/cluster/news.py): a writer updates one small object per flush;
followers read it conditionally and run a round only when it changed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.unit.tiering.cluster_nodes import get, node, put
from tiering.capacity import LocalDirStore
from tiering.cluster.head import NAME, Change, Entry, Head
from tiering.cluster.news import Publisher


def test_a_head_read_again_unchanged_costs_no_body_and_changes_merge(tmp_path: Path) -> None:
    async def go() -> None:
        store = LocalDirStore(tmp_path)
        mine, theirs = Head(store), Head(store)
        assert await mine.look() is False  # nobody published yet
        await mine.publish({"a": Change(1, "0000010000000001")})
        read = store.stats.bytes_read
        assert await mine.look() is False and store.stats.bytes_read == read  # our own write: a 304
        # Another writer's update lands on what is there (it never read it).
        await theirs.publish({"b": Change(2, deleted=3)})
        assert await mine.look() is True and mine.version == 1
        assert mine.entries == {"a": Entry(1, "0000010000000001", 0), "b": Entry(2, "", 3)}
        assert await mine.look() is False and mine.version == 1
        # Both update at once: compare-and-swap, one retries, neither change is lost.
        await asyncio.gather(mine.publish({"a": Change(1, "0000010000000002")}),
                             theirs.publish({"b": Change(2, "0000020000000001", deleted=1)}))
        await mine.look()
        assert mine.entries == {"a": Entry(1, "0000010000000002", 0), "b": Entry(2, "0000020000000001", 4)}
        assert mine.deletions(skip={"a"}) == {"b": 4} and mine.deletions(skip={"b"}) == {}

    asyncio.run(go())


def test_changes_merge_by_term() -> None:
    first = Change(3, "0000030000000004", deleted=1)
    assert first.merged(Change(3, "0000030000000002", deleted=2)) == Change(3, "0000030000000004", 3)
    assert first.merged(Change(4)) == Change(4, None, 1)  # taken again: the new term, every deletion
    assert Change(3).applied(Entry(3, "0000030000000009", 5)) == Entry(3, "0000030000000009", 5)
    assert Change(4).applied(Entry(3, "0000030000000009", 5)) == Entry(4, "", 5)


def test_reports_of_one_flush_make_one_update_and_one_notice(tmp_path: Path) -> None:
    async def go() -> None:
        store = LocalDirStore(tmp_path)
        head = Head(store)
        publisher = Publisher(head)
        told: list[int] = []
        publisher.tell(lambda: told.append(head.updates))
        for sequence in range(1, 6):
            publisher.add("a", Change(1, f"{1 << 40 | sequence:016x}"))
        publisher.add("a", Change(1, deleted=2))
        await publisher.close()  # publishes what is pending
        assert (head.updates, told, store.stats.puts) == (1, [1], 1)
        data, _ = await store.read_versioned(NAME)
        assert head.entries == {"a": Entry(1, f"{1 << 40 | 5:016x}", 2)}, data

    asyncio.run(go())


def test_an_idle_follower_only_reads_the_head_and_follows_when_it_changes(tmp_path: Path) -> None:
    async def go() -> None:
        a = node(tmp_path, "a")
        b = node(tmp_path, "b")
        await a.start()
        await b.start()
        try:
            cluster = b.tiers.cluster
            await a.objects.create_bucket("data")
            await put(a, "data", "k", b"first")
            await a.tiers.flush()
            await a.tiers.cluster.publisher.close()  # the flush's update, now
            stats = b.tiers.capacity.stats
            gets, lists, rounds = stats.gets, stats.lists, cluster.status().follow_rounds
            await cluster.follow_news()  # not due: the fallback has not come
            assert (stats.gets, stats.lists) == (gets, lists)
            cluster.watch.fallback = 0.0  # every call is a fallback read from here
            await cluster.follow_news()  # the head changed: a round
            assert cluster.status().follow_rounds == rounds + 1
            assert await get(b, "data", "k") == b"first"
            gets, lists = stats.gets, stats.lists
            for _ in range(5):
                await cluster.follow_news()  # unchanged: a 304 each, no round, no listing
            assert (stats.gets - gets, stats.lists - lists) == (5, 0)
            assert cluster.status().follow_rounds == rounds + 1
            cluster.watch.nudge()  # a notice: a round whatever the head says
            await cluster.follow_news()
            assert cluster.status().follow_rounds == rounds + 2 and cluster.status().pushes == 1
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())


def test_the_head_names_the_identities_version_and_a_change_of_it_makes_no_round(tmp_path: Path) -> None:
    async def go() -> None:
        store = LocalDirStore(tmp_path)
        writer, follower = Head(store), Head(store)
        heard: list[str | None] = []
        follower.heard(lambda: heard.append(follower.identity))
        await writer.publish({"a": Change(1, "0000010000000001")})
        assert await follower.look() is True and (follower.version, heard) == (1, [])
        # Another node changed the identities document: its publisher names the new tag,
        # with no notice of segments (the document's change sends its own).
        publisher = Publisher(Head(store))
        told: list[int] = []
        publisher.tell(lambda: told.append(1))
        publisher.identity("tag-1")
        await publisher.close()
        assert told == []
        assert await follower.look() is True
        assert (follower.version, heard) == (1, ["tag-1"])  # read the document; no follow round
        assert follower.entries == {"a": Entry(1, "0000010000000001", 0)}  # the buckets' entries kept
        # A writer's later update keeps the tag; a follower hears nothing new of it.
        await writer.publish({"a": Change(1, "0000010000000002")})
        assert await follower.look() is True and (follower.version, heard) == (2, ["tag-1"])
        assert writer.identity == "tag-1"

    asyncio.run(go())
