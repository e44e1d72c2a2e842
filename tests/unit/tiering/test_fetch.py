"""Extent reads from the capacity tier: verification, refetch, single flight."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from packer import format as seg
from tiering.admission import ADMISSION
from tiering.capacity import LocalDirStore
from tiering.capacity.layout import segment_path
from tiering.errors import CapacityError
from tiering.hot.tier import HotTier
from tiering.maintenance.segments import extent_of
from tiering.meta import Extent
from tiering.reads.fetch import ExtentReader, plan_runs


class Flaky(LocalDirStore):
    """A local store that counts GETs and corrupts the first ``bad`` of them."""

    def __init__(self, root: Path, bad: int = 0) -> None:
        super().__init__(root)
        self.bad = bad
        self.gets = 0

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        self.gets += 1
        await asyncio.sleep(0.01)  # long enough for concurrent callers to pile up
        data = bytearray(await super().get_range(name, start, end))
        if self.gets <= self.bad and data:
            data[len(data) // 2] ^= 0x40
        return bytes(data)


async def _segment(store: LocalDirStore, payload: bytes):
    encoder = seg.SegmentEncoder("0000000000000001")
    header = encoder.header()
    ref, stored = encoder.add("b", "k", 1, 0, payload)
    await store.put(segment_path("0000000000000001"), header + stored + encoder.finish())
    return extent_of("0000000000000001", ref)


def _reader(tmp_path: Path, bad: int = 0) -> tuple[Flaky, HotTier, ExtentReader]:
    store = Flaky(tmp_path / "cap", bad)
    hot = HotTier(tmp_path / "hot", budget=1 << 30)
    return store, hot, ExtentReader(store, hot, concurrency=4)


PAYLOAD = b"training sample " * 5000


def test_concurrent_misses_share_one_get(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _reader(tmp_path)
        ext = await _segment(store, PAYLOAD)
        results = await asyncio.gather(*(reader.fetch(ext) for _ in range(20)))
        assert all(r == PAYLOAD for r in results)
        assert store.gets == 1
        await reader.drain()
        assert hot.read_cached(ext.cache_name, ext.raw) == PAYLOAD

    asyncio.run(go())


def test_a_read_while_the_fill_is_written_is_served_from_its_bytes(tmp_path: Path) -> None:
    """A second read of an extent right after the miss that fetched it, while
    its cache fill is still being written: no second GET, counted a hit."""

    async def go():
        store, hot, reader = _reader(tmp_path)
        ext = await _segment(store, PAYLOAD)
        release = asyncio.Event()
        fill = hot.fill

        def slow_fill(*args, **kwargs):
            asyncio.run_coroutine_threadsafe(release.wait(), loop).result()
            return fill(*args, **kwargs)

        loop = asyncio.get_running_loop()
        hot.fill = slow_fill
        assert await reader.fetch(ext) == PAYLOAD
        assert await reader.open_cached(ext) is None  # not in the cache yet
        assert await reader.fetch(ext) == PAYLOAD
        assert (store.gets, reader.misses, reader.hits) == (1, 1, 1)
        release.set()
        await reader.drain()
        assert hot.read_cached(ext.cache_name, ext.raw) == PAYLOAD
        assert await reader.fetch(ext) == PAYLOAD and store.gets == 2  # filled: the next miss reads the store
        await reader.drain()

    asyncio.run(go())


def test_corrupt_bytes_are_fetched_again_never_served(tmp_path: Path) -> None:
    async def go():
        store, _, reader = _reader(tmp_path, bad=2)
        ext = await _segment(store, PAYLOAD)
        assert await reader.fetch(ext) == PAYLOAD
        assert store.gets == 3

    asyncio.run(go())


def test_persistent_corruption_is_an_error_and_caches_nothing(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _reader(tmp_path, bad=100)
        ext = await _segment(store, PAYLOAD)
        with pytest.raises(CapacityError, match="corrupt"):
            await reader.fetch(ext)
        await reader.drain()
        assert hot.read_cached(ext.cache_name, ext.raw) is None
        assert hot.cached == 0

    asyncio.run(go())


# -- fetch_many: many extents, few GETs ----------------------------------------

SEG_A = "000000000000000a"
SEG_B = "000000000000000b"
SIZE = 1000  # stored bytes of each small extent (not compressed)


class Recording(LocalDirStore):
    """A local store that records every GET and can fail it, corrupt one
    byte of the segment while serving it, or hold it until released."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.ranges: list[tuple[str, int, int]] = []
        self.fail = 0  # the next GETs that raise CapacityError
        self.corrupt: tuple[str, int] | None = None  # (segment, offset) served flipped
        self.corrupt_times = 0
        self.gate: asyncio.Event | None = None  # GETs wait for it when set
        self.entered = asyncio.Event()

    @property
    def gets(self) -> int:
        return len(self.ranges)

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        self.ranges.append((name, start, end))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            self.fail -= 1
            raise CapacityError("injected GET failure")
        data = bytearray(await super().get_range(name, start, end))
        if self.corrupt is not None and self.corrupt_times:
            segment, offset = self.corrupt
            if name == segment_path(segment) and start <= offset < end:
                self.corrupt_times -= 1
                data[offset - start] ^= 0x40
        return bytes(data)


