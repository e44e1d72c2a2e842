"""A warm spread over the cluster's one cache: each extent brought in by its owner.

With the node registry the nodes' hot tiers are one cache: every extent of
a managed segment has one owner among the live nodes
(``PeerGroup.extent_owner``, the table reads place extents by), and a read
elsewhere asks that owner and keeps no copy. A warm on one node of such a
cluster (a cooperative warm with no peers named) is split by the same
table, so the set ends up where the reads will look for it:

- the extents this node owns are fetched from the store here, neighbours
  of a segment together (``ExtentReader.fetch_many``);
- for every other extent, its owner is asked for the extent's first byte
  with ``x-tierstore-peer: fetch``: the owner reads it through its own tier
  (from the store once, single flight) and keeps it whole, as for any read
  that missed there; this node has no use for the bytes, so only one
  crosses the network.

An owner that refuses or cannot be reached has its extents fetched from the
store here instead (as a read that could not ask it would be served). The
table is read per object, so a node that joins or leaves during the job
gets or gives up its share from then on.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from tiering.cluster.peers import FETCH, PeerClient, PeerRefused
from tiering.hot.tier import HotTier
from tiering.meta import Extent, ObjectMeta

__all__ = ["PeerItem", "Spread"]

log = logging.getLogger("tierstore.warm")


@dataclass(slots=True)
class PeerItem:
    """An extent of a warm's set that another node fetches (its owner)."""

    meta: ObjectMeta
    extent: Extent
    start: int  # where its bytes start in the object
    owner: str


class Spread:
    """Who brings in which extent of one warm job, and asking them."""

    def __init__(self, peers: PeerClient, hot: HotTier, concurrency: int) -> None:
        self._peers = peers
        self._hot = hot
        # The asks are one byte each: more of them in flight than batches.
        self._gate = asyncio.Semaphore(max(8, 4 * concurrency))
        self.asked = 0  # extents an owner brought in
        self.requests = 0  # GETs that asked them
        self.refused = 0  # extents whose owner did not: fetched here

    def split(self, meta: ObjectMeta) -> tuple[list[Extent], list[PeerItem]]:
        """The object's extents to warm: this node's share (not cached
        yet), and the other nodes' (asked whether or not a copy is here:
        the copy is not where reads look)."""
        group = self._peers.group
        mine: list[Extent] = []
        theirs: list[PeerItem] = []
        offset = 0
        for chunk in meta.chunks:
            ext = chunk.extent
            if chunk.file_id is None and ext is not None and chunk.size:
                node = group.extent_owner(ext)
                if node != group.me:
                    theirs.append(PeerItem(meta, ext, offset, node))
                elif not self._hot.is_cached(ext.cache_name):
                    mine.append(ext)
            offset += chunk.size
        return mine, theirs

    async def ask(self, items: list[PeerItem]) -> list[Extent]:
        """Have each owner bring its extents in; the extents of owners that
        did not (to be fetched here)."""
        refused = await asyncio.gather(*(self._ask(item) for item in items))
        return [item.extent for item, no in zip(items, refused, strict=True) if no]

    async def _ask(self, item: PeerItem) -> bool:
        """True when the owner did not bring the extent in."""
        meta = item.meta
        async with self._gate:
            self.requests += 1
            try:
                got = await self._peers.get(item.owner, meta.bucket, meta.key, meta.etag,
                                            item.start, item.start + 1, FETCH)
            except PeerRefused as exc:
                log.info("owner %s did not warm %s/%s: %s", item.owner, meta.bucket, meta.key, exc)
                got = None
        if got is None:
            self.refused += 1
            return True
        self.asked += 1
        return False
