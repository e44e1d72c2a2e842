"""The prefetcher's depth (the window's fetches in flight at once) without
a network: it follows the readers' rate times the store's latency (Little's
law) past the 64 a fixed cap allowed, stays within the bytes it may hold in
memory, and halves when the store says SlowDown, growing back by one object
per round trip.

No wall time: the store is a fake mount that holds every GET until the test
answers them all at once, after moving the prefetcher's clock (a fake one)
by LATENCY. Every fetch then takes exactly LATENCY, the depths are exact,
and the tests count GETs in flight, landings and depths, not seconds."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from types import SimpleNamespace

import pytest

from tiering.errors import CapacityError, ServiceUnavailable
from tiering.prefetch import prefetcher as prefetcher_module
from tiering.prefetch.epoch import START_DEPTH, Entry, Epoch
from tiering.prefetch.prefetcher import DEPTH_HEADROOM, Prefetcher

KiB, MiB = 1024, 1024 * 1024
ROOM = 1 << 40  # the hot tier's room: no bound here unless a test sets one
LATENCY = 1 / 16  # seconds a GET takes: a power of two, so the fake clock's sums are exact


class _Clock:
    """The prefetcher's ``time.monotonic``: moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1024.0  # past the first FLOOR_PERIOD, as a real monotonic clock is

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    # The prefetcher module's own ``time``, not the time module: the event
    # loop keeps its real clock.
    monkeypatch.setattr(prefetcher_module, "time", SimpleNamespace(monotonic=fake.monotonic,
                                                                   perf_counter=time.perf_counter))
    return fake


class _Hot:
    def __init__(self) -> None:
        self.cached: set[str] = set()

    def is_cached(self, name: str) -> bool:
        return name in self.cached


def _slow_down() -> None:
    """What a mount raises when its source answered 503 SlowDown until its
    retries ran out: its own 503, over the store's error."""
    try:
        raise CapacityError("get_object failed after 3 attempts: SlowDown (HTTP 503)", code="SlowDown", status=503)
    except CapacityError as exc:
        raise ServiceUnavailable(f"The source of bucket b is unreachable: {exc}") from None


class _Source:
    """Every bucket is a mount; a GET waits for ``gate``, then lands (or
    fails with SlowDown when ``error``)."""

    def __init__(self, hot: _Hot) -> None:
        self.hot = hot
        self.error = False
        self.gets = 0  # GETs asked of the source
        self.gate = asyncio.Event()

    def get(self, name: str) -> object:
        return object()

    async def warm(self, bucket: str, key: str, room: int) -> SimpleNamespace:
        self.gets += 1
        await self.gate.wait()
        if self.error:
            _slow_down()
        self.hot.cached.add(f"file-{key}")
        return SimpleNamespace(hot=True, elsewhere=False)  # MountWarm's fields


def _setup(count: int, size: int, readers: int, rate: float) -> tuple[_Hot, _Source, Prefetcher, Epoch]:
    hot = _Hot()
    source = _Source(hot)

    async def named(epoch: Epoch, entry: Entry) -> None:
        raise AssertionError("every entry is resolved")

    prefetcher = Prefetcher(hot, source, None, 4, wake=lambda: None, named=named)  # type: ignore[arg-type]
    entries = [Entry(f"k{i}", size=size, names=(f"file-k{i}",), resolved=True) for i in range(count)]
    epoch = Epoch(id="e", bucket="b", entries=entries, readers=readers, lookahead_bytes=1 << 40,
                  lookahead_objects=1 << 20, idle_timeout=60)
    epoch.state = "active"
    epoch._rate = rate  # objects the readers read a second (as observe would measure it)
    return hot, source, prefetcher, epoch


def _read(epoch: Epoch, count: int) -> None:
    """The readers read their next ``count`` positions (what is not hot
    they fetch themselves), as observe would move them."""
    for position in list(itertools.islice(epoch.upcoming(), count)):
        epoch.consumed.add(position)
        epoch.positions[position % epoch.readers] = position


