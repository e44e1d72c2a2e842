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
from tiering.hot.sieve import Sieve
from tiering.maintenance import fsck
from tiering.meta import Extent
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node
from tiering.prefetch.epoch import Entry, Epoch
from tiering.prefetch.epochs import Epochs
from tiering.reads.plan import Read
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


def test_reads_of_keys_the_epoch_does_not_name_make_it_warn_and_are_counted() -> None:
    def body() -> None:
        epochs = _epochs()
        epoch = epochs.adopt(_epoch([f"train/img_{i:04}.npz" for i in range(500)], bucket="resnet50"))
        # The trainer reads the keys as s3:// URLs, which is what the bucket holds.
        for i in range(99):
            epochs.observe("resnet50", f"s3://resnet50/train/img_{i:04}.npz")
        epochs.observe("other", "train/img_0000.npz")  # another bucket: not this epoch's reads
        assert epoch.view()["warning"] is None, "too few reads to say yet"
        epochs.observe("resnet50", "s3://resnet50/train/img_0099.npz")
        view = epoch.view()
        assert (view["bucket_reads"], view["unmatched_reads"], view["consumed"]) == (100, 100, 0)
        assert epochs.unmatched_reads == 100
        warning = str(view["warning"])
        assert warning.startswith("0 of the 100 reads of bucket 'resnet50'")
        assert "'s3://resnet50/train/img_0000.npz' is not one of them" in warning
        assert "keys are taken literally" in warning and "docs/prefetch.md" in warning
        # Readers that start reading the named keys lift it, once 1 % are of the order.
        epochs.observe("resnet50", "train/img_0000.npz")
        epochs.observe("resnet50", "train/img_0000.npz")  # a re-read: in the order, not unmatched
        assert epoch.view()["warning"] is None
        assert (epoch.bucket_reads, epoch.unmatched_reads, epochs.unmatched_reads) == (102, 100, 100)
    run(body)


def test_reads_in_the_order_give_no_warning() -> None:
    def body() -> None:
        epochs = _epochs()
        epoch = epochs.adopt(_epoch([f"k{i}" for i in range(300)]))
        for i in range(200):
            epochs.observe("b", f"k{i}")
            epochs.observe("b", "labels.csv")  # other objects of the bucket read along: fine
        view = epoch.view()
        assert (view["bucket_reads"], view["unmatched_reads"], view["warning"]) == (400, 200, None)
        assert epochs.unmatched_reads == 200
    run(body)


def test_an_epoch_whose_keys_are_mostly_missing_says_so() -> None:
    def body() -> None:
        epochs = _epochs()
        epoch = epochs.adopt(_epoch([f"k{i}" for i in range(500)]))
        for i in range(250):
            epoch.mark_missing(f"k{i}")
        assert epoch.view()["warning"] is None, "half missing: not most"
        for i in range(250, 412):
            epoch.mark_missing(f"k{i}")
        assert epoch.view()["warning"] == "412 of 500 entries are missing at the source"
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


def test_readers_of_one_shared_queue_move_the_positions_in_read_order() -> None:
    """Sixteen workers that each take the next key of one queue read the
    order almost, not exactly, in turn: every read moves a position, none
    is taken for a restart, and what is upcoming is what nobody read yet."""
    def body() -> None:
        epochs = _epochs()
        epoch = epochs.adopt(_epoch([f"k{i}" for i in range(200)], readers=16))
        rng = random.Random(3)
        for start in range(0, 96, 16):  # reads begin in bursts, a little out of order
            burst = list(range(start, start + 16))
            rng.shuffle(burst)
            for position in burst:
                epochs.observe("b", f"k{position}")
        assert epoch.positions == list(range(80, 96))
        assert list(epoch.upcoming())[:20] == list(range(96, 116))
        epochs.observe("b", "k97")
        epochs.observe("b", "k96")
        assert set(list(epoch.upcoming())[:16]) == set(range(98, 114))
        assert (epoch.hits, epoch.late, epoch.misses) == (0, 0, 98)
    run(body)


