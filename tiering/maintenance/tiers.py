"""The capacity side of a node: the store, and the background work on it.

``Tiers`` owns the capacity store client, the extent reader, the flusher and
the compactor, starts them after the index and hot tier are open, and stops
them before those close. The flusher and compactor share one lock: each
changes which segments hold which extents, and each commit assumes the other
is not doing so at the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass

from tiering import pool
from tiering.capacity import CapacityStore
from tiering.capacity.layout import list_segments, segment_path
from tiering.cluster.cluster import Cluster, ClusterStatus
from tiering.cluster.terms import cluster_store
from tiering.cluster.writing import SoleWriter, Writing
from tiering.errors import CapacityNotFound, TierstoreError
from tiering.hot.tier import HotTier
from tiering.index.bucket_settings import Policies
from tiering.index.db import Index
from tiering.jobs import Job
from tiering.maintenance.compact import CompactionReport, Compactor
from tiering.maintenance.flush import Flusher
from tiering.maintenance.residency import Residency
from tiering.maintenance.rounds import Rounds
from tiering.maintenance.space import DiskStatus, SpaceKeeper
from tiering.reads.fetch import ExtentReader
from tiering.settings import TierSettings

log = logging.getLogger("tierstore.tiers")

_PROBE = "ready-probe"  # never written: only asked for


class ForeignSegments(Exception):
    """The capacity store holds segments this node's index does not know."""


@dataclass(slots=True)
class TierStatus:
    hot_budget: int
    hot_used: int
    hot_staged: int
    hot_cached: int  # clean cache, pinned included
    hot_pinned: int
    hot_reserved: int
    high_watermark: int
    low_watermark: int
    evicted: int
    cache_hits: int
    cache_misses: int
    peer_reads: int  # misses another gateway answered (the rest read the store)
    hot_copies: int  # cached extents other nodes own: evicted before this node's own share
    segments: int
    capacity_bytes: int
    capacity_live: int
    live_ratio: float  # capacity_live / stored data bytes; 1.0 when empty
    flush_queue: int
    pending_records: int  # tombstones and bucket events not yet in a segment
    segments_written: int
    last_flush_error: str | None
    capacity: str
    capacity_requests: dict[str, int]
    capacity_bytes_read: int
    capacity_bytes_written: int
    cluster: ClusterStatus | None = None  # one of several gateways (tiering/cluster/cluster.py)
    disk: DiskStatus | None = None  # the filesystem against the free-space floor (tiering/maintenance/space.py)


