"""The epoch prefetcher: what to fetch ahead of an epoch's readers, and the
fetches themselves.

Each round, ``tiering.prefetch.epochs`` hands it every active epoch (with the one
queued next for its bucket) and the hot tier's room. It sizes the lookahead
window from the observed read rate, plans the window's objects that are
neither hot nor in flight, and fetches them alone or in small runs, as many
at once as keeps it ahead of the readers; on a managed bucket, bulk runs of
packed objects go on past the window, up to the horizon the room allows.
Each object is in flight until it lands (or its fetch fails), and counts as
prefetched when it lands.

How many of the window's objects are in flight at once (the depth) follows
Little's law: the readers' rate times the store's latency, twice over, so
that the latency is covered at the readers' pace with room to get ahead.
It is bounded by memory (``INFLIGHT_BYTES``: a fetched body is held until
it is written), by the epoch's ``lookahead_bytes`` and half the hot tier's
room, and by the store's answers: a 503 SlowDown or a 429 halves it, and it
grows back by one object per round trip (``Epoch.count_pushback``,
``Epoch.count_landed``).

Every fetch ends in an answer the epoch keeps: landed; missing (the source
answered 404 or 403: the key is never prefetched again in the epoch, and
the epoch reports it); or failed, after ``MAX_ATTEMPTS`` attempts spaced by
a growing back-off (``tiering.prefetch.epoch``). A key is never asked for
again and again: without that, a mount's missing key was fetched again at
every round, thousands of 404s a minute. Readers that ask for such a key
still get their own answer (their 404, or a fetch of their own).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable

from tiering import pool
from tiering.capacity.s3_answers import THROTTLING_CODES
from tiering.errors import (
    AccessDenied,
    CapacityError,
    NoSuchKey,
    ServiceUnavailable,
    SlowDown,
    SourceDenied,
)
from tiering.hot.tier import HotTier
from tiering.meta import Extent
from tiering.mounts.buckets import Mounts
from tiering.prefetch.epoch import START_DEPTH, Entry, Epoch
from tiering.reads.fetch import ExtentReader, plan_runs

log = logging.getLogger("tierstore.epochs")  # the epochs' channel, as before the prefetcher had a module

NEIGHBOUR_REACH = 4 * 1024 * 1024  # bytes either side of a needed extent fetched along with it
EXTRA_LIMIT = 256 * 1024 * 1024  # most bytes of bulk batches an epoch keeps in flight
MUST_GAP = 256 * 1024  # runs of the readers' next objects: small, to land within a round trip
MUST_SPAN = 4 * 1024 * 1024
BULK_GAP = 1024 * 1024  # runs of packed neighbours: large, bandwidth over latency
# A reader that asks for an object of a bulk run waits for the whole GET and
# for the extents before it (they are verified and cached in offset order,
# not read order). 1,000 objects of 64 KiB in moto 20 ms away, 16 readers
# with no step between reads: runs of 32 MiB served 5 % of the reads hot in
# 1.1-1.2 s, runs of 8 MiB 22 % in 1.0 s (unhinted: 3.2-4.4 s).
BULK_SPAN = 8 * 1024 * 1024
# The depth (the window's objects in flight at once) is Little's law: the
# readers' rate times a fetch's time, times DEPTH_HEADROOM (both are
# averages, and the prefetch must get ahead, not only keep pace). A fetch's
# time is its moving average, but at most LATENCY_SPREAD times the fastest
# of the last few seconds (``Epoch.fetch_floor``): past that, fetches wait in
# a queue of the gateway's own (the store client's connections, the event
# loop, the cores), and a depth that followed the average deepened the queue
# it measured (a mount 50 ms away, 8 readers: 2,000 in flight, fetches of 1
# to 2 s, readers stalled for seconds). At most INFLIGHT_BYTES of objects at
# once: their bodies are in memory until written. A fixed 64 held that mount
# to about 4x the store read directly (docs/benchmarks.md).
DEPTH_HEADROOM = 2.0
LATENCY_SPREAD = 2.0
INFLIGHT_BYTES = 128 * 1024 * 1024
# What a store says when it wants fewer requests: S3's SlowDown (503) and
# the throttling codes of S3-compatible stores (botocore's list), or any
# 503 or 429. Read from the CapacityError's code and status, never its text.
PUSHBACK_CODES = THROTTLING_CODES | {"ServiceUnavailable"}
PUSHBACK_STATUS = frozenset({429, 503})
# Missing keys a window walk passes over beyond the window (they take no
# place in it): bounded, so that an order of mostly missing keys costs a
# round no more than a window of a few thousand objects.
MISSING_REACH = 4096


class Prefetcher:
    """Fetches what the active epochs' readers will ask for before they ask.

    Owns the lookahead window (sized from the read rate), the plans of each
    round, the objects in flight (``inflight``, each epoch's ``in_flight``,
    ``one_by_one`` and ``bulk_bytes``) and the fetch tasks. The epochs, their
    readers' positions and the eviction advice stay with ``Epochs``, which
    runs the rounds: it hands this class what each round needs, and this
    class gives back only two signals, ``wake`` (an object landed: plan
    again) and ``named`` (a mounted object fetched before it was known: its
    cache files need a place in the future), so neither reaches into the
    other's state."""

    def __init__(
        self,
        hot: HotTier,
        mounts: Mounts,
        reader: ExtentReader,
        fetch_concurrency: int,
        wake: Callable[[], None],
        named: Callable[[Epoch, Entry], Awaitable[None]],
    ) -> None:
        self._hot = hot
        self._mounts = mounts
        self._reader = reader
        self._fetch_concurrency = fetch_concurrency
        self._wake = wake
        self._named = named
        self.inflight: set[tuple[str, str]] = set()  # (bucket, key) being prefetched
        self.planning = 0.0  # seconds spent walking windows (plan), in all
        self._tasks: set[asyncio.Task[None]] = set()

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def round(self, epoch: Epoch, following: Epoch | None, room: int) -> None:
        """One round for an active epoch: its window, the start of
        ``following`` (the epoch queued next for its bucket) when its end is
        in the window, and on a managed bucket the bulk past the window."""
        depth = self._slots(epoch, room)
        # On a mount, a reader that asks for an object being prefetched
        # makes a GET of its own: leave the readers what they will ask
        # for before a prefetch could land (twice that: both are
        # averages), and prefetch beyond it. A prefetch that keeps ahead
        # finds those hot anyway; one that fell behind jumps ahead.
        concede = 0 if self._managed(epoch) else int(2 * epoch.rate * epoch.fetch_time)
        self.adapt(epoch, depth + concede)
        free = depth - epoch.one_by_one
        plan = self.plan(epoch, min(epoch.lookahead_bytes, room // 2), free, concede=concede)
        left = sum(1 for _ in itertools.islice(epoch.upcoming(), epoch.window)) if following is not None else 0
        if left < epoch.window and following is not None:  # the end of this epoch warms the start of the next
            more = free - len(plan) - following.one_by_one
            plan += self.plan(following, epoch.lookahead_bytes, more, epoch.window - left)
        if plan:
            self._fetch(plan, room)
        if self._managed(epoch):
            await self._bulk(epoch, room)

    def _managed(self, epoch: Epoch) -> bool:
        """A mounted bucket's epoch is prefetched object by object, within
        its window only: its source is not ours to read ahead of the job."""
        return self._mounts.get(epoch.bucket) is None

    def _slots(self, epoch: Epoch, room: int) -> int:
        """The window's objects an epoch fetches at once, alone or in small
        runs (its depth): twice what the readers consume while one fetch
        lasts (Little's law, with room to get ahead; a fetch's time without
        more than LATENCY_SPREAD times the fastest one's worth of queueing
        of our own), and at least twice its readers, so it outruns readers
        that each fetch one object at a time (with only as many as the
        readers, it keeps pace at best, and every read it meets half-way
        waits). Then bounded: by the bytes it may hold in memory and the
        hot tier may take (INFLIGHT_BYTES, ``lookahead_bytes``, half the
        room, over the objects' mean size), and by the ceiling the store's
        pushback set (cleared once it has grown back past the rest)."""
        latency = min(epoch.fetch_time, LATENCY_SPREAD * epoch.fetch_floor)
        # Before the first rate (or fetch time) is known: START_DEPTH.
        little = math.ceil(DEPTH_HEADROOM * epoch.rate * latency) if epoch.rate and latency else START_DEPTH
        want = max(self._fetch_concurrency, 2 * epoch.readers, little)
        if epoch.ceiling:
            if epoch.ceiling >= want:
                epoch.ceiling = 0.0  # grown back: the store takes what the readers need
            else:
                want = int(epoch.ceiling)
        memory = min(INFLIGHT_BYTES, epoch.lookahead_bytes, room // 2) // epoch.object_bytes()
        epoch.depth = max(1, min(want, memory))
        return epoch.depth

    def adapt(self, epoch: Epoch, reach: int = 0) -> None:
        """Window in objects: enough to cover about two seconds of reads at
        the observed rate and 4 per reader, or ``reach`` (what a round
        leaves the readers and fetches at once) when that is more, at most
        the epoch's cap. A larger window than needed costs a managed bucket
        GETs: the window's objects are fetched alone or in small runs, those
        past it in bulk runs."""
        want = max(int(epoch.rate * 2.0) + 4 * epoch.readers, reach)
        epoch.window = max(4 * epoch.readers, min(epoch.lookahead_objects, want))

    def plan(
        self, epoch: Epoch, budget: int, slots: int, limit: int | None = None, concede: int = 0
    ) -> list[tuple[Epoch, int]]:
        """Upcoming positions within the window (or the first ``limit``),
        past the first ``concede``, whose files are neither hot nor in
        flight, nor missing, backing off or failed: at most ``slots`` of
        them. Missing keys take no place in the window. Sets
        ``epoch.lead``: the upcoming objects hot in a row, how far ahead of
        the readers the prefetch is (at most the window)."""
        started = time.perf_counter()
        hot = self._hot
        plan: list[tuple[Epoch, int]] = []
        planned: set[str] = set()
        nbytes = 0
        seen = 0
        lead = 0
        failures = epoch.failures
        now = time.monotonic()
        walk = limit if limit is not None else epoch.window
        skipped = 0
        for position in epoch.upcoming():
            entry = epoch.entries[position]
            if entry.missing:  # an answer already: takes no room and no place in the window
                skipped += 1
                if skipped > MISSING_REACH:
                    break
                continue
            seen += 1
            if seen > walk:
                break
            if is_hot(hot, entry):
                lead += seen == lead + 1
                continue
            if failures and epoch.held(entry.key, now):
                continue  # backing off, or failed for the epoch
            if len(plan) >= slots:
                break
            if seen <= concede:
                continue
            nbytes += entry.size
            if nbytes > budget and plan:
                break
            if (epoch.bucket, entry.key) in self.inflight or entry.key in planned:
                continue
            planned.add(entry.key)
            plan.append((epoch, position))
        epoch.lead = lead
        self.planning += time.perf_counter() - started
        return plan

    def _fetch(self, plan: list[tuple[Epoch, int]], room: int) -> None:
        """Start fetching the readers' next objects, alone or in small runs
        (a reader is about to ask): each is released, and counted, as it lands."""
        hot = self._hot
        batch: list[tuple[Epoch, Entry]] = []
        alone: list[tuple[Epoch, int, Extent]] = []
        for owner, position in plan:
            entry = owner.entries[position]
            todo = [ext for ext in entry.extents if not hot.is_cached(ext.cache_name)]
            if self._mounts.get(owner.bucket) is not None:
                self._start(owner, entry, functools.partial(self._fetch_mounted, owner, entry, position, room))
            elif len(todo) == 1:
                alone.append((owner, position, todo[0]))
            else:
                batch.append((owner, entry))
        if alone:
            # An object whose extent no other of the window's sits next to is
            # fetched with one GET of its own, as a reader would fetch it (the
            # reader joins it); the others go in small runs.
            runs = plan_runs([ext for _, _, ext in alone], MUST_GAP, MUST_SPAN)
            lonely = {run.extents[0].place for run in runs if len(run.extents) == 1}
            for owner, position, ext in alone:
                entry = owner.entries[position]
                if ext.place in lonely:
                    self._start(owner, entry, functools.partial(self._warm, owner, position, ext))
                else:
                    batch.append((owner, entry))
        if batch:
            self._spawn_batch(batch, gap=MUST_GAP, span=MUST_SPAN, bulk=False)

    async def _bulk(self, epoch: Epoch, room: int) -> None:
        """Managed buckets: keep up to ``lookahead_bytes`` (at most
        EXTRA_LIMIT) of the epoch's objects past the window in flight, in
        read order, with their packed neighbours, up to the horizon the
        room allows: large runs, for bandwidth. Topped up as they land."""
        cap = min(epoch.lookahead_bytes, EXTRA_LIMIT)
        free = cap - epoch.bulk_bytes
        if free < min(BULK_SPAN, cap // 2):
            return
        horizon = epoch.horizon(room)
        reach = horizon - max(0, min(epoch.positions) + 1)
        if epoch.bulk_horizon >= 0 and horizon - epoch.bulk_horizon < max(epoch.readers, reach // 4):
            return  # nothing was left before a horizon that has hardly moved since: O(horizon) to look again
        ahead = await pool.run(self.ahead, epoch, horizon, free)
        if epoch.state != "active":
            return
        ahead = [e for e in ahead if (epoch.bucket, e.key) not in self.inflight]  # started meanwhile
        if ahead:
            epoch.bulk_horizon = -1
            self._spawn_batch([(epoch, e) for e in ahead], gap=BULK_GAP, span=BULK_SPAN, bulk=True)
        else:
            epoch.bulk_horizon = horizon

    def ahead(self, epoch: Epoch, horizon: int, budget: int) -> list[Entry]:
        """Upcoming objects past the window that are neither hot nor in
        flight, in read order, each with its packed neighbours (one ranged
        GET brings them along), before ``horizon``, up to ``budget`` bytes.
        O(horizon): called in the pool."""
        hot = self._hot
        inflight = self.inflight
        entries = epoch.entries
        failures = epoch.failures
        now = time.monotonic()

        def wanted(entry: Entry) -> bool:
            return (bool(entry.extents) and (epoch.bucket, entry.key) not in inflight and not is_hot(hot, entry)
                    and not (failures and epoch.held(entry.key, now)))

        upcoming = epoch.upcoming()
        window = set(itertools.islice(upcoming, epoch.window))
        chosen: dict[int, Entry] = {}
        nbytes = 0
        for position in upcoming:
            if position >= horizon + epoch.readers:  # every reader's cursor is past it
                break
            if position >= horizon or position in chosen or not wanted(entries[position]):
                continue
            chosen[position] = entries[position]
            nbytes += entries[position].size
            for near in epoch.neighbours(entries[position].extents, NEIGHBOUR_REACH):
                entry = entries[near]
                if (near < horizon and near not in chosen and near not in window
                        and near not in epoch.consumed and wanted(entry)):
                    chosen[near] = entry
                    nbytes += entry.size
            if nbytes >= budget:
                break
        return list({e.key: e for e in chosen.values()}.values())  # a key listed twice is fetched once

    def _start(self, owner: Epoch, entry: Entry, work: Callable[[], Awaitable[bool]]) -> None:
        """Fetch one of the window's objects in the background (``work``
        says whether it landed)."""
        key = (owner.bucket, entry.key)
        self.inflight.add(key)
        owner.in_flight += 1
        owner.one_by_one += 1

        async def run() -> None:
            landed = False
            began = time.monotonic()
            try:
                landed = await work()
                if landed:
                    now = time.monotonic()
                    owner.count_fetch(now - began, now)
            except (NoSuchKey, AccessDenied, SourceDenied) as exc:
                log.debug("prefetch of %s: missing: %s", entry.key, exc)
                owner.mark_missing(entry.key)
            except (ServiceUnavailable, CapacityError) as exc:
                self._failed(owner, entry.key, exc)
            except Exception as exc:  # noqa: BLE001
                log.exception("prefetch of %s failed", entry.key)
                self._failed(owner, entry.key, exc)
            finally:
                self._release(owner, entry, landed, one_by_one=True)

        self._keep(asyncio.create_task(run()))

    def _failed(self, owner: Epoch, key: str, exc: BaseException) -> None:
        """A prefetch of ``key`` failed: retried later, a bounded number of
        times. When the store pushed back, the epoch's depth is halved."""
        if pushback(exc) and owner.count_pushback(time.monotonic()):
            log.debug("prefetch of epoch %s: the store pushed back (%s): at most %d in flight",
                      owner.id, exc, int(owner.ceiling))
        if owner.count_failure(key, time.monotonic()):
            log.warning("prefetch of %s/%s failed %d times, given up for epoch %s: %s",
                        owner.bucket, key, owner.failures[key][0], owner.id, exc)
        else:
            log.debug("prefetch of %s/%s failed, to be retried: %s", owner.bucket, key, exc)

    def _release(self, owner: Epoch, entry: Entry, landed: bool, one_by_one: bool = False, bulk: int = 0) -> None:
        """An object's prefetch ended: no longer in flight; counted when it landed."""
        self.inflight.discard((owner.bucket, entry.key))
        owner.in_flight -= 1
        owner.one_by_one -= one_by_one
        owner.bulk_bytes -= bulk
        if landed:
            owner.prefetched_objects += 1
            owner.prefetched_bytes += entry.size
            owner.count_landed()
        self._wake()

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _warm(self, owner: Epoch, position: int, ext: Extent) -> bool:
        if position in owner.consumed:
            return False  # a reader got there first and fetches it itself
        return await self._reader.warm(ext)

    def _spawn_batch(self, entries: list[tuple[Epoch, Entry]], gap: int, span: int, bulk: bool) -> None:
        """Fetch ``entries`` in the background with ``fetch_many`` (batches
        started earlier take the GET slots first). Each object is released,
        and counted as prefetched, when its last extent is cached: a batch
        can take a while, and the prefetcher plans on while it runs."""
        hot = self._hot
        waiting: dict[str, list[int]] = {}  # cache name -> the entries (indices) it completes
        left: dict[int, int] = {}  # index -> its extents not cached yet
        extents: list[Extent] = []
        for i, (_, entry) in enumerate(entries):
            todo = [ext for ext in entry.extents if not hot.is_cached(ext.cache_name)]
            if not todo:
                continue
            left[i] = len(todo)
            for ext in todo:
                waiting.setdefault(ext.cache_name, []).append(i)
            extents += todo
        if not extents:
            return
        sizes = {i: entries[i][1].size if bulk else 0 for i in left}
        for i in left:
            owner, entry = entries[i]
            self.inflight.add((owner.bucket, entry.key))
            owner.in_flight += 1
            owner.one_by_one += not bulk
            owner.bulk_bytes += sizes[i]

        def release(i: int, landed: bool) -> None:
            if left.pop(i, None) is not None:
                owner, entry = entries[i]
                self._release(owner, entry, landed, one_by_one=not bulk, bulk=sizes[i])

        def filled(ext: Extent) -> None:
            for i in waiting.pop(ext.cache_name, ()):
                if i in left:
                    left[i] -= 1
                    if left[i] == 0:
                        release(i, True)

        reader = self._reader

        def failed(exc: BaseException) -> None:
            """The batch failed: its objects not hot now count a failed attempt."""
            for i in list(left):
                owner, entry = entries[i]
                if not is_hot(hot, entry):
                    self._failed(owner, entry.key, exc)

        async def run() -> None:
            try:
                report = await reader.fetch_many(extents, gap=gap, span=span, on_filled=filled)
                if report.error is not None:  # the readers will fetch (and report) them themselves
                    log.warning("prefetch: %d extents not fetched: %s", report.errors, report.error)
                    failed(report.error)
            except Exception as exc:  # noqa: BLE001
                log.exception("prefetch of %d objects failed", len(left))
                failed(exc)
            finally:
                for i in list(left):  # cached by someone else, failed, or cancelled
                    release(i, False)

        self._keep(asyncio.create_task(run()))

    async def _fetch_mounted(self, epoch: Epoch, entry: Entry, position: int, room: int) -> bool:
        if position in epoch.consumed:
            return False  # a reader got there first: a second GET of it would only cost the source
        outcome = await self._mounts.warm(epoch.bucket, entry.key, room)
        entry.elsewhere = outcome.elsewhere  # fetched ahead once, by its owner: not planned again
        if not entry.resolved or not entry.names:
            await self._named(epoch, entry)
        return outcome.hot


def is_hot(hot: HotTier, entry: Entry) -> bool:
    """Every byte of the object in the hot tier, or in the hot tier of the
    node that owns it (a managed object with no extents is staged: hot too;
    a mounted one not resolved yet is not)."""
    if entry.elsewhere:
        return True
    if not entry.resolved or entry.missing:
        return False
    names = entry.names
    if len(names) == 1:  # most objects: no generator (the window walks thousands of them a round)
        return hot.is_cached(names[0])
    return all(hot.is_cached(n) for n in names)


def pushback(exc: BaseException | None) -> bool:
    """Whether a failed fetch is the store asking for fewer requests (a 503
    SlowDown, a 429, a throttling code) or the hot tier asking for less data
    (SlowDown): anywhere in the chain of causes, since a mount answers any
    source failure with its own 503 raised over the store's error."""
    for _ in range(8):  # a chain is short; a loop of causes must not hang
        if exc is None:
            return False
        if isinstance(exc, SlowDown):
            return True
        if isinstance(exc, CapacityError) and (
            exc.detail.get("code") in PUSHBACK_CODES or exc.detail.get("status") in PUSHBACK_STATUS
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
