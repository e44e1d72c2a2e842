"""Other gateways as a source of extents, for cooperative warm.

When several gateways warm the same data set, each segment is given to one
of them by rendezvous hashing over the node list (``owner``): that node
fetches it from the capacity store, the others get its extents from that
node, so the store serves each segment once instead of once per node.

A peer is asked over its S3 API, like any client would: a ranged GET of the
object, signed with this gateway's key pair (the nodes of one cluster share
one), with ``If-Match`` on the ETag so that a different version is refused,
and with ``x-tierstore-peer``: ``hot`` (a cooperative warm) makes the peer
answer only from its hot tier, 503 when the bytes are not there yet;
``fetch`` (a read that missed here) lets it read through its own tier as
for any client, so the segment's owner reads the store once for all nodes.
A request that carries the header is never passed on to a third node, so a
difference between two nodes' peer lists cannot make requests go round.

A peer that cannot be reached is left alone for ``_PAUSE`` seconds: reads
go to the store meanwhile instead of each waiting for a connect timeout.

What a peer sends is the extent's raw bytes; they are checked against the
extent's checksum, which covers its stored form: raw bytes are stored as
they are (``none``) or as one zstd frame at the cluster's compression
level, and that frame is made again here. Bytes that do not check out are
refused, and the extent is fetched from the store.
"""

from __future__ import annotations

import hashlib
import ssl
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from botocore.exceptions import ClientError

from packer import codec
from tiering import pool
from tiering.capacity.s3_get import Keys, LeanGetter
from tiering.meta import Extent

__all__ = ["FETCH", "HOT", "PEER_HEADER", "Keys", "PeerClient", "PeerGroup", "PeerRefused", "owner",
           "stored_matches"]

PEER_HEADER = "x-tierstore-peer"  # on a GET from another gateway: HOT or FETCH
HOT = "hot"  # answer from the hot tier only, else 503
FETCH = "fetch"  # read through, as for a client, but ask no other node
_PAUSE = 30.0  # seconds a node that could not be reached is not asked
_CONNECTIONS = 16


def owner(segment: str, nodes: list[str]) -> str:
    """The node that fetches ``segment`` from the store: the highest hash
    of (node, segment). Adding or removing a node moves only the segments
    that node gains or loses."""
    return max(nodes, key=lambda node: hashlib.blake2b(f"{node}\0{segment}".encode(), digest_size=8).digest())


def stored_matches(ext: Extent, raw: bytes, level: int) -> bool:
    """True if ``raw`` is the extent's content: its stored form (made
    again) has the extent's length and checksum."""
    if len(raw) != ext.raw:
        return False
    stored = raw if ext.codec == codec.NONE else codec.compress(raw, level)
    return len(stored) == ext.stored and zlib.crc32(stored) == ext.crc


class PeerRefused(Exception):
    """The peer answered, but not with the bytes (no such object or version,
    refused credentials, an error): fetch from the store instead."""


@dataclass(frozen=True, slots=True)
class PeerGroup:
    """The nodes of one cooperative warm: id -> S3 endpoint, this one included."""

    me: str
    endpoints: Mapping[str, str]

    @property
    def nodes(self) -> list[str]:
        return sorted(self.endpoints)

    def owner(self, segment: str) -> str:
        return owner(segment, self.nodes)


class PeerClient:
    """Signed ranged GETs of extents to the other nodes of a group."""

    def __init__(
        self, group: PeerGroup, region: str, keys: Keys, timeout: float = 30.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``tls`` verifies peers whose endpoints are https (default: the system's CAs)."""

        async def fixed() -> Keys:
            return keys

        self.group = group
        self._getters = {
            node: LeanGetter(url, region, fixed, connections=_CONNECTIONS,
                             connect_timeout=min(5.0, timeout), read_timeout=timeout, tls=tls)
            for node, url in group.endpoints.items()
            if node != group.me
        }
        self.requests = 0
        self.bytes = 0
        self._down_until: dict[str, float] = {}

    async def start(self) -> None:
        for getter in self._getters.values():
            await getter.start()

    async def close(self) -> None:
        for getter in self._getters.values():
            await getter.close()

    async def get(
        self, node: str, bucket: str, key: str, etag: str, start: int, end: int, mode: str = HOT
    ) -> bytes | None:
        """Bytes ``[start, end)`` of the object from ``node``; None when it
        answers 503 (with HOT: not hot there yet). PeerRefused for any other
        answer, and for a node that could not be reached lately."""
        if time.monotonic() < self._down_until.get(node, 0.0):
            raise PeerRefused(f"node {node} could not be reached lately")
        self.requests += 1
        try:
            answer = await self._getters[node].get_object(
                Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", IfMatch=f'"{etag}"',
                extra={PEER_HEADER: mode},
            )
            async with answer["Body"] as body:
                data: bytes = await body.read()
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 503:
                return None
            raise PeerRefused(f"node {node}: {exc}") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._down_until[node] = time.monotonic() + _PAUSE
            raise PeerRefused(f"node {node} cannot be reached: {exc!r}") from None
        if len(data) != end - start:
            raise PeerRefused(f"node {node}: {len(data)} bytes for a range of {end - start}")
        self.bytes += len(data)
        return data

    async def extent(
        self, node: str, bucket: str, key: str, etag: str, start: int, ext: Extent, level: int, mode: str
    ) -> bytes | None:
        """The extent's raw bytes from ``node`` (the object's bytes from
        ``start``), checked; None as ``get``; PeerRefused as ``get``, and for
        bytes that do not match the extent's checksum."""
        data = await self.get(node, bucket, key, etag, start, start + ext.raw, mode)
        if data is not None and not await pool.run(stored_matches, ext, data, level):
            raise PeerRefused(f"node {node}: extent {ext.segment}@{ext.offset} does not match its checksum")
        return data
