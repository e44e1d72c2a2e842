"""Warm jobs: bring a data set into the hot tier before it is read.

The set is a prefix, a list of keys, or a manifest object in the bucket (one
key per line, blank lines and ``#`` comments skipped). Keys and manifest
lines are keys, taken literally; the admin API expands them first only when
asked (``patterns``: WebDataset-style shard patterns such as
``train-{0000..0099}.tar``; ``urls``: ``s3://bucket/key`` of the same
bucket; see ``gateway.client.order.expand_all``).

A key that does not exist, or that a mount's source refuses to let be read
(403), is counted once as missing (``missing``, the first ``missing_keys``)
and the job goes on.

Managed buckets are warmed in batches of packed objects: ``fetch_many``
brings a run of neighbouring extents of a segment in one ranged GET, so a
data set of small objects costs a few large reads, not one per object.
Mounted buckets are warmed object by object (one ranged GET for a small one,
its pieces for a large one), ``concurrency`` at a time.

A set larger than the hot tier is warmed as far as it fits: the room is the
high watermark less what eviction cannot free (staged, reserved, pinned);
what is already hot counts against it, and the rest is reported left out
rather than fetched only to evict the start of the set again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from packer.ranges import ByteRange
from tiering import pool
from tiering.cluster.peers import HOT, PeerClient, PeerRefused
from tiering.errors import AccessDenied, InvalidArgument, NoSuchKey, SourceDenied
from tiering.hot.tier import HotTier
from tiering.index.db import Index
from tiering.jobs import Job
from tiering.meta import BucketInfo, Extent, ObjectMeta
from tiering.mounts.buckets import Mounts
from tiering.prefetch.spread import PeerItem, Spread
from tiering.reads.fetch import ExtentReader
from tiering.settings import TierSettings

log = logging.getLogger("tierstore.warm")

MANIFEST_LIMIT = 64 * 1024 * 1024  # bytes of a manifest object read
BATCH = 256  # objects looked up and fetched per step
_SHOWN = 10  # missing keys named in the report


@dataclass(slots=True)
class WarmReport:
    objects: int = 0  # objects of the set found
    bytes: int = 0
    hot_objects: int = 0  # hot when the job ended (already, or fetched)
    hot_bytes: int = 0
    fetched_bytes: int = 0  # transferred from the capacity store or source
    requests: int = 0  # GETs made
    missing: int = 0  # keys named that do not exist
    missing_keys: list[str] = field(default_factory=list)
    left_out_objects: int = 0  # did not fit in the hot tier
    left_out_bytes: int = 0
    room_bytes: int = 0  # what the hot tier could give the set when the job started
    errors: int = 0  # extents the store failed to return (after retries), not cached
    # Cooperative warm (tiering/cluster/peers.py): extents other gateways sent, the
    # GETs that asked them, and extents fetched from the store after all.
    peer_extents: int = 0
    peer_bytes: int = 0
    peer_requests: int = 0
    peer_fallbacks: int = 0
    # A warm spread over the cluster (spread.py): extents their owners brought in.
    owner_extents: int = 0
    note: str = ""


class RateLimit:
    """A byte budget per second (token bucket allowed to run into debt:
    a transfer is never split, the next one waits for the debt to clear)."""

    def __init__(self, bytes_per_second: float | None) -> None:
        self._rate = bytes_per_second
        self._start = time.monotonic()
        self._spent = 0

    async def take(self, nbytes: int) -> None:
        if not self._rate:
            return
        self._spent += nbytes
        ahead = self._spent / self._rate - (time.monotonic() - self._start)
        if ahead > 0:
            await asyncio.sleep(ahead)


class Objects(Protocol):
    """What a warm job asks of the object service: the bucket must exist, and
    a manifest is an object read whole (``tiering.objects.ObjectService``)."""

    async def bucket(self, name: str) -> BucketInfo: ...

    async def head(self, bucket: str, key: str, version: str | None = None) -> ObjectMeta: ...

    def stream(self, meta: ObjectMeta, wanted: ByteRange) -> AsyncIterator[bytes]: ...


class Warmer:
    def __init__(
        self,
        objects: Objects,
        index: Index,
        hot: HotTier,
        mounts: Mounts,
        reader: ExtentReader,
        settings: TierSettings,
        owners: PeerClient | None = None,
    ) -> None:
        self._objects = objects  # bucket checks and manifest reads
        # The cluster's nodes (fixed or the registry's live ones), whose
        # extents a ``spread`` warm asks their owners to bring in.
        self._owners = owners
        self._index = index
        self._hot = hot
        self._mounts = mounts
        self._reader = reader
        self._settings = settings

    async def warm(
        self,
        bucket: str,
        *,
        prefix: str | None = None,
        keys: list[str] | None = None,
        concurrency: int = 4,
        bandwidth: float | None = None,
        job: Job | None = None,
        peers: PeerClient | None = None,
        peer_wait: float = 30.0,
        spread: bool = False,
    ) -> WarmReport:
        """Warm one set: every object under ``prefix``, or ``keys`` (as
        given: ``expand_all`` turns patterns and manifest lines into keys).

        With ``peers`` (a managed bucket), the set is warmed together with
        the other gateways of the group, each running the same job: this
        node fetches from the store only the segments it owns and, at the
        same time, asks each other node for the extents of its segments,
        from that node's hot tier. A node that has not got them yet is asked again, and
        after ``peer_wait`` seconds without a byte from it (or at once if
        it refuses or cannot be reached) the store is read instead.

        With ``spread`` (and this node in a cluster), the set is warmed into
        the cluster's one cache from this node alone: each extent by the
        node that owns it (``spread.py``), this node keeping its own share."""
        await self._objects.bucket(bucket)
        if (prefix is None) == (keys is None):
            raise InvalidArgument("Give exactly one of prefix or keys")
        hot = self._hot
        report = WarmReport(room_bytes=max(0, hot.high - hot.fixed))
        limit = RateLimit(bandwidth)
        mounted = self._mounts.get(bucket) is not None
        if job is not None and keys is not None:
            job.expect(len(keys), None)
        elif job is not None and not mounted:
            job.expect(*await pool.run(_count, self._index, bucket, prefix or ""))
        batches = self._batches(bucket, prefix, keys, mounted, report, job)
        if mounted:
            await self._warm_mounted(bucket, batches, report, concurrency, limit, job)  # type: ignore[arg-type]
        elif peers is None:
            placed = Spread(self._owners, hot, concurrency) if spread and self._owners is not None else None
            try:
                await self._warm_managed(batches, report, concurrency, limit, job,  # type: ignore[arg-type]
                                         spread=placed)
            finally:
                if placed is not None:
                    report.owner_extents += placed.asked
                    report.peer_requests += placed.requests
                    report.peer_fallbacks += placed.refused
        else:
            # Both at once: this node's share from the store, and the other
            # nodes' shares from them as they have them.
            theirs: list[PeerItem] = []
            listed = asyncio.Event()

            async def own_share() -> None:
                try:
                    await self._warm_managed(batches, report, concurrency, limit, job, peers, theirs)  # type: ignore[arg-type]
                finally:
                    listed.set()

            async with asyncio.TaskGroup() as group:
                group.create_task(own_share())
                group.create_task(self._from_peers(theirs, listed, report, peers, max(8, 2 * concurrency),
                                                   peer_wait, job))
        if report.left_out_objects:
            report.note = report.note and report.note + "; "
            report.note += (
                f"the set is larger than the hot tier can hold: {report.hot_bytes} of {report.bytes} bytes warmed, "
                f"{report.left_out_objects} objects ({report.left_out_bytes} bytes) left out"
            )
        return report

    async def manifest(self, bucket: str, key: str) -> list[str]:
        """The lines of a manifest object (NoSuchKey if there is none)."""
        meta = await self._objects.head(bucket, key)
        if meta.size > MANIFEST_LIMIT:
            raise InvalidArgument(f"The manifest {key} is larger than {MANIFEST_LIMIT} bytes")
        text = b"".join([block async for block in self._objects.stream(meta, ByteRange(0, meta.size))])
        lines = (line.strip() for line in text.decode("utf-8", errors="replace").splitlines())
        return [line for line in lines if line and not line.startswith("#")]

    async def _batches(
        self, bucket: str, prefix: str | None, keys: list[str] | None, mounted: bool, report: WarmReport,
        job: Job | None = None,
    ) -> AsyncIterator[list[ObjectMeta] | list[tuple[str, int | None]]]:
        """The set in batches: objects (managed) or (key, size if listed)
        pairs (mounted)."""
        if keys is not None:
            for i in range(0, len(keys), BATCH):
                chunk = keys[i:i + BATCH]
                if mounted:
                    yield [(key, None) for key in chunk]
                    continue
                found = await pool.run(_lookup, self._index, bucket, chunk)
                for key, meta in zip(chunk, found, strict=True):
                    if meta is None:
                        _missing(report, key, job)
                yield [m for m in found if m is not None]
            return
        marker: str | None = None
        while True:
            if mounted:
                page = await self._mounts.list_objects(bucket, prefix or "", "", marker or "", 1000)
                if page.contents:
                    yield [(e.key, e.size) for e in page.contents]
                if not page.truncated or page.last is None:
                    return
                marker = page.last
            else:
                metas = await pool.run(self._index.objects_page, bucket, prefix or "", marker, BATCH)
                if not metas:
                    return
                yield metas
                marker = metas[-1].key

    async def _warm_managed(
        self, batches: AsyncIterator[list[ObjectMeta]], report: WarmReport,
        concurrency: int, limit: RateLimit, job: Job | None,
        peers: PeerClient | None = None, theirs: list[PeerItem] | None = None, spread: Spread | None = None,
    ) -> None:
        """Batches of packed objects, each fetched with ``fetch_many`` (runs
        of neighbouring extents in one GET), ``concurrency`` batches at once.
        With ``peers``, only the extents of segments this node owns; the
        others are put in ``theirs`` (and their objects counted done there).
        With ``spread``, only the extents this node owns; their owners are
        asked for the others, which count against their hot tiers, not
        this one's."""
        reader = self._reader
        hot = self._hot
        gate = asyncio.Semaphore(max(1, concurrency))
        tasks: set[asyncio.Task[None]] = set()
        errors: list[str] = []

        async def fetch(extents: list[Extent], objects: int, nbytes: int, asked: list[PeerItem]) -> None:
            try:
                if asked and spread is not None:
                    extents = [*extents, *await spread.ask(asked)]  # owners that did not: from the store here
                outcome = await reader.fetch_many(extents)
                report.requests += outcome.requests
                report.fetched_bytes += outcome.bytes
                if outcome.errors:
                    report.errors += outcome.errors
                    errors.append(str(outcome.error))
                if job is not None:
                    job.advance(objects, nbytes)
            finally:
                gate.release()

        try:
            async for batch in batches:
                chosen: list[Extent] = []
                asked: list[PeerItem] = []  # (spread) extents their owners bring in
                later = later_bytes = 0  # objects with extents a peer sends: counted done there
                for meta in batch:
                    report.objects += 1
                    report.bytes += meta.size
                    # Staged chunks are hot already (the tier counts them as fixed).
                    wanted = [c.extent for c in meta.chunks if c.file_id is None and c.extent is not None]
                    elsewhere: list[PeerItem] = []
                    if spread is not None:
                        wanted, elsewhere = spread.split(meta)
                    size = sum(e.raw for e in wanted)
                    if report.left_out_objects or report.hot_bytes + size > report.room_bytes:
                        report.left_out_objects += 1  # in order: the set's start is what is warmed
                        report.left_out_bytes += meta.size
                        continue
                    report.hot_objects += 1
                    report.hot_bytes += size
                    asked += elsewhere
                    if peers is None or theirs is None:
                        chosen.extend(e for e in wanted if not hot.is_cached(e.cache_name))
                    elif _split(meta, peers, hot, chosen, theirs):
                        later += 1
                        later_bytes += meta.size
                nbytes = sum(m.size for m in batch) - later_bytes
                done = len(batch) - later
                if not chosen and not asked:
                    if job is not None:
                        job.advance(done, nbytes)
                    continue
                await limit.take(sum(e.stored for e in chosen))
                await gate.acquire()
                task = asyncio.create_task(fetch(chosen, done, nbytes, asked))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
            if errors:
                report.note = f"{report.errors} extents could not be fetched: {errors[0]}"
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _from_peers(
        self, incoming: list[PeerItem], listed: asyncio.Event, report: WarmReport, peers: PeerClient,
        concurrency: int, patience: float, job: Job | None,
    ) -> None:
        """Each extent from the node that owns its segment, asked again
        until that node has it; what no peer gives is read from the store.
        ``incoming`` grows while the set is listed, until ``listed``."""
        reader = self._reader
        level = self._settings.compression_level
        gate = asyncio.Semaphore(concurrency)
        heard = dict.fromkeys(peers.group.endpoints, time.monotonic())  # last bytes from each node
        remaining: dict[tuple[str, str], int] = {}
        items: list[PeerItem] = []

        def take_incoming() -> None:
            for item in incoming:
                where = (item.meta.bucket, item.meta.key)
                remaining[where] = remaining.get(where, 0) + 1
            items.extend(incoming)
            incoming.clear()

        def finished(item: PeerItem) -> None:
            where = (item.meta.bucket, item.meta.key)
            remaining[where] -= 1
            if not remaining[where] and job is not None:
                job.advance(1, item.meta.size)

        async def ask(item: PeerItem) -> str:
            async with gate:
                try:
                    data = await peers.extent(item.owner, item.meta.bucket, item.meta.key, item.meta.etag,
                                              item.start, item.extent, level, HOT)
                except PeerRefused as exc:
                    log.info("peer %s did not send %s/%s: %s", item.owner, item.meta.bucket, item.meta.key, exc)
                    return "store"
                if data is None:
                    return "later"
            heard[item.owner] = time.monotonic()
            if await reader.adopt(item.extent, data):
                report.peer_extents += 1
                report.peer_bytes += len(data)
            finished(item)
            return "done"

        pause = 0.05
        requests = peers.requests
        try:
            while True:
                done_listing = listed.is_set()
                take_incoming()
                if not items:
                    if done_listing:
                        return
                    await asyncio.sleep(pause)
                    continue
                # Per node, one GET first: a node that has nothing yet costs
                # one refused request a round, not one per extent.
                by_owner: dict[str, list[PeerItem]] = {}
                for item in items:
                    by_owner.setdefault(item.owner, []).append(item)

                async def from_node(its: list[PeerItem]) -> list[tuple[PeerItem, str]]:
                    first = await ask(its[0])
                    if first == "later":  # asked last next round: the node may have others by then
                        return [(item, "later") for item in [*its[1:], its[0]]]
                    rest = await asyncio.gather(*(ask(item) for item in its[1:]))
                    return list(zip(its, [first, *rest], strict=True))

                outcomes = [pair for its in await asyncio.gather(*map(from_node, by_owner.values())) for pair in its]
                waiting = [item for item, outcome in outcomes if outcome == "later"]
                store = [item for item, outcome in outcomes if outcome == "store"]
                now = time.monotonic()
                store += [item for item in waiting if now - heard[item.owner] > patience]
                items[:] = [item for item in waiting if now - heard[item.owner] <= patience]
                if store:
                    outcome = await reader.fetch_many([item.extent for item in store])
                    report.peer_fallbacks += len(store)
                    report.requests += outcome.requests
                    report.fetched_bytes += outcome.bytes
                    report.errors += outcome.errors
                    for item in store:
                        finished(item)
                if items:
                    progress = len(waiting) < len(outcomes)
                    pause = 0.05 if progress else min(1.0, pause * 2)
                    await asyncio.sleep(pause)
        finally:
            report.peer_requests += peers.requests - requests

    async def _warm_mounted(
        self, bucket: str, batches: AsyncIterator[list[tuple[str, int | None]]], report: WarmReport,
        concurrency: int, limit: RateLimit, job: Job | None,
    ) -> None:
        """Object by object, ``concurrency`` at once: a small one is one
        ranged GET, a large one its pieces."""
        mounts = self._mounts
        gate = asyncio.Semaphore(max(1, concurrency))

        def left_out(size: int) -> None:
            report.left_out_objects += 1
            report.left_out_bytes += size

        async def one(key: str, listed: int | None) -> None:
            async with gate:
                room = report.room_bytes - report.hot_bytes
                if report.left_out_objects or (listed is not None and listed > room):
                    report.objects += 1  # (a key of a list is not asked about once the room is gone)
                    report.bytes += listed or 0
                    left_out(listed or 0)
                    return
                try:
                    outcome = await mounts.warm(bucket, key, room)
                except (NoSuchKey, AccessDenied, SourceDenied):  # 404 or 403: an answer, asked once
                    _missing(report, key, job)
                    return
                report.objects += 1
                report.bytes += outcome.size
                if outcome.hot:
                    report.hot_objects += 1
                    report.hot_bytes += outcome.size
                else:
                    left_out(outcome.size)
                if job is not None:
                    job.advance(1, outcome.size)
                now = stats.bytes_read
                await limit.take(max(0, now - seen[0]))
                seen[0] = max(seen[0], now)

        stats = mounts.stats(bucket)
        before, read = stats.gets + stats.heads, stats.bytes_read
        seen = [read]
        try:
            async for batch in batches:
                await asyncio.gather(*(one(key, size) for key, size in batch))
        finally:
            report.requests = stats.gets + stats.heads - before
            report.fetched_bytes = stats.bytes_read - read