def _packed(count: int) -> list[Entry]:
    """Objects of 100 bytes: the odd ones packed in one segment, the even
    ones each in a segment of its own."""
    entries = []
    for i in range(count):
        ext = Extent("packed", i * 100, 100, 100) if i % 2 else Extent(f"alone{i}", 0, 100, 100)
        entries.append(Entry(f"k{i}", size=100, names=(ext.cache_name,), extents=(ext,), resolved=True))
    return entries


def test_the_window_plans_what_is_neither_hot_nor_in_flight_and_says_how_far_ahead_it_is() -> None:
    def body() -> None:
        hot = _Hot()
        epochs = _epochs(hot)
        epoch = epochs.adopt(Epoch(id="e", bucket="b", entries=_packed(100), readers=2, lookahead_bytes=1 << 30,
                                   lookahead_objects=64, idle_timeout=60))
        epochs._prefetch.adapt(epoch)
        assert epoch.window == 8, "4 per reader before any read"
        hot.cached |= {epoch.entries[p].names[0] for p in (0, 1, 2, 4)}
        epochs._prefetch.inflight.add(("b", "k5"))
        plan = [p for _, p in epochs._prefetch.plan(epoch, budget=1 << 30, slots=2)]
        assert plan == [3, 6], "3 and 6; 5 is in flight; at most two at once"
        assert epoch.lead == 3, "0, 1 and 2 hot in a row ahead of the readers"
        assert [p for _, p in epochs._prefetch.plan(epoch, budget=1 << 30, slots=8, concede=4)] == [6, 7]
    run(body)


def test_past_the_window_bulk_takes_objects_in_read_order_with_their_packed_neighbours() -> None:
    """Up to the horizon the room allows: the next objects past the window,
    in read order, that are neither hot nor in flight, each with what is
    packed next to it (one ranged GET brings it along), unless a reader
    asks for that sooner (the window); nothing more once all are hot."""
    def body() -> None:
        hot = _Hot()
        epochs = _epochs(hot)
        epoch = epochs.adopt(Epoch(id="e", bucket="b", entries=_packed(100), readers=2, lookahead_bytes=1 << 30,
                                   lookahead_objects=64, idle_timeout=60))
        epochs._prefetch.adapt(epoch)
        horizon = epoch.horizon(4000)
        assert (epoch.window, horizon) == (8, 40)
        hot.cached.add(epoch.entries[12].names[0])
        epochs._prefetch.inflight.add(("b", "k10"))
        ahead = [int(e.key[1:]) for e in epochs._prefetch.ahead(epoch, horizon, budget=1 << 30)]
        assert ahead == [8, 9, *range(11, 40, 2), *range(14, 40, 2)]
        assert [int(e.key[1:]) for e in epochs._prefetch.ahead(epoch, horizon, budget=250)] == [8, 9, *range(11, 40, 2)]
        hot.cached |= {epoch.entries[p].names[0] for p in ahead}
        assert epochs._prefetch.ahead(epoch, horizon, budget=1 << 30) == []
    run(body)


