"""Epoch hints: the order a trainer will read a data set in, used to have
each object hot before it is asked for and to evict by the known future.

A trainer registers an epoch: a bucket and its keys in the order they will
be read, split over ``readers`` that each read an interleaved share (reader
``r`` reads positions ``r, r + N, r + 2N, ...``: what a DataLoader's workers
or a job's ranks do with a shared sampler; workers that take the next key of
one shared queue read the order roughly so, which serves as well). The
gateway follows each reader's position from its GETs and keeps the next
objects of every reader in flight, within a lookahead window of objects and
bytes that grows with the observed read rate, more of them at once than the
readers fetch, so that it gets ahead of them; on a managed bucket, bulk runs
of packed objects go on past the window. Each object counts as prefetched,
and leaves the in-flight set, when it lands. Epochs registered for a bucket
while one runs are queued behind it, so the end of an epoch already warms
the start of the next.

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

This module keeps the epochs, their readers' positions and the eviction
advice, and runs the prefetch rounds; what each round fetches, and the
fetches themselves, are ``tiering.prefetch.prefetcher``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable

from tiering import pool
from tiering.errors import InvalidArgument, NoSuchBucket
from tiering.hot.tier import HotTier
from tiering.index.db import Index
from tiering.meta import BucketInfo, ObjectMeta
from tiering.mounts.buckets import Mounts
from tiering.prefetch.epoch import Entry, Epoch, future_of
from tiering.prefetch.prefetcher import Prefetcher, is_hot
from tiering.reads.fetch import ExtentReader
from tiering.settings import TierSettings

# Keys one epoch may name: the bound the admin API and the client's pattern
# expansion hold too (gateway/client/order.py; tests/unit/gateway/test_order.py ties them).
MAX_KEYS = 10_000_000

log = logging.getLogger("tierstore.epochs")

KEEP_FINISHED = 50  # finished epochs kept for GET /epochs/{id}
_RESOLVE_BATCH = 2048
INLINE_REPLAN = 100_000  # positions recomputed on the event loop (a few ms); more go to the pool
# A round walks the window (up to lookahead_objects positions, about 0.4 us
# each): one per read took 40 % of the event loop with 16 readers at about
# 800 reads a second and a window of 2,000; one per 5 ms at most, little.
ROUND_GAP = 0.005
# And a round's walks take at most one part in ROUND_SHARE of the loop: on a
# mount whose prefetch keeps ahead, a round walks hundreds of hot positions
# to find the few to fetch, and rounds every 5 ms added a quarter to the
# gateway's CPU per object of a hinted epoch (docs/prefetch.md).
ROUND_SHARE = 20


class Epochs:
    """Registered epochs of one node: queued and active in turn per bucket,
    their readers' positions (from ``observe``), the eviction advice they
    give the hot tier (``wanted`` / ``furthest``), and the loop that runs
    the prefetcher's rounds (``tiering.prefetch.prefetcher.Prefetcher``, which it
    holds)."""

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
        self._find_bucket = find_bucket
        self._epochs: dict[str, Epoch] = {}
        self._lock = threading.Lock()  # guards _future: the hot tier reads it from pool threads
        self._future: dict[str, float] = {}  # cache name -> when it is next needed (smaller: sooner)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stale = False  # the future needs recomputing (see _replan)
        # GETs of a bucket with an active epoch of keys it does not name, over
        # all epochs (tierstore_epoch_unmatched_reads_total)
        self.unmatched_reads = 0
        self._prefetch = Prefetcher(
            hot, mounts, reader, settings.fetch_concurrency, wake=self._wake.set, named=self._named
        )

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Advise the hot tier; the prefetcher starts with the first epoch."""
        self._hot.advisor = self

    async def stop(self) -> None:
        self._hot.advisor = None
        if self._task is not None:
            self._task.cancel()  # first: a round could start fetches the prefetcher's stop would miss
            await asyncio.gather(self._task, return_exceptions=True)
        await self._prefetch.stop()

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
        epoch.lead = 0
        following = self._following(epoch.bucket)
        if following is not None:
            self._activate(following)
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

    def watching(self, bucket: str) -> bool:
        """Whether an active epoch reads ``bucket`` (its GETs move readers)."""
        return any(e.state == "active" and e.bucket == bucket for e in self._epochs.values())

    def observe(self, bucket: str, key: str) -> None:
        """A GET of ``bucket/key`` began: move its reader's position, count a
        hit if the object was all in the hot tier. A read of a key the
        active epoch does not name is counted (``unmatched_reads``, the
        epoch's warning): every GET comes here, so that is an add and a
        dict lookup, nothing more."""
        for epoch in self._epochs.values():
            if epoch.state != "active" or epoch.bucket != bucket:
                continue
            epoch.bucket_reads += 1
            position = epoch.position_of(key)
            if position is None:
                if not epoch.names(key):  # else a re-read of a consumed key: in the order
                    epoch.unmatched_reads += 1
                    self.unmatched_reads += 1
                    if epoch.unmatched_key is None:
                        epoch.unmatched_key = key
                continue
            entry = epoch.entries[position]
            if is_hot(self._hot, entry):
                epoch.hits += 1
            elif (bucket, key) in self._prefetch.inflight:
                epoch.late += 1  # the reader joins the prefetch's GET (a mount's source sees two)
            else:
                epoch.misses += 1
            reader = position % epoch.readers
            if position < epoch.positions[reader] - epoch.readers * epoch.window:
                epoch.positions[reader] = position  # far behind: the reader restarted
            else:
                epoch.positions[reader] = max(epoch.positions[reader], position)
            epoch.consumed.add(position)
            epoch.last_read = now = time.monotonic()
            epoch.count_read(now)
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
        once; beyond, the next prefetch round does it in the pool (the
        advice is a round late, never wrong about what is read)."""
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

    def _following(self, bucket: str) -> Epoch | None:
        """The epoch of ``bucket`` queued next: the first registered."""
        following = [e for e in self._epochs.values() if e.bucket == bucket and e.state == "queued"]
        return min(following, key=lambda e: e.created) if following else None

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

    # -- prefetch rounds (what they fetch: tiering.prefetch.prefetcher) ---------------------

    async def _run(self) -> None:
        last = 0.0
        gap = ROUND_GAP
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):  # not wait_for: see Flusher.run
                    await self._wake.wait()
            if (wait := last + gap - time.monotonic()) > 0:
                await asyncio.sleep(wait)  # the reads and landings of the gap make one round
            self._wake.clear()
            last = time.monotonic()
            planning = self._prefetch.planning
            try:
                await self._round()
                gap = max(ROUND_GAP, ROUND_SHARE * (self._prefetch.planning - planning))
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
        room = max(0, self._hot.high - self._hot.fixed)
        for epoch in [e for e in self._epochs.values() if e.state == "active"]:
            await self._prefetch.round(epoch, self._following(epoch.bucket), room)

    async def _named(self, epoch: Epoch, entry: Entry) -> None:
        """The prefetcher fetched a mounted object before it was known: look
        its cache files up, and add them to the future at its position.
        On the loop when the record cache holds its record (the fetch that
        just described it put it there: a trip to the pool for each
        prefetched object cost more than the lookup), else in the pool."""
        if self._index.cached_mounted(epoch.bucket, entry.key) is not None:
            _resolve_mounted(self._index, self._mounts, epoch.bucket, [entry])
        else:
            await pool.run(_resolve_mounted, self._index, self._mounts, epoch.bucket, [entry])
        now = epoch.position_of(entry.key)
        if now is not None:
            when = float(self._offset(epoch) + now)
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
