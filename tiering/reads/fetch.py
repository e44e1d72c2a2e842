"""Reading extents back from the capacity tier.

A miss costs one ranged GET of exactly the extent's stored bytes; they are
checked against the extent's CRC and decoded before anyone sees them, and a
mismatch is fetched again rather than served. Concurrent misses on the same
extent share one GET (single flight), and a node-wide semaphore bounds how
many GETs are in flight. Verified bytes are written to the hot-tier cache in
the background while the caller already streams them.

Memory: each GET reserves the bytes it will hold (``tiering/admission.py``)
before it is made: an extent's stored bytes (and its decoded ones) during
its GET, an arrival's buffer for as long as it lives (it is sent on and
cached after its GET), a run's span. A read under way waits its turn a
bounded time, then fails with SlowDown (503 before its answer started).

A large extent stored as it is can instead be read as it arrives
(``open_live``: ``tiering/reads/arrival.py``): its first bytes go to the
client while the rest are still on the way, and the CRC is carried along.

A prefetch of many small neighbouring extents (``fetch_many``) instead reads
each run of them with one ranged GET: at 20 ms a request, 20,000 objects of
64 KiB cost 40 GETs of 32 MiB rather than 20,000. Each extent of a run is
still verified on its own, and readers asking for one of them meanwhile wait
for the run rather than issue their own GET.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import mmap
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from packer import codec
from packer import format as seg
from packer.errors import FormatError
from tiering import pool
from tiering.admission import ADMISSION, ROOM_WAIT, UNDER_WAY_WAIT
from tiering.capacity import CapacityStore
from tiering.capacity.layout import segment_path
from tiering.errors import CapacityError
from tiering.hot.fills import BEHIND, Fills
from tiering.hot.open_files import Opened
from tiering.hot.tier import HotTier
from tiering.meta import Extent
from tiering.reads.arrival import Arrival
from tiering.reads.flight import SingleFlight

log = logging.getLogger("tierstore.fetch")

OnFilled = Callable[[Extent], None]
PeerSource = Callable[[], Awaitable[bytes | None]]  # an extent's checked bytes from another gateway, or None

_ATTEMPTS = 3  # fetches of one extent before a checksum mismatch is an error
# Under a memory budget, a run of fetch_many spans at most this fraction
# of the buffers' share (tiering/admission.py).
RUN_SHARE = 4
SMALL_GET = 1024 * 1024  # an extent GET of at most this many bytes takes a small-GET slot
# An extent of more stored bytes than this, not compressed, is read as it
# arrives by ``open_live`` (a smaller body is gathered whole before its
# answer starts anyway: ``tiering.reads.plan.SMALL_READ``).
LIVE_READ = SMALL_GET
# Extents verified on the event loop (see _decoded): up to this many stored
# bytes with a CRC32C and no codec (about 2 us per 64 KiB).
LOOP_DECODE = 128 * 1024


@dataclass(slots=True)
class FetchReport:
    """What one ``fetch_many`` did."""

    requests: int = 0  # ranged GETs made: one per run, plus refetches of corrupt extents
    extents: int = 0  # extents fetched and verified by this call
    bytes: int = 0  # stored bytes transferred, holes between extents included
    skipped: int = 0  # already cached, or being fetched or filled by someone else
    failed: int = 0  # verified but not cached: no room in the hot tier, or a disk error
    errors: int = 0  # not fetched: the GET failed, or the bytes stayed corrupt
    error: CapacityError | None = None  # the first of those errors, to raise or show


@dataclass(frozen=True, slots=True)
class Run:
    """Extents of one segment read with one ranged GET of ``[start, end)``."""

    segment: str
    start: int
    end: int
    extents: tuple[Extent, ...]


def plan_runs(extents: Iterable[Extent], gap: int, span: int) -> list[Run]:
    """Group extents into runs, by segment and offset: a hole of at most
    ``gap`` bytes between neighbours is read along (cheaper than another
    request), a run spans at most ``span`` bytes (an extent larger than that
    is a run of its own). The same extent listed twice is read once.

    Runs come in the order their extents were asked for (a run's first
    member in ``extents`` decides): a caller listing extents in read order,
    as the prefetcher does, gets its GETs issued in that order."""
    if gap < 0 or span <= 0:
        raise ValueError(f"need gap >= 0 and span > 0, got gap={gap} span={span}")
    unique: dict[tuple[str, int, int], Extent] = {}
    asked: dict[tuple[str, int, int], int] = {}
    for i, ext in enumerate(extents):
        unique.setdefault(ext.place, ext)
        asked.setdefault(ext.place, i)
    runs: list[Run] = []
    members: list[Extent] = []
    start = end = 0
    for ext in sorted(unique.values(), key=lambda e: e.place):
        ext_end = ext.offset + ext.stored
        joins = ext.segment == members[0].segment if members else False
        if joins and ext.offset - end <= gap and ext_end - start <= span:
            members.append(ext)
            end = max(end, ext_end)
            continue
        if members:
            runs.append(Run(members[0].segment, start, end, tuple(members)))
        members, start, end = [ext], ext.offset, ext_end
    if members:
        runs.append(Run(members[0].segment, start, end, tuple(members)))
    runs.sort(key=lambda run: min(asked[ext.place] for ext in run.extents))
    return runs


class _Abandoned(CapacityError):
    """The ``fetch_many`` run that was to bring an extent was cancelled
    before its GET completed; whoever waited for it fetches it alone.
    Never leaves this module."""


async def _decoded(ext: Extent, stored: bytes | memoryview) -> bytes:
    """The extent's verified raw bytes (FormatError when they fail): on the
    event loop for a small extent stored as it is with a CRC32C (its check
    is a CRC over at most LOOP_DECODE bytes, about 4 us), where a pool call
    would cost the process several times that in handoffs; else in the pool."""
    if ext.crc32c and ext.codec == codec.NONE and ext.stored <= LOOP_DECODE:
        return seg.decode_entry(_entry_ref(ext), stored)
    return await pool.run(seg.decode_entry, _entry_ref(ext), stored)


def _entry_ref(ext: Extent) -> seg.EntryRef:
    return seg.EntryRef("", "", 0, 0, ext.offset, ext.stored, ext.raw, ext.codec, ext.crc, crc32c=ext.crc32c)


def _retrieve(future: asyncio.Future[bytes]) -> None:
    # A failed run nobody went on to wait for must not log "exception never retrieved".
    if not future.cancelled():
        future.exception()


class ExtentReader:
    """Cache-first reads of extents, filling the hot tier on misses."""

    def __init__(self, capacity: CapacityStore, hot: HotTier, concurrency: int, small_gets: int = 64) -> None:
        self._capacity = capacity
        self._hot = hot
        # GETs in flight, by size: small extents (small objects, read by many
        # readers at once, each waiting one round trip) get many slots, large
        # ones few, so memory stays bounded either way (TierSettings).
        self._small_gets = asyncio.Semaphore(small_gets)
        self._gets = asyncio.Semaphore(concurrency)
        # Runs of fetch_many held in memory (each up to ``span`` bytes). Not
        # ``_gets``: a run keeps its buffer after its GET, while its extents
        # are verified and cached, and a corrupt one is refetched with a GET.
        self._runs = asyncio.Semaphore(concurrency)
        # An extent's bytes, and whether its fill started with them (for the leader).
        self._flight: SingleFlight[tuple[bytes, bool]] = SingleFlight()
        self._fills = Fills(hot)  # cache name -> the verified bytes a fill is writing
        self._live: dict[tuple[str, int, int], Arrival] = {}  # extents being read as they arrive
        self._arrivals: set[asyncio.Task[tuple[bytes, bool]]] = set()
        self.hits = 0
        self.misses = 0
        self.from_peers = 0  # misses another gateway answered

    async def open_cached(self, ext: Extent) -> Opened | None:
        """A descriptor on the cached copy, or None on a miss (known from
        memory, without a pool call, when the hot tier does not list it)."""
        if not self._hot.is_cached(ext.cache_name):
            return None
        fd = await pool.run(self._hot.open_cached, ext.cache_name, ext.raw)
        if fd is not None:
            self.hits += 1
        return fd

    async def fetch(self, ext: Extent, pin: bool = False, peer: PeerSource | None = None) -> bytes:
        """The extent's raw bytes from the capacity tier (shared by
        concurrent callers), verified; queued for the hot-tier cache
        (pinned there when ``pin``). ``peer`` is asked first: checked bytes
        from the gateway that owns the extent's segment, or None to read the
        store; what the owner sent is not kept here (its owner keeps it: the
        nodes' hot tiers add up to one cache), unless ``pin``. An extent whose
        fill is still being written (a read right after the miss that
        fetched it) is served from those bytes: a hit, no second GET."""
        if not pin and (filling := self._fills.held(ext.cache_name)) is not None:
            self.hits += 1
            return filling if type(filling) is bytes else bytes(filling)  # an arrival's buffer
        peered: list[bool] = []  # marked by this call's own _fetch when a peer sent the bytes
        while True:
            try:
                (data, filling), leader = await self._flight.run(ext.place, lambda: self._fetch(ext, pin, peer, peered))
                break
            except _Abandoned:
                continue  # the run we waited for was cancelled: fetch it ourselves
        if leader and not filling and (pin or not peered):
            self._start_fill(ext, data, pin)
        return data if type(data) is bytes else bytes(data)  # an arrival's buffer, for a reader that joined it

    async def open_live(
        self, ext: Extent, pin: bool = False, peer: PeerSource | None = None,
    ) -> bytes | bytearray | mmap.mmap | Arrival:
        """As :meth:`fetch`, but a large extent stored as it is comes back
        at once as an :class:`Arrival`, filled as the store's bytes come
        (readers send them on meanwhile), checked by its CRC at the end,
        then cached. A second reader of it meanwhile gets the same arrival.
        Compressed or small extents, extents some other read is fetching
        whole, and reads that ask a peer first (``peer``) take ``fetch``.

        The fetch runs in a task of its own, not the caller's: a reader
        that goes away does not cut it short, and its bytes are cached."""
        if peer is not None or ext.codec != codec.NONE or ext.stored <= LIVE_READ:
            return await self.fetch(ext, pin, peer)
        if (live := self._live.get(ext.place)) is not None:
            return live
        if not pin and (filling := self._fills.held(ext.cache_name)) is not None:
            self.hits += 1  # a read right after the miss that fetched it: its buffer, as it is
            return filling
        if ext.place in self._flight:
            return await self.fetch(ext, pin, peer)  # joins that fetch
        arrival = Arrival(ext.stored, ext.crc, ext.crc32c)
        self._live[ext.place] = arrival
        task = self._flight.spawn(ext.place, self._arrive(ext, arrival, pin))
        self._arrivals.add(task)
        task.add_done_callback(functools.partial(self._arrived, ext.place, arrival))
        return arrival

    async def _arrive(self, ext: Extent, arrival: Arrival,
                      pin: bool) -> tuple[bytes | bytearray | mmap.mmap, bool]:
        """Read the extent into ``arrival``; its checked bytes (fetched
        again whole after a CRC mismatch), cached behind the answer."""
        self.misses += 1
        await self._fills.room(BEHIND * ext.stored)  # the extents before it written, but for a few
        await arrival.reserve()
        async with self._gets:
            await self._capacity.get_range_into(segment_path(ext.segment), ext.offset, ext.offset + ext.stored,
                                                arrival)
        if arrival.received == ext.stored:
            await arrival.verdict()
        data: bytes | bytearray | mmap.mmap
        if arrival.checked:
            data = arrival.data  # what readers send slices of is what the fill writes: no copy
            self._start_fill(ext, data, pin)  # type: ignore[arg-type]  # a buffer written once, never changed
        else:
            log.warning("extent %s@%d failed verification as it arrived (%d of %d bytes)",
                        ext.segment, ext.offset, arrival.received, ext.stored)
            data = await self._verified(ext, tried=1, fill=pin)
        arrival.settle(data)
        return data, ext.cache_name in self._fills

    def _arrived(self, place: tuple[str, int, int], arrival: Arrival, task: asyncio.Task[Any]) -> None:
        self._arrivals.discard(task)
        if self._live.get(place) is arrival:
            del self._live[place]
        arrival.failed_with(task, "extent")

    def _start_fill(self, ext: Extent, data: bytes, pin: bool) -> None:
        """Cache the extent (pinned when ``pin``) in the background, by the
        fills' writer. Registered before the caller yields, so a follower of
        the same fetch finds it (``warm`` waits for it)."""
        self._fills.write(ext.cache_name, data, pin)

    async def _fill_of(self, ext: Extent) -> bool:
        """Wait for the extent's fill: True once cached (if it ended
        already, whether the extent is cached)."""
        fill = self._fills.task(ext.cache_name)
        return bool(await asyncio.shield(fill)) if fill is not None else self._hot.is_cached(ext.cache_name)

    async def settled(self, names: Iterable[str]) -> None:
        """Until the background fills of ``names`` running now have ended:
        for a caller that must see the hot tier as the answers left it."""
        await self._fills.wait(names)

    async def warm(self, ext: Extent, pin: bool = False) -> bool:
        """Make sure the extent is cached (pinned when ``pin``); False when
        it does not fit in the hot tier."""
        name = ext.cache_name
        if self._hot.is_cached(name):
            if pin:
                self._hot.pin([name])
            return True
        await self.fetch(ext, pin)
        fill = self._fills.task(name)
        if fill is not None:
            await asyncio.shield(fill)
        if pin:
            self._hot.pin([name])  # filled unpinned by a reader that fetched it first
        return self._hot.is_cached(name) or self._hot.is_filling(name)

    async def adopt(self, ext: Extent, data: bytes) -> bool:
        """Cache an extent's raw bytes that came from elsewhere (a peer
        gateway), already checked by the caller; True once cached."""
        if self._hot.is_cached(ext.cache_name):
            return True
        self._start_fill(ext, data, False)
        return await self._fill_of(ext)

    async def _fetch(
        self, ext: Extent, pin: bool, peer: PeerSource | None = None, peered: list[bool] | None = None,
    ) -> tuple[bytes, bool]:
        """The extent's verified bytes, and whether the fill that caches
        them started with the check (from the store; a peer's bytes are
        not: ``peered`` is marked then)."""
        self.misses += 1
        if peer is not None and (data := await peer()) is not None:
            self.from_peers += 1
            if peered is not None:
                peered.append(True)
            return data, False
        data = await self._verified(ext, fill=pin)
        return data, ext.cache_name in self._fills

    async def _verified(
        self, ext: Extent, tried: int = 0, report: FetchReport | None = None, fill: bool | None = None,
    ) -> bytes:
        """GET the extent alone until its bytes verify, ``_ATTEMPTS`` times
        in all (``tried`` already made, by a run); with ``fill`` (pinned or
        not), cached behind the check by the fills' writer."""
        gets = self._small_gets if ext.stored <= SMALL_GET else self._gets
        # The stored bytes, and the decoded ones beside them while they are made.
        held = ext.stored + (ext.raw if ext.codec != codec.NONE else 0)
        for attempt in range(tried + 1, _ATTEMPTS + 1):
            try:
                async with ADMISSION.hold(held, ROOM_WAIT, force=True):  # a read under way: never refused
                    async with gets:
                        if report is not None:
                            report.requests += 1
                        stored = await self._capacity.get_range(segment_path(ext.segment), ext.offset,
                                                                ext.offset + ext.stored)
                    if report is not None:
                        report.bytes += len(stored)
                    if fill is not None:
                        return await self._decode_and_fill(ext, stored, fill)
                    return await _decoded(ext, stored)
            except FormatError as exc:
                log.warning("extent %s@%d failed verification (attempt %d): %s", ext.segment, ext.offset, attempt, exc)
                if attempt == _ATTEMPTS:
                    raise CapacityError(
                        f"segment {ext.segment} returned corrupt bytes at offset {ext.offset} "
                        f"{_ATTEMPTS} times; not served"
                    ) from exc
        raise AssertionError("unreachable")

    async def _decode_and_fill(self, ext: Extent, stored: bytes | memoryview, pin: bool) -> bytes:
        """The extent's raw bytes out of ``stored`` (FormatError when they
        fail verification), then cached (pinned when ``pin``) behind the
        answer by the fills' writer thread. The fill is registered
        (``_fills``) before this returns."""
        data = await _decoded(ext, stored)
        self._start_fill(ext, data, pin)
        return data

    # -- many extents, few GETs ------------------------------------------------

    async def fetch_many(
        self,
        extents: Sequence[Extent],
        pin: bool = False,
        gap: int = 1 << 20,
        span: int = 32 << 20,
        on_filled: OnFilled | None = None,
    ) -> FetchReport:
        """Cache every extent not cached yet (pinned when ``pin``), reading
        neighbours of one segment together: runs whose holes are at most
        ``gap`` bytes and whose length is at most ``span`` bytes, one ranged
        GET each (see ``plan_runs``), as many at once as the GET semaphore
        allows. ``on_filled(ext)`` follows each extent this call caches.

        Extents that are cached, or that someone else is fetching or
        filling, are skipped; with ``pin`` they are pinned all the same
        (once that other fetch has cached them). Each extent of a run is
        verified alone: a corrupt one is fetched again by itself, up to
        ``_ATTEMPTS`` reads in all, and never cached. Capacity-tier failures
        (a failed GET, bytes corrupt every time) are counted in the report,
        not raised, so one bad extent does not stop a warm of thousands; the
        caller raises ``report.error`` if it must. Readers that asked for an
        extent of a run meanwhile share its outcome, error included.

        Memory: a run's bytes are held once, from its GET until its last
        extent is cached; at most ``concurrency`` runs are held, so the peak
        is about concurrency x ``span`` (8 x 32 MiB by default), plus one
        decoded extent per run. Under a memory budget a run is at most a
        quarter of the buffers' share (``RUN_SHARE``), so runs take their
        turns in it rather than each one over it.
        """
        if ADMISSION.limit:
            span = max(gap, min(span, ADMISSION.limit // RUN_SHARE))
        report = FetchReport()
        todo, others = self._sort_out({e.place: e for e in extents}.values(), pin, report)
        jobs = [self._run(run, pin, on_filled, report) for run in plan_runs(todo, gap, span)]
        jobs += [self._skip(ext, pin, report) for ext in others]
        tasks = [asyncio.create_task(job) for job in jobs]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:  # after a failure or a cancellation, stop the rest
                task.cancel()
        return report

    def _sort_out(
        self, extents: Iterable[Extent], pin: bool, report: FetchReport
    ) -> tuple[list[Extent], list[Extent]]:
        """Extents still to fetch, and those someone else is fetching or
        filling; cached ones are counted as skipped (and pinned with ``pin``)."""
        todo: list[Extent] = []
        others: list[Extent] = []
        for ext in extents:
            name = ext.cache_name
            if self._hot.is_cached(name):
                report.skipped += 1
                if pin:
                    self._hot.pin([name])
            elif ext.place in self._flight or name in self._fills or self._hot.is_filling(name):
                others.append(ext)
            else:
                todo.append(ext)
        return todo, others

    async def _skip(self, ext: Extent, pin: bool, report: FetchReport) -> None:
        """An extent someone else is fetching or filling: with ``pin``, wait
        for that (sharing its GET) and pin it."""
        report.skipped += 1
        if not pin:
            return
        try:
            if ext.place in self._flight:
                await self.fetch(ext)  # joins that fetch
            fill = self._fills.task(ext.cache_name)
            if fill is not None:
                await asyncio.shield(fill)
        except CapacityError as exc:
            self._error(report, exc)
            return
        self._hot.pin([ext.cache_name])

    @staticmethod
    def _error(report: FetchReport, exc: CapacityError) -> None:
        report.errors += 1
        if report.error is None:
            report.error = exc

    async def _run(
        self, run: Run, pin: bool, on_filled: OnFilled | None, report: FetchReport
    ) -> None:
        """One ranged GET for the run, then each extent verified and cached
        by a task of its own (``_piece``).

        The pieces register their extents in the single flight before the
        GET starts, so a reader of one of them waits for this GET instead of
        making its own; they do so once the GET has a slot, so that reader
        waits for one GET, not for a queue of them."""
        pieces: list[asyncio.Task[None]] = []
        skips: list[asyncio.Task[None]] = []
        # A run's buffer is held until its last piece is cached. Prefetches
        # and batches are under way: they wait their turn, then take it.
        held = run.end - run.start
        async with self._runs:
            await ADMISSION.force(held, UNDER_WAY_WAIT)
            try:
                async with self._gets:
                    # Sorted out again: while this run waited for its slot, a
                    # reader may have fetched and cached some of its extents.
                    mine, others = self._sort_out(run.extents, pin, report)
                    skips = [asyncio.create_task(self._skip(ext, pin, report)) for ext in others]
                    if mine:
                        pieces = await self._get_run(run, mine, pin, on_filled, report)
                # Not gather: cancelling this call must not cancel pieces that
                # readers wait for; they finish on their own.
                if pieces:
                    await asyncio.wait(pieces)
            finally:
                ADMISSION.give(held)
        if skips:
            await asyncio.wait(skips)
        failures = [
            exc for task in pieces + skips if not task.cancelled() and (exc := task.exception())
        ]
        if failures:
            raise failures[0]

    async def _get_run(
        self,
        run: Run,
        mine: list[Extent],
        pin: bool,
        on_filled: OnFilled | None,
        report: FetchReport,
    ) -> list[asyncio.Task[None]]:
        """Register ``mine`` (pieces), GET their bytes and hand them over;
        the pieces, once they have started (called with a GET slot held)."""
        start = mine[0].offset
        end = max(ext.offset + ext.stored for ext in mine)
        got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        got.add_done_callback(_retrieve)
        # One extent at a time goes to the shared thread pool, so a big
        # prefetch does not queue thousands of jobs ahead of readers.
        turn = asyncio.Lock()
        pieces = [
            asyncio.create_task(self._piece(ext, got, start, turn, pin, on_filled, report))
            for ext in mine
        ]
        try:
            # Each piece registers its extent on its first step; ready tasks
            # run in the order they were scheduled, so after one yield every
            # piece is registered.
            await asyncio.sleep(0)
            stored = b""  # a run of empty extents needs no request
            if end > start:
                report.requests += 1
                stored = await self._capacity.get_range(segment_path(run.segment), start, end)
        except Exception as exc:  # every piece, and every reader waiting on one, gets it
            log.warning("GET of %d extents of segment %s failed: %s", len(mine), run.segment, exc)
            got.set_exception(exc)
        except BaseException:  # cancelled: readers waiting on a piece fetch it alone
            got.set_exception(_Abandoned(f"fetch of {run.segment} [{start}, {end}) cancelled"))
            raise
        else:
            report.bytes += len(stored)
            got.set_result(stored)
        return pieces

    async def _piece(
        self,
        ext: Extent,
        got: asyncio.Future[bytes],
        start: int,
        turn: asyncio.Lock,
        pin: bool,
        on_filled: OnFilled | None,
        report: FetchReport,
    ) -> None:
        """One extent of a run: leads its single flight with the run's
        bytes, then caches them (the same fill ``fetch`` starts)."""
        work = functools.partial(self._cut, ext, got, start, turn, pin, report)
        try:
            (data, filling), leader = await self._flight.run(ext.place, work)
        except _Abandoned:
            return
        except CapacityError as exc:
            self._error(report, exc)
            return
        if not leader:  # someone registered it between planning and our GET
            await self._skip(ext, pin, report)
            return
        report.extents += 1
        if not filling:
            self._start_fill(ext, data, pin)
        if not await self._fill_of(ext):
            report.failed += 1
            return
        if on_filled is not None:
            on_filled(ext)

    async def _cut(
        self,
        ext: Extent,
        got: asyncio.Future[bytes],
        start: int,
        turn: asyncio.Lock,
        pin: bool,
        report: FetchReport,
    ) -> tuple[bytes, bool]:
        """The extent's verified raw bytes out of the run's (a refetch of it
        alone when they fail verification), and whether the fill that caches
        them started with the check."""
        self.misses += 1
        stored = await asyncio.shield(got)  # shared: a cancelled piece must not cancel it
        view = memoryview(stored)[ext.offset - start : ext.offset - start + ext.stored]
        async with turn:
            try:
                data = await self._decode_and_fill(ext, view, pin)
                return data, True
            except FormatError as exc:
                log.warning(
                    "extent %s@%d of a run failed verification: %s", ext.segment, ext.offset, exc
                )
        data = await self._verified(ext, tried=1, report=report, fill=pin)
        return data, ext.cache_name in self._fills

    async def drain(self) -> None:
        """Wait for background cache fills (at shutdown); extents still
        being read as they arrive are given up."""
        for task in list(self._arrivals):
            task.cancel()
        if self._arrivals:
            await asyncio.wait(list(self._arrivals))
        await self._fills.drain()