async def _answer(clock: _Clock, source: _Source, epoch: Epoch, error: bool = False) -> int:
    """One round trip: the store answers every GET in flight (SlowDown when
    ``error``), LATENCY after it was sent. Returns how many it answered."""
    await asyncio.sleep(0)  # the fetches just started take their start time
    answered = epoch.in_flight
    clock.now += LATENCY
    source.error = error
    source.gate.set()
    for _ in range(10):  # each fetch ends within a step or two of the loop
        if not epoch.in_flight:
            break
        await asyncio.sleep(0)
    assert not epoch.in_flight, epoch.in_flight
    source.gate.clear()
    source.error = False
    return answered


async def _learn_latency(clock: _Clock, source: _Source, prefetcher: Prefetcher, epoch: Epoch) -> None:
    """One round whose fetches all land: the epoch learns the store's latency."""
    await prefetcher.round(epoch, None, ROOM)
    assert await _answer(clock, source, epoch) == START_DEPTH
    assert epoch.prefetched_objects == START_DEPTH
    assert epoch.fetch_time == epoch.fetch_floor == LATENCY, (epoch.fetch_time, epoch.fetch_floor)


async def _depth_now(prefetcher: Prefetcher, epoch: Epoch) -> int:
    """The GETs one round sends while the store holds every answer."""
    await prefetcher.round(epoch, None, ROOM)
    await asyncio.sleep(0)  # the fetches reach the store
    return epoch.one_by_one


def test_a_new_epoch_starts_deep_before_its_pace_is_known(clock: _Clock) -> None:
    """2 readers, no rate or fetch time measured yet: the first round sends
    START_DEPTH fetches, not 4 or 2 per reader (from there the depth could
    only double with each rate measurement, the readers waiting meanwhile);
    once the pace is known, Little's law takes over."""
    async def main() -> None:
        hot, source, prefetcher, epoch = _setup(4000, 64 * KiB, readers=2, rate=0.0)
        assert epoch.window >= START_DEPTH
        assert await _depth_now(prefetcher, epoch) == START_DEPTH
        assert await _answer(clock, source, epoch) == START_DEPTH
        epoch._rate = 100.0  # measured now: 2 x 100/s x 62.5 ms is 12.5
        _read(epoch, START_DEPTH)
        depth = await _depth_now(prefetcher, epoch)
        assert depth == math.ceil(DEPTH_HEADROOM * 100.0 * LATENCY) == 13, depth
        assert source.gets == START_DEPTH + depth
        await prefetcher.stop()

    asyncio.run(main())


def test_the_depth_follows_rate_times_latency_past_sixty_four(clock: _Clock) -> None:
    """8 readers at 2,000 objects a second of a store 62.5 ms away: Little's
    law says 125 objects are in flight at that pace, twice that to get
    ahead. A fixed cap held it to 64."""
    async def main() -> None:
        hot, source, prefetcher, epoch = _setup(5000, 64 * KiB, readers=8, rate=2000.0)
        await _learn_latency(clock, source, prefetcher, epoch)
        depth = await _depth_now(prefetcher, epoch)
        assert depth == epoch.depth == math.ceil(DEPTH_HEADROOM * 2000 * LATENCY) == 250, depth
        assert source.gets == START_DEPTH + depth
        assert epoch.window >= depth, "the window holds what is in flight"
        await prefetcher.stop()

    asyncio.run(main())


