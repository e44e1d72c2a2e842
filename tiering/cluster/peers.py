"""Other gateways as a source of extents, for cooperative warm.

Every extent of a managed segment is given to one node by rendezvous
hashing of its name over the node list (``PeerGroup.extent_owner``, from
the table of ``placement.py``): that node fetches it from the capacity
store and keeps it, the others get it from that node, so the store serves
each extent once instead of once per node.
The piece is the extent, not the segment: a segment packs many small
objects and may be larger than one node's hot tier, so placing it whole
would leave the cluster's tiers unevenly filled.

A peer is asked over its S3 API, like any client would: a ranged GET of the
object, signed with this gateway's key pair (the nodes of one cluster share
one), with ``If-Match`` on the ETag so that a different version is refused,
and with ``x-tierstore-peer``: ``hot`` (a cooperative warm) makes the peer
answer only from its hot tier, 503 when the bytes are not there yet;
``fetch`` (a read that missed here) lets it read through its own tier as
for any client, so the extent's owner reads the store once for all nodes.
A request that carries the header is never passed on to a third node, so a
difference between two nodes' peer lists cannot make requests go round
(the one exception, a node that just joined asking the piece's previous
owner with ``hot``, asks for memory alone, which passes nothing on).

A peer that cannot be reached is left alone for ``_PAUSE`` seconds: reads
go to the store meanwhile instead of each waiting for a connect timeout.
With the node registry (``members.py``) a node that restarted since (its
start time changed) is asked again at once.

The nodes are fixed (``--peers``) or follow the registry (``follow``):
``group`` is always the current set, a frozen value replaced whole; a node
that leaves is refused from then on, its connections kept for reads in
flight until ``_GRACE`` seconds later. Connections to all peers come out of
one node-wide budget (``--peer-connections``, 64): they do not grow with
the number of nodes; a peer that needs one more when all are open takes
the one idle longest, whichever peer it was to.

What a peer sends is the extent's raw bytes; they are checked against the
extent's checksum, which covers its stored form: raw bytes are stored as
they are (``none``) or as one zstd frame at the cluster's compression
level, and that frame is made again here. Bytes that do not check out are
refused, and the extent is fetched from the store.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from botocore.exceptions import ClientError

from packer import codec
from packer.crc import extent_crc
from tiering import pool
from tiering.capacity.http_get import ConnectionBudget
from tiering.capacity.s3_answers import BadBody, parse_content_range
from tiering.capacity.s3_get import Keys, LeanGetter
from tiering.cluster.placement import Placement, owner
from tiering.errors import CapacityNotFound
from tiering.meta import Extent
from tiering.model.archive import ERRORS, BadArchive, members

__all__ = ["FETCH", "HOT", "PEER_HEADER", "Keys", "PeerClient", "PeerGroup", "PeerRefused", "owner",
           "stored_matches"]

PEER_HEADER = "x-tierstore-peer"  # on a GET from another gateway: HOT or FETCH
HOT = "hot"  # answer from the hot tier only, else 503
FETCH = "fetch"  # read through, as for a client, but ask no other node
_PAUSE = 5.0  # seconds a node that could not be reached is not asked
CONNECTIONS = 64  # open to all other nodes together, by default
_GRACE = 5.0  # seconds past the read timeout a node that left keeps its connections
_EXTENT_NAME = re.compile(r"[0-9a-f]{16}-[0-9a-f]+-[0-9a-f]+")  # Extent.cache_name: segment-offset-stored


def stored_matches(ext: Extent, raw: bytes, level: int) -> bool:
    """True if ``raw`` is the extent's content: its stored form (made
    again) has the extent's length and checksum."""
    if len(raw) != ext.raw:
        return False
    stored = raw if ext.codec == codec.NONE else codec.compress(raw, level)
    return len(stored) == ext.stored and extent_crc(stored, ext.crc32c) == ext.crc


class PeerRefused(Exception):
    """The peer answered, but not with the bytes (no such object or version,
    refused credentials, an error): fetch from the store instead."""


@dataclass(frozen=True, slots=True)
class PeerGroup:
    """The nodes of one cooperative warm: id -> S3 endpoint, this one
    included; and the table of which node keeps which piece (made for
    ``endpoints`` when not given)."""

    me: str
    endpoints: Mapping[str, str]
    placement: Placement = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.placement is None or set(self.placement.nodes) != set(self.endpoints):
            object.__setattr__(self, "placement", Placement(self.endpoints))

    @property
    def nodes(self) -> list[str]:
        return list(self.placement.nodes)

    def owner(self, piece: str) -> str:
        return self.placement.owner(piece)

    def extent_owner(self, ext: Extent) -> str:
        """The node that keeps a managed extent's bytes."""
        return self.placement.owner(ext.cache_name)

    def keeps_elsewhere(self, name: str) -> bool:
        """True if ``name`` is the cache name of a managed extent another
        node owns: cached here, a copy. A mounted piece's name does not say
        which object it is of (its owner's key), so it is never one."""
        return _EXTENT_NAME.fullmatch(name) is not None and self.placement.owner(name) != self.me

    def previous_owner(self, piece: str) -> str | None:
        """The node that would keep ``piece`` without this one; None when
        this node is alone. The table without it is made in the pool when
        the peers change (``PeerClient.follow``), before this group is used."""
        if len(self.placement.nodes) < 2:
            return None
        return self.placement.without(self.me).owner(piece)


