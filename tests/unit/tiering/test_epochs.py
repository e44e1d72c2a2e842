"""The epoch scheduler without a network: reader positions, the upcoming
order, epochs queued behind each other, and the eviction it advises, which
on a known sequence makes the same choices as Belady's optimal policy; and
the prefetcher of a real node keeping ahead of sixteen readers of a store a
round trip away."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tiering.capacity import LocalDirStore
from tiering.epoch_order import Entry, Epoch
from tiering.epochs import Epochs
from tiering.eviction import Sieve
from tiering.inputs import Integrity, NewObject
from tiering.meta import Extent
from tiering.node import Node
from tiering.reads import Read
from tiering.settings import TierSettings


class _Hot:
    def __init__(self) -> None:
        self.cached: set[str] = set()
        self.advisor = None

    def is_cached(self, name: str) -> bool:
        return name in self.cached


def _epochs(hot: _Hot | None = None) -> Epochs:
    return Epochs(None, hot or _Hot(), None, None, SimpleNamespace(fetch_concurrency=4), lambda name: None)  # type: ignore[arg-type]


def _epoch(keys: list[str], readers: int = 1, bucket: str = "b", name: str = "e") -> Epoch:
    entries = [Entry(k, size=1, names=(f"file-{k}",), resolved=True) for k in keys]
    return Epoch(id=name, bucket=bucket, entries=entries, readers=readers, lookahead_bytes=1 << 30,
                 lookahead_objects=64, idle_timeout=60)


def run(body):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        return body()
    return asyncio.run(main())


def test_readers_read_interleaved_shares_and_upcoming_follows_each() -> None:
    def body() -> None:
        epochs = _epochs()
        epoch = epochs.adopt(_epoch([f"k{i}" for i in range(10)], readers=2))
        assert list(epoch.upcoming())[:4] == [0, 1, 2, 3]
        for key in ("k0", "k2", "k1"):
            epochs.observe("b", key)
        assert epoch.positions == [2, 1]
        assert list(epoch.upcoming()) == [4, 3, 6, 5, 8, 7, 9]
        epochs.observe("b", "k6")  # reader 0 skipped k4
        assert epoch.positions == [6, 1] and list(epoch.upcoming())[:3] == [8, 3, 5]
        epochs.observe("other", "k3")  # another bucket: not this epoch
        assert epoch.positions == [6, 1]
    run(body)


def test_hits_misses_restarts_and_the_queued_epoch_taking_over() -> None:
    def body() -> None:
        hot = _Hot()
        epochs = _epochs(hot)
        first = epochs.adopt(_epoch([f"k{i}" for i in range(200)], name="first"))
        second = epochs.adopt(_epoch(["k1", "k0"], name="second"))
        assert (first.state, second.state) == ("active", "queued")
        hot.cached.add("file-k0")
        epochs.observe("b", "k0")
        epochs.observe("b", "k1")
        assert (first.hits, first.misses) == (1, 1)
        for i in range(2, 150):
            epochs.observe("b", f"k{i}")
        epochs.observe("b", "k0")  # k0 was read: this stands for nothing of this epoch
        assert first.positions == [149]
        for i in range(150, 200):
            epochs.observe("b", f"k{i}")
        assert first.state == "finished" and second.state == "active"
        assert epochs.end("second") is second and second.state == "ended"
    run(body)


def test_eviction_advice_follows_the_future_over_queued_epochs() -> None:
    def body() -> None:
        epochs = _epochs()
        epochs.adopt(_epoch(["a", "b", "c", "d"], name="now"))
        epochs.adopt(_epoch(["d", "a"], name="next"))
        epochs.observe("b", "a")
        # b at 1, c at 2, d at 3 (this epoch); a next at 4 + 1 (the queued one).
        assert list(epochs.furthest()) == ["file-a", "file-d", "file-c", "file-b"]
        epochs.end("next")
        assert not epochs.wanted("file-a"), "consumed, and no later epoch reads it"
        assert list(epochs.furthest()) == ["file-d", "file-c", "file-b"]
    run(body)


def _belady_misses(sequence: list[str], capacity: int) -> int:
    cache: set[str] = set()
    misses = 0
    for i, key in enumerate(sequence):
        if key in cache:
            continue
        misses += 1
        if len(cache) == capacity:
            def next_use(k: str) -> int:
                try:
                    return sequence.index(k, i + 1)
                except ValueError:
                    return len(sequence) + 1
            cache.remove(max(cache, key=next_use))
        cache.add(key)
    return misses


def test_hinted_eviction_makes_beladys_choices_on_a_known_sequence() -> None:
    """Three epochs of 40 keys, each a new random order, through a cache of
    15: registered as hints (each epoch queued behind the last), the
    advisor's victims give exactly the misses of the offline optimum."""

    def body() -> None:
        rng = random.Random(5)
        keys = [f"k{i}" for i in range(40)]
        orders = [rng.sample(keys, len(keys)) for _ in range(3)]
        hot = _Hot()
        epochs = _epochs(hot)
        for n, order in enumerate(orders):
            epochs.adopt(_epoch(order, name=f"epoch{n}"))
        sieve = Sieve()
        misses = 0
        for order in orders:
            for key in order:
                name = f"file-{key}"
                if name not in hot.cached:
                    misses += 1
                    if len(hot.cached) == 15:
                        victim = sieve.victim(skip=epochs.wanted)
                        if victim is None:
                            victim_name = next(n for n in epochs.furthest() if n in sieve)
                            sieve.remove(victim_name)
                        else:
                            victim_name = victim[0]
                        hot.cached.discard(victim_name)
                    hot.cached.add(name)
                    sieve.insert(name, 1)
                epochs.observe("b", key)
        sequence = [k for order in orders for k in order]
        assert misses == _belady_misses(sequence, 15)
        assert misses < 0.8 * len(sequence)
    run(body)