class Tiers:
    """The capacity store and the background work on it, for one node."""

    def __init__(
        self,
        index: Index,
        hot: HotTier,
        capacity: CapacityStore,
        settings: TierSettings,
        policies: Policies,
        region: str = "us-east-1",
    ) -> None:
        self.index = index
        self.hot = hot
        self.capacity = capacity
        self.settings = settings
        self._layout = layout = asyncio.Lock()
        self._rounds = rounds = Rounds()  # the flusher's and compactor's shielded rounds
        self.cluster = (
            Cluster(index, hot, capacity, settings, policies, region, self._start_writing)
            if settings.node_id is not None
            else None
        )
        self.writing: Writing = self.cluster if self.cluster is not None else SoleWriter(index)
        self.reader = ExtentReader(capacity, hot, settings.fetch_concurrency, settings.small_gets)
        self.flusher = Flusher(index, hot, capacity, settings, layout, policies, self.writing, rounds)
        self.compactor = Compactor(index, hot, capacity, settings, layout, self.writing, rounds)
        self.residency = Residency(index, hot, self.reader, policies, settings.fetch_concurrency)
        self.space = SpaceKeeper(index, hot, self.flusher)
        self._tasks: list[asyncio.Task[None]] = []
        self._keeper: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def writing_to(self, bucket: str) -> AsyncIterator[None]:
        """Around a write to managed ``bucket``, from before it is checked
        to after it is committed. Raises (NotWriter, ServiceUnavailable)
        unless this node takes the bucket's writes: always on a single
        node; on one of several, while it holds the bucket's write lease,
        which it takes here if no other node holds it, and which it does
        not give up while the write runs."""
        if self.cluster is None:
            yield
            return
        async with self.cluster.writing_to(bucket):
            yield

    def cluster_status(self) -> ClusterStatus | None:
        return self.cluster.status() if self.cluster is not None else None

    async def start(self) -> None:
        # First: a full disk at start needs room made before anything else.
        self._keeper = asyncio.create_task(self.space.run(), name="tierstore space keeper")
        await self.capacity.start()
        if self.cluster is None:
            await self._refuse_a_cluster_store()
            await self._start_writing()
        else:
            await self.cluster.start()

    async def _refuse_a_cluster_store(self) -> None:
        """A gateway without a node id never writes a store that gateways
        with node ids share: it would write beside their writer."""
        if await cluster_store(self.capacity):
            raise ForeignSegments(
                f"the capacity store {self.capacity.describe()} is shared by gateways started with "
                "--node-id: start this one with --node-id too"
            )

    async def _start_writing(self) -> None:
        """Clean up after a crash, then flush and compact: at start on a
        single node, or when this node first takes a bucket of several
        nodes' (whose segments are no orphans: see ``tiering/cluster/cluster.py``)."""
        if self.cluster is None:
            if aborted := await self.capacity.abort_incomplete():
                log.info("removed %d incomplete write(s) a crash left in the capacity store", aborted)
            await self._collect_orphans()
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self.flusher.run(), name="tierstore flusher"),
                asyncio.create_task(self.compactor.run(), name="tierstore compactor"),
            ]

    async def stop(self, grace: float = 20.0) -> None:
        """Stop background work between rounds, never inside an index commit
        (the index closes right after). A round still running after
        ``grace`` seconds (a slow upload) is cancelled: what it uploaded is
        unreferenced and removed at the next start. A writer among several
        releases its lease last."""
        if self.cluster is not None:
            await self.cluster.stop(release=await self._drain(grace))
        held = False
        try:
            async with asyncio.timeout(grace):
                await self._layout.acquire()
            held = True
        except TimeoutError:
            log.warning("a flush or compaction round did not finish in %.0fs; cancelling it", grace)
        tasks = [*self._tasks, *([self._keeper] if self._keeper is not None else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks, self._keeper = [], None
        # Shielded rounds outlive their cancelled callers (these tasks, a
        # job, the drain): one waiting for the lock would run once it is
        # released, one past the grace still holds it. Cancelled, each
        # releases the lock itself if it holds it (tiering/maintenance/rounds.py).
        await self._rounds.cancel()
        if held:  # only if this took it: locked() does not say who holds it
            self._layout.release()
        await self.reader.drain()
        await self.capacity.close()

    async def _drain(self, grace: float) -> bool:
        """A writer among several flushes what it holds before it lets the
        lease go; True if nothing is left (it may release the lease)."""
        if self.cluster is None or not self.cluster.writes():
            return False
        try:
            async with asyncio.timeout(grace / 2):
                await self.flusher.flush_all()
        except (TimeoutError, TierstoreError, OSError) as exc:
            log.warning("could not flush before stopping (%s): keeping the write lease until it expires", exc)
            return False
        queued = await pool.run(self.index.flush_queue_length)
        return queued == 0 and await pool.run(self.index.pending_records_count) == 0

    async def _collect_orphans(self) -> None:
        """Delete segments a crash left uploaded but never committed (or
        committed away by compaction but not yet deleted). Only names this
        index has handed out are candidates: a store holding segments of
        another namespace is refused, never cleaned."""
        known = {info.name for info in await pool.run(self.index.segments)}
        issued = self.index.segments_issued
        foreign = 0
        async for name, _ in list_segments(self.capacity):
            if name in known:
                continue
            try:
                number = int(name, 16)
            except ValueError:
                foreign += 1
                continue
            if number > issued:
                foreign += 1
                continue
            log.info("removing unreferenced segment %s", name)
            await self.capacity.delete(segment_path(name))
        if foreign:
            raise ForeignSegments(
                f"the capacity store {self.capacity.describe()} holds {foreign} segment(s) this data "
                "directory does not know: run `tierstore recover` to rebuild the index from them, "
                "or point --capacity at an empty location"
            )

    async def reachable(self, timeout: float) -> bool:
        """True if the capacity store answers within ``timeout`` seconds
        (one HEAD of a name that does not exist: "not found" is an answer)."""
        try:
            async with asyncio.timeout(timeout):
                await self.capacity.size(_PROBE)
        except CapacityNotFound:
            return True
        except (TierstoreError, OSError, TimeoutError):
            return False
        return True

    async def flush(self, job: Job | None = None) -> None:
        await self.flusher.flush_all(job)

    async def compact(self, threshold: float | None = None, job: Job | None = None) -> CompactionReport:
        return await self.compactor.compact(threshold, job)

    async def status(self) -> TierStatus:
        segments = await pool.run(self.index.segments)
        queued = await pool.run(self.index.flush_queue_length)
        records = await pool.run(self.index.pending_records_count)
        hot = self.hot
        stats = self.capacity.stats
        data = sum(s.data for s in segments)
        live = sum(s.live for s in segments)
        return TierStatus(
            hot_budget=hot.budget,
            hot_used=hot.used,
            hot_staged=hot.staged,
            hot_cached=hot.cached,
            hot_pinned=hot.pinned,
            hot_reserved=hot.reserved,
            high_watermark=hot.high,
            low_watermark=hot.low,
            evicted=hot.evicted,
            cache_hits=self.reader.hits,
            cache_misses=self.reader.misses,
            peer_reads=self.reader.from_peers,
            hot_copies=hot.copies,
            segments=len(segments),
            capacity_bytes=sum(s.size for s in segments),
            capacity_live=live,
            live_ratio=live / data if data else 1.0,
            flush_queue=queued,
            pending_records=records,
            segments_written=self.flusher.segments_written,
            last_flush_error=self.flusher.last_error,
            capacity=self.capacity.describe(),
            capacity_requests={
                k: v for k, v in asdict(stats).items() if k not in ("bytes_read", "bytes_written")
            },
            capacity_bytes_read=stats.bytes_read,
            capacity_bytes_written=stats.bytes_written,
            cluster=self.cluster_status(),
            disk=self.space.status(),
        )