class _Getters(dict[str, LeanGetter]):
    """The connections to each other node now. A node that just left is
    still found among the retiring ones (a read that chose it before it
    left); any other is refused, so a read goes to the store."""

    def __init__(self) -> None:
        super().__init__()
        self.retiring: dict[str, LeanGetter] = {}

    def __missing__(self, node: str) -> LeanGetter:
        getter = self.retiring.get(node)
        if getter is None:
            raise PeerRefused(f"node {node} is not a member (any more)")
        return getter


class PeerClient:
    """Signed ranged GETs of extents to the other nodes of a group."""

    def __init__(
        self, group: PeerGroup, region: str, keys: Keys, timeout: float = 30.0,
        tls: ssl.SSLContext | None = None, connections: int = CONNECTIONS,
    ) -> None:
        """``tls`` verifies peers whose endpoints are https (default: the
        system's CAs). ``connections``: open to all peers together, however
        many there are (``budget``); one peer may use them all."""

        async def fixed() -> Keys:
            return keys

        self.budget = ConnectionBudget(connections)

        def getter(url: str) -> LeanGetter:
            return LeanGetter(url, region, fixed, connections=connections, connect_timeout=min(5.0, timeout),
                              read_timeout=timeout, tls=tls, budget=self.budget)

        self.group = group
        self._new_getter = getter
        self._grace = timeout + _GRACE
        self._getters = _Getters()
        self._getters.update({node: getter(url) for node, url in group.endpoints.items() if node != group.me})
        self._retired: list[tuple[float, LeanGetter]] = []  # (monotonic close time, getter)
        self._started_ms: dict[str, int] = {}  # node -> its start time, as the registry last said
        self._running = self._closed = False
        self.requests = 0
        self.bytes = 0
        self._down_until: dict[str, float] = {}

    async def start(self) -> None:
        for getter in self._getters.values():
            await getter.start()
        if len(self.group.placement.nodes) > 1:  # with fixed --peers, follow never makes it
            await pool.run(self.group.placement.without, self.group.me)
        self._running = True

    async def close(self) -> None:
        self._closed = True
        self._running = False
        for getter in [*self._getters.values(), *(g for _, g in self._retired)]:
            await getter.close()
        self._getters.clear()
        self._getters.retiring.clear()
        self._retired.clear()

    async def follow(self, endpoints: Mapping[str, str], started_ms: Mapping[str, int] | None = None) -> None:
        """Make the group the nodes of ``endpoints`` (id -> S3 endpoint;
        this node added if missing): connections to new nodes are opened,
        those to nodes that left (or moved to another endpoint) are closed
        ``timeout`` + a grace later, so that reads in flight finish.

        ``started_ms`` (id -> start time, from the registry): a node that
        could not be reached and has restarted since is asked again at once."""
        if self._closed:
            return
        now = time.monotonic()
        me = self.group.me
        wanted = {**endpoints, me: endpoints.get(me, self.group.endpoints.get(me, ""))}
        old = self.group.endpoints
        for node in list(self._getters):
            if node not in wanted or wanted[node] != old.get(node):
                self._retire(node, now)
        for node, url in wanted.items():
            if node != me and node not in self._getters:
                getter = self._new_getter(url)
                if self._running:
                    await getter.start()
                self._getters[node] = getter
                self._getters.retiring.pop(node, None)
        for node, start in (started_ms or {}).items():
            known = self._started_ms.get(node)
            if known is not None and known != start and self._down_until.get(node, 0.0) > now:
                del self._down_until[node]  # restarted since it failed: ask it again now
            self._started_ms[node] = start
        for node in set(self._started_ms) - set(wanted):
            del self._started_ms[node]
        if wanted != dict(old):
            # Only the slots of the nodes that joined or left move; a large
            # table takes long enough to change that it leaves the loop.
            placement = await pool.run(self.group.placement.changed, wanted)
            if len(placement.nodes) > 1:  # and the table without this node, which a handover asks on the loop
                await pool.run(placement.without, me)
            self.group = PeerGroup(me, wanted, placement)
        await self._close_retired(now)

    def _retire(self, node: str, now: float) -> None:
        getter = self._getters.pop(node)
        self._getters.retiring[node] = getter
        self._retired.append((now + self._grace, getter))
        self._down_until.pop(node, None)

    async def _close_retired(self, now: float) -> None:
        due = [getter for at, getter in self._retired if at <= now]
        if not due:
            return
        self._retired = [(at, getter) for at, getter in self._retired if at > now]
        for node, getter in list(self._getters.retiring.items()):
            if getter in due:
                del self._getters.retiring[node]
        for getter in due:
            await getter.close()

    async def _ask(self, node: str, bucket: str, key: str, described: bool = True,
                   **get: Any) -> tuple[Mapping[str, str], bytes]:
        """One GET of ``node``'s object (``get``: the range, conditions and
        peer header), body read: the answer's headers (names in lower case;
        empty unless ``described``) and its bytes. ClientError for an answer
        that is not a success (the caller reads its status); PeerRefused,
        and a pause, for a node that cannot be reached."""
        if time.monotonic() < self._down_until.get(node, 0.0):
            raise PeerRefused(f"node {node} could not be reached lately")
        self.requests += 1
        try:
            getter = self._getters[node]
            if not described:
                return {}, await getter.get_bytes(Bucket=bucket, Key=key, **get)
            return await getter.get_headed(Bucket=bucket, Key=key, **get)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._down_until[node] = time.monotonic() + _PAUSE
            raise PeerRefused(f"node {node} cannot be reached: {exc!r}") from None

    async def get(
        self, node: str, bucket: str, key: str, etag: str, start: int, end: int, mode: str = HOT
    ) -> bytes | None:
        """Bytes ``[start, end)`` of the object from ``node``; None when it
        answers 503 (with HOT: not hot there yet). PeerRefused for any other
        answer, and for a node that could not be reached lately."""
        try:
            _, data = await self._ask(node, bucket, key, described=False, Range=f"bytes={start}-{end - 1}",
                                      IfMatch=f'"{etag}"', extra={PEER_HEADER: mode})
        except ClientError as exc:
            if _status(exc) == 503:
                return None
            raise PeerRefused(f"node {node}: {exc}") from None
        if len(data) != end - start:
            raise PeerRefused(f"node {node}: {len(data)} bytes for a range of {end - start}")
        self.bytes += len(data)
        return data

    async def first(self, node: str, bucket: str, key: str, length: int,
                    mode: str = FETCH) -> tuple[Mapping[str, str], int, bytes]:
        """The answer's headers (names in lower case), the whole object's
        size and its first ``length`` bytes from ``node``, which reads them
        through its own tier (``FETCH``): a mounted object's cold probe
        asked of its owner; or from its memory alone (``HOT``).
        CapacityNotFound when the owner answers 404 (it asked the source);
        PeerRefused as ``get``."""
        try:
            headers, data = await self._ask(node, bucket, key, Range=f"bytes=0-{length - 1}",
                                            extra={PEER_HEADER: mode})
        except ClientError as exc:
            if _status(exc) == 404:
                raise CapacityNotFound(f"{bucket}/{key}", node=node) from None
            raise PeerRefused(f"node {node}: {exc}") from None
        content_range = headers.get("content-range")
        try:
            total = parse_content_range(content_range)[2] if content_range else len(data)
        except BadBody:
            total = None
        if total is None or len(data) != min(length, total):
            raise PeerRefused(f"node {node}: {len(data)} bytes, not the first {length} of the object")
        self.bytes += len(data)
        return headers, total, data

    async def batch(self, node: str, bucket: str, wanted: list[tuple[str, str]]) -> dict[str, memoryview | str]:
        """The objects ``wanted`` (key, ETag) of ``bucket`` from ``node`` in
        one request: a batch (``POST ?batch``) that the owner reads through
        its own tier (``FETCH``), each member only at its ETag. Key -> its
        bytes (a view of the answer), or the S3 error code the owner gave
        for it. PeerRefused as ``get``, and for an answer that is not a
        whole archive."""
        if time.monotonic() < self._down_until.get(node, 0.0):
            raise PeerRefused(f"node {node} could not be reached lately")
        self.requests += 1
        body = json.dumps({"keys": [key for key, _ in wanted], "etags": [etag for _, etag in wanted]}).encode()
        try:
            data = await self._getters[node].post(Bucket=bucket, query="batch=", body=body,
                                                  extra={PEER_HEADER: FETCH})
        except ClientError as exc:
            raise PeerRefused(f"node {node}: {exc}") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._down_until[node] = time.monotonic() + _PAUSE
            raise PeerRefused(f"node {node} cannot be reached: {exc!r}") from None
        found: dict[str, memoryview | str] = {}
        try:
            for name, view in members(data):
                if name.startswith(ERRORS):
                    found[name[len(ERRORS):]] = bytes(view).decode("ascii", "replace")
                else:
                    found[name] = view
        except BadArchive as exc:
            raise PeerRefused(f"node {node}: {exc}") from None
        self.bytes += len(data)
        return found

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


def _status(exc: ClientError) -> int | None:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
