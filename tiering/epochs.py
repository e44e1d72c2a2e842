"""Epoch hints: the order a trainer will read a data set in, used to have
each object hot before it is asked for and to evict by the known future.

A trainer registers an epoch: a bucket and its keys in the order they will
be read, split over ``readers`` that each read an interleaved share (reader
``r`` reads positions ``r, r + N, r + 2N, ...``: what a DataLoader's workers
or a job's ranks do with a shared sampler). The gateway follows each
reader's position from its GETs and keeps the next objects of every reader
in flight, within a lookahead window of objects and bytes that grows with
the observed read rate. Epochs registered for a bucket while one runs are
queued behind it, so the end of an epoch already warms the start of the next.

Eviction follows the future: the hot tier asks ``wanted`` (is a cache file
in some registered future?) and ``furthest`` (the wanted ones, the one
needed furthest in the future first). Files no epoch wants go first, which
includes what this epoch has consumed and no later epoch needs; then the
furthest-needed: Belady's choice, which a recency or frequency policy cannot
make when every epoch is a new random order.

Readers that skip keys, read out of order, restart from the start, or stop
reading cannot wedge it: positions only move by what is observed, a read far
behind a reader's position is a restart, and an epoch nobody has read from
for ``idle_timeout`` seconds is abandoned (its hints dropped). A finished,
ended or abandoned epoch stops asking for anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable

from tiering import pool
from tiering.epoch_order import Entry, Epoch, future_of
from tiering.errors import InvalidArgument, NoSuchBucket, NoSuchKey, ServiceUnavailable
from tiering.fetch import ExtentReader
from tiering.hot import HotTier
from tiering.index import Index
from tiering.meta import BucketInfo, ObjectMeta
from tiering.mounts.buckets import Mounts
from tiering.order import MAX_KEYS
from tiering.settings import TierSettings

log = logging.getLogger("tierstore.epochs")

KEEP_FINISHED = 50  # finished epochs kept for GET /epochs/{id}
_RESOLVE_BATCH = 2048
INLINE_REPLAN = 100_000  # positions recomputed on the event loop (a few ms); more go to the pool
NEIGHBOUR_REACH = 4 * 1024 * 1024  # bytes either side of a needed extent fetched along with it
EXTRA_LIMIT = 256 * 1024 * 1024  # bytes of neighbours one prefetch round adds
MUST_GAP = 256 * 1024  # runs of the readers' next objects: small, to land within a round trip
MUST_SPAN = 4 * 1024 * 1024
BULK_GAP = 1024 * 1024  # runs of packed neighbours: large, bandwidth over latency
BULK_SPAN = 32 * 1024 * 1024


class Epochs:
    """Registered epochs of one node, their prefetcher, and the eviction
    advice they give the hot tier (``wanted`` / ``furthest``)."""

    def __init__(
        self,
        index: Index,
        hot: HotTier,
        mounts: Mounts,
        reader: ExtentReader,
        settings: TierSettings,
        find_bucket: Callable[[str], BucketInfo | None],
    ) -> None:
        self._index = index
        self._hot = hot
        self._mounts = mounts
        self._reader = reader
        self._find_bucket = find_bucket
        self._epochs: dict[str, Epoch] = {}
        self._lock = threading.Lock()  # guards _future: the hot tier reads it from pool threads
        self._future: dict[str, float] = {}  # cache name -> when it is next needed (smaller: sooner)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[str] = set()  # keys being prefetched
        self._gate = asyncio.Semaphore(max(2, settings.fetch_concurrency))
        self._tasks: set[asyncio.Task[None]] = set()
        self._stale = False  # the future needs recomputing (see _replan)
        self._ahead_done: set[str] = set()  # epochs with nothing left to fetch past their window

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Advise the hot tier; the prefetcher starts with the first epoch."""
        self._hot.advisor = self

    async def stop(self) -> None:
        self._hot.advisor = None
        tasks = [t for t in [self._task, *self._tasks] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- registration ----------------------------------------------------------

    async def register(
        self,
        bucket: str,
        keys: list[str],
        readers: int = 1,
        lookahead_bytes: int = 256 * 1024 * 1024,
        lookahead_objects: int = 4096,
        idle_timeout: float = 600.0,
    ) -> Epoch:
        """Register an epoch (queued behind a live one of the same bucket)."""
        if self._find_bucket(bucket) is None:
            raise NoSuchBucket(BucketName=bucket)
        if not keys:
            raise InvalidArgument("An epoch needs at least one key")
        if len(keys) > MAX_KEYS:
            raise InvalidArgument(f"An epoch names at most {MAX_KEYS} keys")
        epoch = await pool.run(
            lambda: Epoch(
                id=f"e{secrets.token_hex(6)}", bucket=bucket, entries=[Entry(k) for k in keys], readers=readers,
                lookahead_bytes=lookahead_bytes, lookahead_objects=lookahead_objects, idle_timeout=idle_timeout,
            )
        )
        await self._resolve(epoch, range(len(keys)))
        await pool.run(epoch.index_layout)  # O(keys): off the event loop, as the rest of the set-up
        return self.adopt(epoch)

    def adopt(self, epoch: Epoch) -> Epoch:
        """Take a resolved epoch: active at once, or queued behind the live
        one of its bucket."""
        if not epoch.laid_out:
            epoch.index_layout()
        self._epochs[epoch.id] = epoch
        if not any(e.live and e.bucket == epoch.bucket and e is not epoch for e in self._epochs.values()):
            self._activate(epoch)
        self._trim()
        self._replan()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        self._wake.set()
        return epoch

    async def keys_under(self, bucket: str, prefix: str) -> list[str]:
        """Every key under ``prefix``, in key order (a mount asks its source)."""
        if self._mounts.get(bucket) is None:
            return await pool.run(_managed_keys, self._index, bucket, prefix)
        keys: list[str] = []
        marker = ""
        while True:
            page = await self._mounts.list_objects(bucket, prefix, "", marker, 1000)
            keys += [e.key for e in page.contents]
            if len(keys) > MAX_KEYS:
                raise InvalidArgument(f"An epoch names at most {MAX_KEYS} keys")
            if not page.truncated or page.last is None:
                return keys
            marker = page.last

    def get(self, epoch_id: str) -> Epoch | None:
        return self._epochs.get(epoch_id)

    def all(self) -> list[Epoch]:
        return sorted(self._epochs.values(), key=lambda e: e.created, reverse=True)

    def end(self, epoch_id: str) -> Epoch | None:
        epoch = self._epochs.get(epoch_id)
        if epoch is not None and epoch.live:
            self._close(epoch, "ended")
        return epoch

    def _activate(self, epoch: Epoch) -> None:
        epoch.state = "active"
        epoch.started = time.time()
        epoch.last_read = time.monotonic()

    def _close(self, epoch: Epoch, state: str) -> None:
        epoch.state = state
        epoch.finished = time.time()
        self._ahead_done.discard(epoch.id)
        following = [e for e in self._epochs.values() if e.bucket == epoch.bucket and e.state == "queued"]
        if following:
            self._activate(min(following, key=lambda e: e.created))
        self._replan()

    def _trim(self) -> None:
        done = [e for e in self._epochs.values() if not e.live]
        for epoch in sorted(done, key=lambda e: e.created)[:-KEEP_FINISHED or None]:
            del self._epochs[epoch.id]

    async def _resolve(self, epoch: Epoch, positions: Iterable[int]) -> None:
        """Look the entries up: their size and cache files (and extents)."""
        mounted = self._mounts.get(epoch.bucket) is not None
        todo = list(positions)
        for i in range(0, len(todo), _RESOLVE_BATCH):
            batch = [epoch.entries[p] for p in todo[i:i + _RESOLVE_BATCH]]
            if mounted:
                await pool.run(_resolve_mounted, self._index, self._mounts, epoch.bucket, batch)
            else:
                await pool.run(_resolve_managed, self._index, epoch.bucket, batch)

    # -- reads -------------------------------------------------------------------

    def observe(self, bucket: str, key: str) -> None:
        """A GET of ``bucket/key`` began: move its reader's position, count a
        hit if the object was all in the hot tier."""
        for epoch in self._epochs.values():
            if epoch.state != "active" or epoch.bucket != bucket:
                continue
            position = epoch.position_of(key)
            if position is None:
                continue
            entry = epoch.entries[position]
            hot = self._hot
            if entry.resolved and not entry.missing and all(hot.is_cached(n) for n in entry.names):
                epoch.hits += 1
            else:
                epoch.misses += 1
            reader = position % epoch.readers
            if position < epoch.positions[reader] - epoch.readers * epoch.window:
                epoch.positions[reader] = position  # far behind: the reader restarted
            else:
                epoch.positions[reader] = max(epoch.positions[reader], position)
            epoch.consumed.add(position)
            self._ahead_done.discard(epoch.id)  # the horizon moved
            now = time.monotonic()
            elapsed = max(now - epoch._rate_at, 1e-3)
            epoch._rate = 0.9 * epoch._rate + 0.1 * (1.0 / elapsed)
            epoch._rate_at = epoch.last_read = now
            if len(epoch.consumed) == len(epoch.entries):
                self._close(epoch, "finished")
            else:
                self._forget_consumed(epoch, entry)
            self._wake.set()
            return

    # -- eviction advice (called by the hot tier, from pool threads) -------------

    def wanted(self, name: str) -> bool:
        return name in self._future

    def furthest(self) -> Iterable[str]:
        with self._lock:
            items = list(self._future.items())  # a copy under the lock, sorted outside it
        items.sort(key=lambda item: item[1], reverse=True)
        return (name for name, _ in items)

    def _replan(self) -> None:
        """Recompute when each cache file is next needed (after an epoch
        starts or ends). Up to ``INLINE_REPLAN`` positions this is done at
        once; beyond, the prefetcher does it in the pool at its next round
        (the advice is a round late, never wrong about what is read)."""
        chains = self._chains()
        if sum(len(e.entries) for chain in chains for e in chain) <= INLINE_REPLAN:
            self._set_future(future_of([[(e.entries, e.consumed) for e in chain] for chain in chains]))
        else:
            self._stale = True
            self._wake.set()

    async def _replan_in_pool(self) -> None:
        self._stale = False
        snapshot = [[(e.entries, frozenset(e.consumed)) for e in chain] for chain in self._chains()]
        self._set_future(await pool.run(future_of, snapshot))

    def _chain(self, bucket: str) -> list[Epoch]:
        """The live epochs of ``bucket``: the active one, then the queued in order."""
        live = (e for e in self._epochs.values() if e.live and e.bucket == bucket)
        return sorted(live, key=lambda e: (e.state != "active", e.created))

    def _chains(self) -> list[list[Epoch]]:
        return [self._chain(bucket) for bucket in {e.bucket for e in self._epochs.values() if e.live}]

    def _next_use(self, bucket: str, key: str) -> float | None:
        """When ``key`` is next read over the bucket's chain (None: never)."""
        offset = 0
        for epoch in self._chain(bucket):
            position = epoch.position_of(key)
            if position is not None:
                return float(offset + position)
            offset += len(epoch.entries)
        return None

    def _set_future(self, future: dict[str, float]) -> None:
        with self._lock:
            self._future = future

    def _forget_consumed(self, epoch: Epoch, entry: Entry) -> None:
        """A consumed entry's files are next needed at their next position
        in a live epoch, if any; else nobody wants them."""
        when = self._next_use(epoch.bucket, entry.key)
        with self._lock:
            for name in entry.names:
                if when is None:
                    self._future.pop(name, None)
                else:
                    self._future[name] = when

    # -- the prefetcher ----------------------------------------------------------

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):  # not wait_for: see Flusher.run
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001  a bad round must not stop prefetching for good
                log.exception("prefetch round failed")

    async def _round(self) -> None:
        if self._stale:
            await self._replan_in_pool()
        now = time.monotonic()
        for epoch in list(self._epochs.values()):
            if epoch.live and now - epoch.last_read > epoch.idle_timeout:
                log.info("epoch %s abandoned: no read for %.0f s", epoch.id, epoch.idle_timeout)
                self._close(epoch, "abandoned")
        hot = self._hot
        room = max(0, hot.high - hot.fixed)
        for epoch in [e for e in self._epochs.values() if e.state == "active"]:
            self._adapt(epoch)
            plan, left = self._plan(epoch, min(epoch.lookahead_bytes, room // 2))
            following = [e for e in self._epochs.values() if e.state == "queued" and e.bucket == epoch.bucket]
            if left < epoch.window and following:  # the end of this epoch warms the start of the next
                nxt = min(following, key=lambda e: e.created)
                plan += self._plan(nxt, epoch.lookahead_bytes, epoch.window - left)[0]
            if plan:
                await self._fetch(epoch, plan, room)
            elif not self._tasks and epoch.id not in self._ahead_done and self._managed(epoch):
                # The window is hot and nothing is in flight: go on past it,
                # as far as the room allows, while the readers have not
                # caught up (else the bulk phase stopped at the window's
                # neighbours, wherever the first round's timing left it).
                ahead = await pool.run(self._ahead, epoch, room)
                if ahead:
                    self._spawn_batch(epoch, ahead, gap=BULK_GAP, span=BULK_SPAN)
                else:
                    self._ahead_done.add(epoch.id)  # until a read moves a reader

    def _managed(self, epoch: Epoch) -> bool:
        """A mounted bucket's epoch is prefetched object by object, within
        its window only: its source is not ours to read ahead of the job."""
        return self._mounts.get(epoch.bucket) is None

    def _ahead(self, epoch: Epoch, room: int) -> list[Entry]:
        """Upcoming objects past the window that are neither hot nor in
        flight, in read order, before the horizon the room allows and up to
        EXTRA_LIMIT bytes. O(horizon): called in the pool."""
        hot = self._hot
        horizon = epoch.horizon(room)
        ahead: list[Entry] = []
        nbytes = 0
        for position in itertools.islice(epoch.upcoming(), epoch.window, None):
            if position >= horizon + epoch.readers:  # every reader's cursor is past it
                break
            entry = epoch.entries[position]
            if position >= horizon or entry.missing or entry.key in self._inflight:
                continue
            if entry.resolved and entry.names and all(hot.is_cached(n) for n in entry.names):
                continue
            ahead.append(entry)
            nbytes += entry.size
            if nbytes > EXTRA_LIMIT:
                break
        return ahead

    def _adapt(self, epoch: Epoch) -> None:
        """Window in objects: enough to cover about two seconds of reads at
        the observed rate, at least 4 per reader, at most the epoch's cap."""
        want = int(epoch._rate * 2.0) + 4 * epoch.readers
        epoch.window = max(4 * epoch.readers, min(epoch.lookahead_objects, want))

    def _plan(self, epoch: Epoch, budget: int, limit: int | None = None) -> tuple[list[tuple[Epoch, int]], int]:
        """Upcoming positions within the window whose files are not hot, and
        how many upcoming positions the window held (fewer near the end)."""
        hot = self._hot
        plan: list[tuple[Epoch, int]] = []
        nbytes = 0
        seen = 0
        for position in itertools.islice(epoch.upcoming(), limit if limit is not None else epoch.window):
            seen += 1
            entry = epoch.entries[position]
            if entry.missing:
                continue
            nbytes += entry.size
            if nbytes > budget and plan:
                break
            if entry.key in self._inflight:
                continue
            if entry.resolved and entry.names and all(hot.is_cached(n) for n in entry.names):
                continue
            plan.append((epoch, position))
        return plan, seen

    async def _fetch(self, epoch: Epoch, plan: list[tuple[Epoch, int]], room: int) -> None:
        """Start fetches for ``plan`` (in the background, bounded)."""
        if self._mounts.get(epoch.bucket) is not None:
            for owner, position in plan:
                entry = owner.entries[position]
                self._spawn(entry.key, self._fetch_mounted(owner, entry, room))
            return
        # Managed: the readers' next objects first, in small runs of their
        # own (a reader is about to ask for them); then a bulk batch of the
        # epoch's other upcoming objects packed next to them (within the room
        # the hot tier has for this epoch), so a ranged GET brings a run of
        # them. The bulk batch queues behind the small one for GET slots.
        hot = self._hot
        must = [owner.entries[position] for owner, position in plan]
        self._spawn_batch(epoch, must, gap=MUST_GAP, span=MUST_SPAN)
        chosen = {(owner.id, position): owner for owner, position in plan}
        extra: list[Entry] = []
        extra_bytes = 0
        for owner in {owner.id: owner for owner, _ in plan}.values():
            horizon = owner.horizon(room)
            mine = [ext for o, position in plan if o is owner for ext in o.entries[position].extents]
            for near in owner.neighbours(mine, NEIGHBOUR_REACH):
                if extra_bytes > EXTRA_LIMIT:
                    break
                entry = owner.entries[near]
                if ((owner.id, near) in chosen or near in owner.consumed or near >= horizon
                        or entry.key in self._inflight or all(hot.is_cached(n) for n in entry.names)):
                    continue
                chosen[(owner.id, near)] = owner
                extra.append(entry)
                extra_bytes += entry.size
        if extra:
            self._spawn_batch(epoch, extra, gap=BULK_GAP, span=BULK_SPAN)

    def _spawn(self, key: str, work: object) -> None:
        self._inflight.add(key)

        async def run() -> None:
            try:
                async with self._gate:
                    await work  # type: ignore[misc]
            except (NoSuchKey, ServiceUnavailable) as exc:
                log.debug("prefetch of %s skipped: %s", key, exc)
            except Exception:  # noqa: BLE001
                log.exception("prefetch of %s failed", key)
            finally:
                self._inflight.discard(key)
                self._wake.set()

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _spawn_batch(self, epoch: Epoch, entries: list[Entry], gap: int, span: int) -> None:
        """Fetch ``entries`` in the background with ``fetch_many``; batches
        started earlier take the GET slots first."""
        hot = self._hot
        extents = [ext for entry in entries for ext in entry.extents if not hot.is_cached(ext.cache_name)]
        if not extents:
            return
        keys = [entry.key for entry in entries]
        self._inflight.update(keys)
        reader = self._reader

        async def run() -> None:
            try:
                async with self._gate:
                    report = await reader.fetch_many(extents, gap=gap, span=span)
                epoch.prefetched_objects += len(keys) - report.errors
                epoch.prefetched_bytes += report.bytes
                if report.error is not None:  # the readers will fetch (and report) them themselves
                    log.warning("prefetch for epoch %s: %d extents not fetched: %s",
                                epoch.id, report.errors, report.error)
            except Exception:  # noqa: BLE001
                log.exception("prefetch of %d objects failed", len(keys))
            finally:
                self._inflight.difference_update(keys)
                self._wake.set()

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fetch_mounted(self, epoch: Epoch, entry: Entry, room: int) -> None:
        outcome = await self._mounts.warm(epoch.bucket, entry.key, room)
        epoch.prefetched_objects += 1
        epoch.prefetched_bytes += outcome.size
        if not entry.resolved or not entry.names:
            await pool.run(_resolve_mounted, self._index, self._mounts, epoch.bucket, [entry])
            position = epoch.position_of(entry.key)
            if position is not None:
                when = float(self._offset(epoch) + position)
                with self._lock:
                    for name in entry.names:
                        self._future[name] = min(when, self._future.get(name, when))

    def _offset(self, epoch: Epoch) -> int:
        """Positions of the live epochs of its bucket read before it."""
        offset = 0
        for other in self._chain(epoch.bucket):
            if other is epoch:
                return offset
            offset += len(other.entries)
        return offset


def _managed_keys(index: Index, bucket: str, prefix: str) -> list[str]:
    keys = []
    for meta in index.iter_objects(bucket, prefix):
        keys.append(meta.key)
        if len(keys) > MAX_KEYS:
            raise InvalidArgument(f"An epoch names at most {MAX_KEYS} keys")
    return keys


def _resolve_managed(index: Index, bucket: str, entries: list[Entry]) -> None:
    for entry in entries:
        meta = index.get_object(bucket, entry.key)
        _describe(entry, meta)


def _describe(entry: Entry, meta: ObjectMeta | None) -> None:
    entry.resolved = True
    if meta is None:
        entry.missing = True
        return
    entry.size = meta.size
    extents = tuple(c.extent for c in meta.chunks if c.file_id is None and c.extent is not None)
    entry.extents = extents
    entry.names = tuple(e.cache_name for e in extents)


def _resolve_mounted(index: Index, mounts: Mounts, bucket: str, entries: list[Entry]) -> None:
    for entry in entries:
        known = index.get_mounted(bucket, entry.key)
        if known is None:
            continue  # named once the prefetcher (or a read) has asked the source
        entry.resolved = True
        entry.size = known.size
        entry.names = tuple(mounts.piece_names(bucket, known))
