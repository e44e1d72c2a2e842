"""Which node of a cluster keeps a mounted object's bytes, and asking it.

With peers, every mounted object has one owner: the node that rendezvous
hashing of (mount, key) picks among the live nodes (``PeerGroup.owner``).
The owner reads the source once (single flight) and keeps the pieces; any
other node asks the owner for them, over the S3 API with
``x-tierstore-peer: fetch`` (the owner reads through its own tier and asks no
third node), and keeps no copy: the cluster's hot tiers add up to one cache.
The key, not the version, is what is placed, so the node that probes an
object it has never seen asks the node that will hold it.

What the owner sends is checked where it is cheap and was checked where it
came in: the owner verified a whole object's bytes against the source's MD5
ETag before it cached them, and it answers a piece only for the version the
reader names (``If-Match``); the reader checks the length. The first bytes
of an object new to the reader (its description too) are checked against
the MD5 ETag once more, as a source's answer is, since the description is
recorded from them. An owner that refuses or cannot be reached is skipped:
the read goes to the source, as without peers.

**A share handed over.** When a node joins a running cluster, the objects
it now owns are still hot on the nodes that kept them until then: for a
while, a miss of one asks that node's memory first (``before``, with
``x-tierstore-peer: hot``), and what it sends is cached here as the
source's bytes would be, checked against the MD5 ETag where that is one
(``tiering/cluster/handover.py`` says when asking stops).
"""

from __future__ import annotations

import logging

from tiering.cluster.handover import Handover
from tiering.cluster.peers import FETCH, HOT, PeerClient, PeerRefused
from tiering.errors import CapacityNotFound
from tiering.meta import ObjectMeta
from tiering.mounts.source import SourceObject, source_object

__all__ = ["MountOwners", "PeerRefused"]

log = logging.getLogger("tierstore.mounts")


class MountOwners:
    """The owners of mounted objects among this node's peers."""

    def __init__(self, peers: PeerClient) -> None:
        self._peers = peers
        self.asked = 0  # reads answered by an owner, for the status
        self.refused = 0  # owners that did not answer: read from the source
        self._handover = Handover(peers)

    def of(self, name: str, key: str) -> str | None:
        """The node that keeps ``key`` of mount ``name``; None when it is this one."""
        group = self._peers.group
        node = group.owner(f"{name}\0{key}")
        return None if node == group.me else node

    @property
    def handed(self) -> int:
        """Objects' pieces of this node's share a previous owner sent."""
        return self._handover.handed

    def before(self, name: str, key: str) -> str | None:
        """For an object this node keeps: the node that would keep it
        without this one, while this node may still be taking its share
        over (``Handover.before``); None otherwise."""
        return self._handover.before(f"{name}\0{key}")

    async def handed_first(self, name: str, key: str, length: int) -> tuple[SourceObject, bytes] | None:
        """The object's description and first ``length`` bytes from its
        previous owner's memory (``before``); None when there is none or it
        does not hold them."""
        node = self.before(name, key)
        if node is None:
            return None
        try:
            headers, size, data = await self._peers.first(node, name, key, length, HOT)
        except (PeerRefused, CapacityNotFound):
            return self._handover.outcome(None)
        return self._handover.outcome((source_object(key, headers, size), data))

    async def handed_piece(self, meta: ObjectMeta, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` of that version from its previous owner's
        memory (``before``); None when there is none or it does not hold them."""
        node = self.before(meta.bucket, meta.key)
        if node is None:
            return None
        try:
            return self._handover.outcome(await self._peers.get(node, meta.bucket, meta.key, meta.etag, start, end, HOT))
        except PeerRefused:
            return self._handover.outcome(None)

    async def first(self, node: str, name: str, key: str, length: int) -> tuple[SourceObject, bytes]:
        """The object's description and first ``length`` bytes, from ``node``.
        CapacityNotFound when the owner found no such key at the source."""
        try:
            headers, size, data = await self._peers.first(node, name, key, length)
        except PeerRefused:
            self.refused += 1
            raise
        self.asked += 1
        return source_object(key, headers, size), data

    async def piece(self, node: str, meta: ObjectMeta, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of that version, from ``node``."""
        try:
            data = await self._peers.get(node, meta.bucket, meta.key, meta.etag, start, end, FETCH)
        except PeerRefused:
            self.refused += 1
            raise
        if data is None:  # a 503: the owner could not read them now
            self.refused += 1
            raise PeerRefused(f"node {node} could not read {meta.bucket}/{meta.key} now")
        self.asked += 1
        return data

    async def batch(self, node: str, bucket: str, wanted: list[tuple[str, str]]) -> dict[str, memoryview | str]:
        """The objects ``wanted`` (key, ETag) from ``node`` in one request:
        key -> bytes, or the error code it gave (``PeerClient.batch``)."""
        try:
            found = await self._peers.batch(node, bucket, wanted)
        except PeerRefused:
            self.refused += 1
            raise
        self.asked += 1
        return found

    async def warm(self, node: str, meta: ObjectMeta, part: int) -> bool:
        """Have ``node`` bring every piece of ``meta`` in (it reads through
        its own tier); False when it did not: the caller warms it itself.
        Each piece is asked for by its first byte: the owner fetches and
        keeps pieces whole, and this node has no use for the bytes (it keeps
        none), so the rest would cross the network only to be dropped."""
        try:
            for start in range(0, meta.size, part):
                await self.piece(node, meta, start, start + 1)
        except PeerRefused as exc:
            log.info("owner %s did not warm %s/%s: %s", node, meta.bucket, meta.key, exc)
            return False
        return True