def test_packed_neighbours_are_found_once_within_reach_and_the_horizon_follows_the_room() -> None:
    entries = [Entry(f"k{i}", size=100, extents=(Extent("seg", i * 100, 100, 100),), resolved=True)
               for i in range(50)]
    entries[20].extents = (Extent("other", 0, 100, 100),)
    epoch = Epoch(id="e", bucket="b", entries=entries, readers=1, lookahead_bytes=1 << 20,
                  lookahead_objects=8, idle_timeout=60)
    epoch.index_layout()
    near = list(epoch.neighbours([entries[10].extents[0], entries[12].extents[0]], reach=250))
    assert near == [8, 9, 10, 11, 12, 13, 14], "overlapping reaches walked once; other segments not"
    assert epoch.horizon(room=1000) == 10, "ten 100-byte objects fit ahead of the slowest reader"
    epoch.positions = [19]
    assert epoch.horizon(room=1000) == 30


def test_past_a_hot_window_the_prefetch_goes_on_as_far_as_the_room_allows() -> None:
    """With the window's objects hot and nothing in flight, the next
    objects past it, in read order, up to the horizon, are what to fetch;
    hot ones and those in flight are left out; nothing once all are hot."""
    def body() -> None:
        hot = _Hot()
        epochs = _epochs(hot)
        epoch = epochs.adopt(_epoch([f"k{i}" for i in range(100)], readers=2))
        epochs._adapt(epoch)
        order = list(epoch.upcoming())
        window, horizon = order[: epoch.window], epoch.horizon(40)
        hot.cached |= {f"file-k{p}" for p in window}
        epochs._inflight.add(f"k{order[epoch.window]}")
        ahead = [e.key for e in epochs._ahead(epoch, 40)]
        assert ahead == [f"k{p}" for p in order[epoch.window + 1:] if p < horizon]
        assert len(ahead) == horizon - epoch.window - 1
        hot.cached |= {f"file-{key}" for key in ahead}
        assert epochs._ahead(epoch, 40) == []
    run(body)


class _FarStore(LocalDirStore):
    """A capacity store a round trip away: every GET waits 20 ms first."""

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        await asyncio.sleep(0.020)
        return await super().get_range(name, start, end)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


@pytest.mark.parametrize("pattern", ["shared queue", "interleaved"])
def test_the_prefetch_keeps_ahead_of_sixteen_readers_of_a_far_store(tmp_path: Path, pattern: str) -> None:
    """400 objects of 64 KiB, flushed and evicted; an epoch registered with
    16 readers; 16 tasks read it through ``ObjectService.read`` (what a GET
    calls), either all pulling the next key from one shared queue (DataLoader
    workers) or each its interleaved share. The prefetch must move on with
    the readers: most reads find their object hot, the prefetcher brings far
    more than its first window, and the readers fetch few objects themselves."""
    count, readers, size = 400, 16, 64 * 1024

    async def main() -> tuple[Epoch, int, int]:
        node = Node(tmp_path / "data", TierSettings(flush_delay=3600.0), _FarStore(tmp_path / "capacity"))
        await node.start()
        try:
            await node.objects.create_bucket("train")
            keys = [f"img/{i:04d}.jpg" for i in range(count)]
            for key in keys:
                await node.objects.put("train", key, _one(os.urandom(size)), NewObject(),
                                       Integrity(expected_size=size))
            await node.tiers.flush()
            await node.tiers.residency.evict("train", "")
            order = random.Random(7).sample(keys, count)
            epoch = await node.epochs.register("train", order, readers=readers)
            queue = list(reversed(order))
            shares = [list(reversed(order[r::readers])) for r in range(readers)]
            hot = fetched = 0

            async def reader(r: int) -> None:
                nonlocal hot, fetched
                mine = queue if pattern == "shared queue" else shares[r]
                while mine:
                    plan = await node.objects.read(Read("train", mine.pop()))
                    assert isinstance(plan.body, bytes) and len(plan.body) == size
                    hot += plan.tally.capacity == 0
                    fetched += plan.tally.capacity > 0

            await asyncio.gather(*(reader(r) for r in range(readers)))
            return epoch, hot, fetched
        finally:
            await node.close()

    epoch, hot, fetched = asyncio.run(main())
    status = epoch.view()
    seen = {k: status[k] for k in ("hits", "misses", "prefetched_objects")} | {"hot": hot, "fetched": fetched}
    assert status["state"] == "finished" and status["consumed"] == count
    assert status["hits"] >= 0.75 * count, seen
    assert hot >= 0.75 * count and fetched <= 0.25 * count, seen
    assert status["prefetched_objects"] >= 0.75 * count, seen  # far past the first window (64)