def test_the_depth_holds_no_more_bytes_in_flight_than_its_bound(clock: _Clock) -> None:
    """The same pace of objects of 4 MiB: 250 in flight would hold 1000 MiB
    of bodies. The bytes in flight stay within INFLIGHT_BYTES, and within
    half the hot tier's room when that is smaller."""
    from tiering.prefetch.prefetcher import INFLIGHT_BYTES

    async def main() -> None:
        hot, source, prefetcher, epoch = _setup(5000, 4 * MiB, readers=8, rate=2000.0)
        await _learn_latency(clock, source, prefetcher, epoch)
        depth = await _depth_now(prefetcher, epoch)
        assert depth == INFLIGHT_BYTES // (4 * MiB), depth
        assert depth * 4 * MiB <= INFLIGHT_BYTES
        await prefetcher.stop()

        hot, source, prefetcher, epoch = _setup(5000, 4 * MiB, readers=8, rate=2000.0)
        await _learn_latency(clock, source, prefetcher, epoch)
        await prefetcher.round(epoch, None, 64 * MiB)  # a hot tier with 64 MiB of room
        assert epoch.one_by_one * 4 * MiB <= 32 * MiB, epoch.one_by_one
        await prefetcher.stop()

    asyncio.run(main())


def test_a_slow_down_halves_the_depth_once_and_it_grows_back_a_step_per_round_trip(clock: _Clock) -> None:
    """2 readers at 320 objects a second, 62.5 ms away: 40 in flight. The
    store answers every one of them 503 SlowDown at once: the depth halves,
    once for the whole burst (not once per failure), and after that grows
    back by one object per round trip while the store answers, until it is
    where the readers' pace puts it."""
    async def main() -> None:
        hot, source, prefetcher, epoch = _setup(4000, 64 * KiB, readers=2, rate=320.0)
        await _learn_latency(clock, source, prefetcher, epoch)
        before = await _depth_now(prefetcher, epoch)
        assert before == math.ceil(DEPTH_HEADROOM * 320 * LATENCY) == 40, before

        assert await _answer(clock, source, epoch, error=True) == before  # a burst of 40 SlowDowns
        assert len(epoch.failures) == before
        after = await _depth_now(prefetcher, epoch)
        assert after == before // 2, (before, after)

        # The store answers again; the readers read at their pace meanwhile
        # (320/s: 20 objects a round trip).
        depths = [after]
        landed = epoch.prefetched_objects
        for _ in range(4 * before):  # a bound: it takes about before - after
            assert await _answer(clock, source, epoch) == depths[-1], "every round sends the depth's GETs"
            _read(epoch, int(320 * LATENCY))
            await prefetcher.round(epoch, None, ROOM)
            depths.append(epoch.depth)
            if not epoch.ceiling:
                break
        assert not epoch.ceiling, depths
        assert depths[-1] == before, depths
        trips = len(depths) - 1
        # Additive: never a jump, one object per round trip (1 / ceiling per
        # landing, so a little less: a step of 0 now and then).
        assert all(0 <= b - a <= 1 for a, b in zip(depths, depths[1:])), depths
        assert before - after <= trips <= (before - after) * 1.25, (trips, depths)
        assert epoch.prefetched_objects - landed == sum(depths[:-1]), "every GET sent landed, counted once"
        await prefetcher.stop()

    asyncio.run(main())


def test_what_counts_as_the_store_pushing_back() -> None:
    """By the store's code and status, through the mount's 503: SlowDown
    and 429s, and the hot tier's own SlowDown; not a 500, nor a source
    that cannot be reached, nor a missing key."""
    from tiering.errors import NoSuchKey, SlowDown
    from tiering.prefetch.prefetcher import pushback

    def raised(fn) -> BaseException:  # type: ignore[no-untyped-def]
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001
            return exc
        raise AssertionError("nothing raised")

    def over(cause: CapacityError) -> BaseException:
        def fn() -> None:
            try:
                raise cause
            except CapacityError as exc:
                raise ServiceUnavailable(str(exc)) from None
        return raised(fn)

    assert pushback(raised(_slow_down))
    assert pushback(over(CapacityError("throttled", code="TooManyRequestsException", status=429)))
    assert pushback(CapacityError("slow", code="SlowDown", status=503))
    assert pushback(SlowDown("the hot tier is full", cause="budget"))
    assert not pushback(over(CapacityError("boom", code="InternalError", status=500)))
    assert not pushback(over(CapacityError("connection refused", code="", status=0)))
    assert not pushback(ServiceUnavailable("unreachable"))
    assert not pushback(NoSuchKey(Key="k"))