class _FarStore(LocalDirStore):
    """A capacity store a round trip away: every GET waits 20 ms first."""

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        await asyncio.sleep(0.020)
        return await super().get_range(name, start, end)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _read_hinted(root: Path, pattern: str, step: float, hot_size: int, count: int = 400,
                 midway: int = 0) -> dict[str, object]:
    """``count`` objects of 64 KiB, flushed and evicted; an epoch registered
    for 16 readers; 16 tasks read it through ``ObjectService.read`` (what a
    GET calls), all pulling the next key from one shared queue (DataLoader
    workers) or each its interleaved share, taking ``step`` seconds per
    object. The epoch's status when the last read ends, with the reads the
    tally saw served hot, the capacity GETs, the most objects the status
    ever showed hot ahead of the readers, and what the prefetcher had
    brought once its last fetch ended. With ``midway``, the readers stop
    halfway through the epoch until the prefetcher has counted that many
    objects (at most 10 s; ``midway_reached`` says whether it did). The
    data dir checks clean after."""
    readers, size = 16, 64 * 1024

    async def main() -> dict[str, object]:
        settings = TierSettings(flush_delay=3600.0, hot_size=hot_size)
        node = Node(root / "data", settings, _FarStore(root / "capacity"))
        await node.start()
        try:
            await node.objects.create_bucket("train")
            keys = [f"img/{i:04d}.jpg" for i in range(count)]
            for i, key in enumerate(keys):
                await node.objects.put("train", key, _one(os.urandom(size)), NewObject(),
                                       Integrity(expected_size=size))
                if i % 50 == 49:  # staged writes must fit a small hot tier
                    await node.tiers.flush()
            await node.tiers.flush()
            await node.tiers.residency.evict("train", "")
            gets = node.tiers.capacity.stats.gets
            order = random.Random(7).sample(keys, count)
            epoch = await node.epochs.register("train", order, readers=readers)
            queue = list(reversed(order))
            shares = [list(reversed(order[r::readers])) for r in range(readers)]
            hot = lead = done = 0
            half_read, halfway = asyncio.Event(), asyncio.Event()

            async def landed(enough: int) -> bool:
                for _ in range(1000):
                    if epoch.prefetched_objects >= enough:
                        return True
                    await asyncio.sleep(0.01)
                return False

            async def sample() -> None:
                nonlocal lead
                while True:
                    lead = max(lead, int(epoch.view()["ahead_objects"]))  # type: ignore[call-overload]
                    await asyncio.sleep(0.005)

            async def reader(r: int) -> None:
                nonlocal hot, done
                mine = queue if pattern == "shared queue" else shares[r]
                while mine:
                    if midway and done >= count // 2:
                        await halfway.wait()
                    plan = await node.objects.read(Read("train", mine.pop()))
                    assert isinstance(plan.body, bytes | bytearray) and len(plan.body) == size
                    hot += plan.tally.hot == size and plan.tally.capacity == 0
                    done += 1
                    if done == count // 2:
                        half_read.set()
                    await asyncio.sleep(step)  # the training step

            async def pause() -> bool:
                await half_read.wait()
                try:
                    return await landed(midway)
                finally:
                    halfway.set()

            sampler = asyncio.create_task(sample())
            paused = asyncio.create_task(pause()) if midway else None
            await asyncio.gather(*(reader(r) for r in range(readers)))
            sampler.cancel()
            status = epoch.view() | {"hot": hot, "gets": node.tiers.capacity.stats.gets - gets, "lead": lead,
                                     "midway_reached": paused is not None and await paused}
            for _ in range(500):
                if not epoch.in_flight:
                    break
                await asyncio.sleep(0.01)
            return status | {"brought": epoch.prefetched_objects}
        finally:
            await node.close()

    status = asyncio.run(main())
    assert fsck.check(root / "data") == []
    return status


@pytest.mark.parametrize("pattern", ["shared queue", "interleaved"])
def test_the_prefetch_keeps_ahead_of_sixteen_readers_of_a_far_store(tmp_path: Path, pattern: str) -> None:
    """Readers that take a 20 ms step per object ask for 800 objects a
    second, as many as sixteen readers that each wait a 20 ms GET per
    object. With a hot tier that holds less than half the data set, the
    prefetch must keep moving ahead of them, a room at a time: nearly every
    read finds its object hot, the prefetcher brings in far more than its
    first window (64 objects), and the store sees no more GETs than one
    per object, as an unhinted epoch would."""
    count = 400
    status = _read_hinted(tmp_path, pattern, step=0.020, hot_size=12 * 1024 * 1024, count=count)
    seen = {k: status[k] for k in ("hits", "late", "misses", "prefetched_objects", "hot", "gets", "lead")}
    assert status["state"] == "finished" and status["consumed"] == count
    assert status["hits"] >= 0.75 * count and status["hot"] >= 0.75 * count, seen
    assert status["misses"] <= 0.1 * count, seen
    assert status["prefetched_objects"] >= 0.75 * count, seen
    assert status["lead"] >= 16, seen  # ahead_objects: at least one object per reader, at times
    assert status["gets"] <= count, seen