def _payload(i: int) -> bytes:
    return (f"{i:04d}" * (SIZE // 4)).encode()


async def _packed(store: LocalDirStore, name: str, payloads: list[bytes], compress: bool = False):
    """A real segment of ``payloads``, one entry each; their extents."""
    encoder = seg.SegmentEncoder(name)
    parts = [encoder.header()]
    extents = []
    for i, payload in enumerate(payloads):
        ref, stored = encoder.add("b", f"k{i}", 1, 0, payload, compress=compress)
        parts.append(stored)
        extents.append(extent_of(name, ref))
    parts.append(encoder.finish())
    await store.put(segment_path(name), b"".join(parts))
    return extents


def _many(tmp_path: Path, concurrency: int = 4) -> tuple[Recording, HotTier, ExtentReader]:
    store = Recording(tmp_path / "cap")
    hot = HotTier(tmp_path / "hot", budget=1 << 30)
    return store, hot, ExtentReader(store, hot, concurrency=concurrency)


async def _consistent(reader: ExtentReader, hot: HotTier, expected: dict[str, bytes]) -> None:
    """Integrity at the end of a test: fills done, nothing left in flight or
    reserved, the cache holds exactly ``expected`` (cache name -> bytes)."""
    await reader.drain()
    assert not reader._flight._inflight
    assert hot.reserved == 0
    for name, data in expected.items():
        assert hot.read_cached(name, len(data)) == data
    assert hot.cached == sum(len(d) for d in expected.values())
    assert not list(hot.cache_root.rglob("*.tmp"))


def test_extents_of_one_segment_within_span_cost_one_get(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _many(tmp_path)
        payloads = [_payload(i) for i in range(100)]
        extents = await _packed(store, SEG_A, payloads)
        assert all(b.offset == a.offset + SIZE for a, b in zip(extents, extents[1:]))
        filled = []
        report = await reader.fetch_many(extents, on_filled=filled.append)
        assert store.gets == 1
        assert store.ranges == [(segment_path(SEG_A), extents[0].offset, extents[-1].offset + SIZE)]
        assert (report.requests, report.extents, report.bytes) == (1, 100, 100 * SIZE)
        assert (report.skipped, report.failed, report.errors, report.error) == (0, 0, 0, None)
        assert sorted(filled, key=lambda e: e.offset) == extents
        assert reader.misses == 100
        await _consistent(reader, hot, {e.cache_name: p for e, p in zip(extents, payloads)})

    asyncio.run(go())


@pytest.mark.parametrize("span", [10 * SIZE, 25 * SIZE, 30 * SIZE, 30 * SIZE + 999])
def test_runs_are_cut_at_span(tmp_path: Path, span: int) -> None:
    async def go():
        store, hot, reader = _many(tmp_path)
        payloads = [_payload(i) for i in range(100)]
        extents = await _packed(store, SEG_A, payloads)
        report = await reader.fetch_many(extents, span=span)
        per_run = span // SIZE
        assert store.gets == report.requests == -(-100 // per_run)
        assert all(end - start <= span for _, start, end in store.ranges)
        assert report.bytes == 100 * SIZE
        await _consistent(reader, hot, {e.cache_name: p for e, p in zip(extents, payloads)})

    asyncio.run(go())


def test_under_a_memory_budget_runs_are_a_quarter_of_the_buffers_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ADMISSION, "limit", 40 * SIZE)  # runs of at most 10 extents
    monkeypatch.setattr(ADMISSION, "peak", 0)
    monkeypatch.setattr(ADMISSION, "high", 0)

    async def go():
        store, hot, reader = _many(tmp_path)
        payloads = [_payload(i) for i in range(100)]
        extents = await _packed(store, SEG_A, payloads)
        report = await reader.fetch_many(extents, gap=0)
        assert store.gets == report.requests == 10
        assert all(end - start <= 10 * SIZE for _, start, end in store.ranges)
        assert ADMISSION.held == 0 and ADMISSION.peak <= 40 * SIZE  # each run reserved, then given back
        await _consistent(reader, hot, {e.cache_name: p for e, p in zip(extents, payloads)})

    asyncio.run(go())


def test_a_hole_larger_than_gap_splits_a_run(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _many(tmp_path)
        payloads = [_payload(i) for i in range(30)]
        extents = await _packed(store, SEG_A, payloads)
        wanted = extents[:10] + extents[20:]  # a hole of 10 extents between
        report = await reader.fetch_many(wanted, gap=10 * SIZE - 1)
        assert store.gets == 2 and report.bytes == 20 * SIZE

        store2, hot2, reader2 = _many(tmp_path / "again")
        extents2 = await _packed(store2, SEG_A, payloads)
        report2 = await reader2.fetch_many(extents2[:10] + extents2[20:], gap=10 * SIZE)
        assert store2.gets == 1
        assert report2.bytes == 30 * SIZE  # the hole was read along
        assert report2.extents == 20
        kept = [*range(10), *range(20, 30)]
        await _consistent(reader, hot, {extents[i].cache_name: payloads[i] for i in kept})
        await _consistent(reader2, hot2, {extents2[i].cache_name: payloads[i] for i in kept})

    asyncio.run(go())


def test_extents_of_two_segments_are_separate_runs(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _many(tmp_path)
        a = await _packed(store, SEG_A, [_payload(i) for i in range(10)])
        b = await _packed(store, SEG_B, [_payload(i) for i in range(10, 20)], compress=True)
        report = await reader.fetch_many(b + a)  # order does not matter
        assert store.gets == report.requests == 2
        assert {name for name, _, _ in store.ranges} == {segment_path(SEG_A), segment_path(SEG_B)}
        assert report.extents == 20
        expected = {e.cache_name: _payload(i) for i, e in enumerate(a + b)}
        await _consistent(reader, hot, expected)

    asyncio.run(go())


def test_plan_runs() -> None:
    small = [Extent(SEG_A, 100 + i * 10, 10, 10) for i in range(5)]
    big = Extent(SEG_A, 200, 500, 500)
    empty = Extent(SEG_A, 150, 0, 0)  # same offset as the entry after it
    runs = plan_runs([big, *small, *small, empty], gap=0, span=100)
    # In the order asked for: the big extent came first.
    assert [(r.start, r.end, len(r.extents)) for r in runs] == [(200, 700, 1), (100, 150, 6)]
    # A run goes where its first-asked member was.
    runs = plan_runs([big, small[3], small[0]], gap=20, span=100)
    assert [(r.start, r.end) for r in runs] == [(200, 700), (100, 140)]
    runs = plan_runs([small[3], big, small[0]], gap=20, span=100)
    assert [(r.start, r.end) for r in runs] == [(100, 140), (200, 700)]
    assert plan_runs([], gap=0, span=1) == []
    with pytest.raises(ValueError):
        plan_runs(small, gap=0, span=0)


def test_cached_extents_are_skipped_and_pinned_when_asked(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _many(tmp_path)
        payloads = [_payload(i) for i in range(20)]
        extents = await _packed(store, SEG_A, payloads)
        for ext in extents[5:10]:
            await reader.fetch(ext)
        await reader.drain()
        before = store.gets
        report = await reader.fetch_many(extents, pin=True, gap=0)
        assert report.skipped == 5 and report.extents == 15
        assert store.gets - before == 2  # the runs either side of the cached ones
        assert not any(start <= extents[7].offset < end for _, start, end in store.ranges[before:])
        assert hot.pinned == 20 * SIZE  # the cached ones pinned too
        again = await reader.fetch_many(extents)
        assert again.skipped == 20 and again.requests == 0 and store.gets - before == 2
        await _consistent(reader, hot, {e.cache_name: p for e, p in zip(extents, payloads)})

    asyncio.run(go())


def test_a_corrupt_extent_in_a_run_is_fetched_again_alone(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _many(tmp_path)
        payloads = [_payload(i) for i in range(50)]
        extents = await _packed(store, SEG_A, payloads)
        bad = extents[17]
        store.corrupt, store.corrupt_times = (SEG_A, bad.offset + 3), 1
        report = await reader.fetch_many(extents)
        assert store.ranges[1:] == [(segment_path(SEG_A), bad.offset, bad.offset + bad.stored)]
        assert (report.requests, report.extents, report.errors) == (2, 50, 0)
        assert report.bytes == 51 * SIZE
        assert reader.misses == 50
        await _consistent(reader, hot, {e.cache_name: p for e, p in zip(extents, payloads)})

    asyncio.run(go())


def test_persistent_corruption_is_reported_and_the_rest_is_cached(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _many(tmp_path)
        payloads = [_payload(i) for i in range(50)]
        extents = await _packed(store, SEG_A, payloads)
        bad = extents[17]
        store.corrupt, store.corrupt_times = (SEG_A, bad.offset + 3), 100
        report = await reader.fetch_many(extents)
        # The run's read and two more of the extent alone: three reads in all, as fetch makes.
        assert store.gets == report.requests == 3
        assert (report.extents, report.errors) == (49, 1)
        assert isinstance(report.error, CapacityError) and "corrupt" in str(report.error)
        expected = {e.cache_name: p for e, p in zip(extents, payloads) if e != bad}
        await _consistent(reader, hot, expected)
        assert hot.read_cached(bad.cache_name, bad.raw) is None

    asyncio.run(go())


def test_a_reader_of_an_extent_in_a_run_waits_for_that_get(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _many(tmp_path)
        payloads = [_payload(i) for i in range(40)]
        extents = await _packed(store, SEG_A, payloads)
        store.gate = asyncio.Event()
        batch = asyncio.create_task(reader.fetch_many(extents, pin=True))
        await store.entered.wait()  # the run's GET is in flight
        readers = [asyncio.create_task(reader.fetch(extents[i])) for i in (0, 21, 39)]
        warmer = asyncio.create_task(reader.warm(extents[5]))
        await asyncio.sleep(0.05)
        store.gate.set()
        assert await asyncio.gather(*readers) == [payloads[0], payloads[21], payloads[39]]
        assert await warmer
        report = await batch
        assert store.gets == 1 and report.extents == 40
        assert hot.pinned == 40 * SIZE
        await _consistent(reader, hot, {e.cache_name: p for e, p in zip(extents, payloads)})

    asyncio.run(go())


def test_a_failed_get_fails_its_waiters_and_leaves_nothing_in_flight(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _many(tmp_path)
        payloads = [_payload(i) for i in range(10)]
        extents = await _packed(store, SEG_A, payloads)
        store.gate = asyncio.Event()
        store.fail = 1
        batch = asyncio.create_task(reader.fetch_many(extents))
        await store.entered.wait()
        waiter = asyncio.create_task(reader.fetch(extents[4]))
        await asyncio.sleep(0.01)
        store.gate.set()
        with pytest.raises(CapacityError, match="injected"):
            await waiter
        report = await batch
        assert (report.requests, report.extents, report.errors, report.bytes) == (1, 0, 10, 0)
        assert isinstance(report.error, CapacityError)
        await _consistent(reader, hot, {})
        assert await reader.fetch(extents[4]) == payloads[4]  # a later fetch works
        again = await reader.fetch_many(extents)
        assert again.extents == 9 and again.skipped == 1 and store.gets == 3
        await _consistent(reader, hot, {e.cache_name: p for e, p in zip(extents, payloads)})

    asyncio.run(go())


def test_a_cancelled_batch_hands_its_waiters_back_their_own_fetch(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _many(tmp_path)
        payloads = [_payload(i) for i in range(10)]
        extents = await _packed(store, SEG_A, payloads)
        store.gate = asyncio.Event()
        batch = asyncio.create_task(reader.fetch_many(extents))
        await store.entered.wait()
        waiter = asyncio.create_task(reader.fetch(extents[4]))
        await asyncio.sleep(0.01)
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        store.gate.set()
        assert await waiter == payloads[4]
        alone = (segment_path(SEG_A), extents[4].offset, extents[4].offset + SIZE)
        assert store.gets == 2 and store.ranges[-1] == alone
        await _consistent(reader, hot, {extents[4].cache_name: payloads[4]})

    asyncio.run(go())


def test_extents_that_do_not_fit_are_counted_failed(tmp_path: Path) -> None:
    async def go():
        store = Recording(tmp_path / "cap")
        # A high watermark with room for 10 extents.
        hot = HotTier(tmp_path / "hot", budget=int(10.5 * SIZE / 0.9) + 1)
        reader = ExtentReader(store, hot, concurrency=4)
        payloads = [_payload(i) for i in range(20)]
        extents = await _packed(store, SEG_A, payloads)
        filled: list[Extent] = []
        report = await reader.fetch_many(extents, pin=True, on_filled=filled.append)
        assert report.extents == 20 and report.failed == 10 and len(filled) == 10
        assert hot.pinned == 10 * SIZE
        expected = {e.cache_name: _payload(extents.index(e)) for e in filled}
        await _consistent(reader, hot, expected)

    asyncio.run(go())


def test_empty_extents_ride_along_or_need_no_get(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _many(tmp_path)
        payloads = [b"", _payload(1), b"", b""]
        extents = await _packed(store, SEG_A, payloads)
        report = await reader.fetch_many(extents)
        # The two trailing empty entries are one extent: same place, same cache file.
        assert store.gets == report.requests == 1 and report.extents == 3
        only_empty = await reader.fetch_many([Extent(SEG_B, 64, 0, 0)])  # no such segment: no GET
        assert store.gets == 1 and only_empty.requests == 0 and only_empty.extents == 1
        expected = {e.cache_name: p for e, p in zip(extents, payloads)}
        await _consistent(reader, hot, expected | {Extent(SEG_B, 64, 0, 0).cache_name: b""})

    asyncio.run(go())


def test_runs_are_fetched_in_the_order_asked_for(tmp_path: Path) -> None:
    async def go():
        store, _, reader = _many(tmp_path, concurrency=1)
        later = await _packed(store, SEG_A, [_payload(0)])
        first = await _packed(store, SEG_B, [_payload(1)])
        report = await reader.fetch_many([*first, *later])
        assert report.requests == 2
        assert [name for name, _, _ in store.ranges] == [segment_path(SEG_B), segment_path(SEG_A)]

    asyncio.run(go())


def test_a_run_skips_what_was_cached_while_it_waited_for_a_get(tmp_path: Path) -> None:
    """A reader that fetched an extent itself while the run holding it
    waited for a GET slot: the run does not fetch it again."""
    async def go():
        store, hot, reader = _many(tmp_path, concurrency=1)
        a = await _packed(store, SEG_A, [_payload(0)])
        b = await _packed(store, SEG_B, [_payload(1)])
        store.gate = asyncio.Event()
        warming = asyncio.create_task(reader.fetch_many([*a, *b]))
        await store.entered.wait()  # the run of A holds the only GET slot
        other = ExtentReader(LocalDirStore(tmp_path / "cap"), hot, concurrency=1)
        assert await other.fetch(b[0]) == _payload(1)
        await other.drain()
        store.gate.set()
        report = await warming
        assert store.ranges == [(segment_path(SEG_A), a[0].offset, a[0].offset + a[0].stored)]
        assert (report.requests, report.extents, report.skipped) == (1, 1, 1)
        await _consistent(reader, hot, {a[0].cache_name: _payload(0), b[0].cache_name: _payload(1)})

    asyncio.run(go())