def _split(meta: ObjectMeta, peers: PeerClient, hot: HotTier, mine: list[Extent], theirs: list[PeerItem]) -> bool:
    """Sort the object's extents not yet hot into this node's and the
    other nodes'; True if some are the other nodes'."""
    offset = 0
    any_theirs = False
    me = peers.group.me
    for chunk in meta.chunks:
        ext = chunk.extent
        if chunk.file_id is None and ext is not None and not hot.is_cached(ext.cache_name):
            # By segment: a cooperative warm ends with the whole set on every
            # node, so each segment is best read whole, in one GET, by one
            # node (reads place extents one by one instead: one cache).
            node = peers.group.owner(ext.segment)
            if node == me:
                mine.append(ext)
            else:
                theirs.append(PeerItem(meta, ext, offset, node))
                any_theirs = True
        offset += chunk.size
    return any_theirs


def _missing(report: WarmReport, key: str, job: Job | None = None) -> None:
    """``key`` does not exist (or may not be read): counted once, and done."""
    if job is not None:
        job.advance(1, 0)
    report.missing += 1
    if len(report.missing_keys) < _SHOWN:
        report.missing_keys.append(key)


def _count(index: Index, bucket: str, prefix: str) -> tuple[int, int]:
    objects = size = 0
    for meta in index.iter_objects(bucket, prefix):
        objects += 1
        size += meta.size
    return objects, size


def _lookup(index: Index, bucket: str, keys: list[str]) -> list[ObjectMeta | None]:
    return [index.get_object(bucket, key) for key in keys]
