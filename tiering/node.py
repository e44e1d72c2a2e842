"""One node's tiering, built in one place.

:class:`Node` is the composition root of ``tiering``: it opens the index
and the hot tier and wires every collaborator to the two or three others it
uses, so no part of the data path is handed the whole graph. The gateway
builds one Node per process (``gateway.storage.open_node``) and hands its
pieces to the S3 app, the admin API and the read workers' lookups.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

from tiering import pool
from tiering.capacity import CapacityStore
from tiering.cluster.members import Member
from tiering.cluster.peers import PeerClient
from tiering.cluster.push import SEGMENTS, Pusher
from tiering.hot.tier import HotTier
from tiering.index.bucket_settings import Policies
from tiering.index.db import Index
from tiering.index.room import IndexRoom
from tiering.jobs import Jobs
from tiering.maintenance.tiers import Tiers
from tiering.managed.backend import ManagedBuckets
from tiering.managed.multipart import Multipart
from tiering.managed.staging import Stager
from tiering.meta import BucketInfo
from tiering.mounts.backend import MountedBuckets
from tiering.mounts.buckets import Mounts
from tiering.mounts.uploads import MountUploads
from tiering.objects import ObjectService
from tiering.prefetch.epochs import Epochs
from tiering.prefetch.warm import Warmer
from tiering.settings import TierSettings

log = logging.getLogger("tierstore.node")


class Node:
    """The index, the tiers and the services of one gateway's data."""

    def __init__(
        self,
        data_dir: Path,
        settings: TierSettings,
        capacity: CapacityStore,
        region: str = "us-east-1",
        peers: PeerClient | None = None,
        pusher: Pusher | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.region = region
        self.settings = settings
        # The other gateways over the same store, asked for an extent before
        # the store on a miss (``tiering/cluster/peers.py``).
        self.peers = peers
        # The notices this node sends the others (``tiering/cluster/push.py``).
        self.pusher = pusher
        room = IndexRoom(data_dir / "index", settings.index_reserve)
        self.index = index = Index(data_dir / "index", settings.record_cache, room)
        self.hot = hot = HotTier(data_dir / "hot", settings.hot_size, settings.high_watermark, settings.low_watermark,
                                 settings.free_floor, logs=settings.cache_logs)
        # A write the index has no room for is a 503 while the hot tier can
        # make some (evict, flush), else a 507.
        room.can_free = hot.can_free
        self.policies = policies = Policies(index, settings)
        self.tiers = tiers = Tiers(index, hot, capacity, settings, policies, region)
        self.mounts = mounts = Mounts(index, hot, settings, region, peers)
        self.jobs = Jobs()
        stager = Stager(index, hot, capacity, tiers.flusher, policies, settings)
        self.managed = managed = ManagedBuckets(
            index, hot, tiers, stager, policies, settings, Multipart(index, stager, tiers), peers
        )
        mounted = MountedBuckets(mounts, MountUploads(mounts))
        self.epochs = epochs = Epochs(index, hot, mounts, tiers.reader, settings, self.find_bucket)
        self.objects = ObjectService(
            index, tiers, policies, mounts, managed, mounted, epochs, settings, region, self.find_bucket
        )
        self.warmer = Warmer(self.objects, index, hot, mounts, tiers.reader, settings, peers)
        members = tiers.cluster.members if tiers.cluster is not None else None
        if peers is not None:
            # Copies of extents other nodes own are evicted before this node's share.
            hot.rank_copies(lambda name: peers.group.keeps_elsewhere(name))
        if peers is not None and members is not None:
            # Without fixed --peers, the peers are the live nodes of the registry.
            async def follow(live: Mapping[str, Member]) -> None:
                group = peers.group
                await peers.follow({n: m.endpoint for n, m in live.items()},
                                   {n: m.started_ms for n, m in live.items()})
                if peers.group is not group:  # the owners changed: what is a copy here too
                    await pool.run(hot.judge_copies)

            members.subscribe(follow)
        if pusher is not None and tiers.cluster is not None:
            tiers.cluster.publisher.tell(lambda: pusher.push(SEGMENTS))
            if members is not None:
                pusher.use(lambda: {n: m.endpoint for n, m in members.live().items()})

    def find_bucket(self, name: str) -> BucketInfo | None:
        """A managed bucket or a mount by name; point reads, microseconds."""
        return self.index.get_bucket(name) or self.mounts.bucket(name)

    async def start(self) -> None:
        """Remove what a crash left half-done, then start the tiers.

        After a clean shutdown there is nothing to remove and the staged
        byte count was saved, so start-up skips the sweep, which has to read
        every index record (tens of seconds for millions of objects).
        Committed writes not yet flushed are still in the flush queue: the
        flusher takes them up again."""
        await pool.run(self.hot.resume, self.index.referenced_files)
        self.hot.open_files.bind(asyncio.get_running_loop())
        if not self.index.live_weighted():
            # Before empty entries counted one, a segment whose only live
            # entries were empty looked unused: count them again, once,
            # before compaction can run.
            changed = await pool.run(self.index.recount_live)
            if changed:
                log.info("recounted the live bytes of %d segments (empty entries now count)", changed)
        await self.tiers.residency.restore()
        await self.tiers.start()
        await self.mounts.start()
        self.epochs.start()
        if self.peers is not None:
            await self.peers.start()

    async def close(self) -> None:
        if self.tiers.cluster is not None and self.tiers.cluster.members is not None:
            await self.tiers.cluster.members.stop()  # first: the other nodes stop asking this one
        if self.peers is not None:
            await self.peers.close()
        await self.jobs.stop()
        await self.epochs.stop()
        await self.mounts.close()
        await self.tiers.stop()
        if self.pusher is not None:
            await self.pusher.close()  # after the last flush's notice
        await pool.run(self.index.close)
        self.hot.open_files.close()
        await pool.run(self.hot.mark_clean)