def test_readers_faster_than_the_store_wait_on_the_prefetch_and_the_status_says_so(tmp_path: Path) -> None:
    """Readers with no step read hot objects faster than the store can
    bring them (here the node's CPU verifying and caching them is the
    limit): they catch up with the prefetch and wait on its GETs. Few fetch
    anything themselves; their waits are counted as late, not as hits or
    misses; what the prefetch brought is counted as it lands, not once a
    whole batch has (which left the count at the first window, 64, until
    after the epoch): with the readers stopped halfway, the count reaches
    all but a window of what they have read while the epoch is going; and
    it ends up bringing nearly every object. (How far the count has got when the last read
    ends depends on the pace: readers take the bytes from the prefetch's
    GET before its fill lands, so a busy fills' writer leaves it behind.)"""
    count = 400
    status = _read_hinted(tmp_path, "shared queue", step=0.0, hot_size=64 * 1024**3, count=count, midway=count // 2 - 64)
    seen = {k: status[k] for k in ("hits", "late", "misses", "prefetched_objects", "midway_reached", "brought", "gets")}
    assert status["state"] == "finished" and status["hits"] + status["late"] + status["misses"] == count
    # Late: 90 to 107 of 400 here since a fetched extent is checked and
    # cached in one pool call (the prefetch got faster); at least a tenth
    # shows the waits are counted as late, whatever the machine's pace.
    assert status["misses"] <= 0.1 * count and status["late"] >= 0.1 * count, seen
    assert status["midway_reached"] and status["brought"] >= 0.9 * count, seen
    assert status["gets"] <= count, seen


def test_every_prefetch_ends_in_an_answer_missing_and_failed_keys_are_not_asked_again(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A mount whose source answers 404 for one key, 403 for another and
    fails a third every time: the first two are asked once and reported
    missing, the third MAX_ATTEMPTS times (the back-off set to nothing
    here) and reported failed; none is asked again, round after round."""
    from tiering.errors import NoSuchKey, ServiceUnavailable, SourceDenied
    from tiering.prefetch import epoch as epoch_module
    from tiering.prefetch.prefetcher import Prefetcher

    monkeypatch.setattr(epoch_module, "RETRY_BASE", 0.0)
    answers = {"gone": NoSuchKey(Key="gone"), "denied": SourceDenied("403"), "flaky": ServiceUnavailable("503")}
    asked: list[str] = []
    hot = _Hot()

    class Source:
        def get(self, name: str) -> object:
            return object()  # every bucket is a mount

        async def warm(self, bucket: str, key: str, room: int) -> SimpleNamespace:
            asked.append(key)
            if key in answers:
                raise answers[key]
            hot.cached.add(f"file-{key}")
            return SimpleNamespace(hot=True, elsewhere=False)  # MountWarm's fields

    async def named(epoch: Epoch, entry: Entry) -> None:
        entry.resolved, entry.names = True, (f"file-{entry.key}",)

    async def main() -> None:
        prefetcher = Prefetcher(hot, Source(), None, 4, wake=lambda: None, named=named)  # type: ignore[arg-type]
        keys = ["gone", "ok", "denied", "flaky", "gone"]
        epoch = Epoch(id="e", bucket="b", entries=[Entry(k) for k in keys], readers=1, lookahead_bytes=1 << 30,
                      lookahead_objects=64, idle_timeout=60)
        epoch.state = "active"
        for _ in range(20):
            prefetcher.adapt(epoch)
            prefetcher._fetch(prefetcher.plan(epoch, 1 << 30, 8), 1 << 30)
            for _ in range(5):
                await asyncio.sleep(0)
        await prefetcher.stop()
        assert sorted(asked) == sorted(["gone", "ok", "denied", *["flaky"] * epoch_module.MAX_ATTEMPTS])
        view = epoch.view()
        assert (view["missing"], view["missing_keys"], view["missing_objects"]) == (2, ["gone", "denied"], 3)
        assert (view["failed"], view["failed_keys"], view["prefetched_objects"]) == (1, ["flaky"], 1)
        assert not prefetcher.inflight and epoch.in_flight == 0

    asyncio.run(main())
