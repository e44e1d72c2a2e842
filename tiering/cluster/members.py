"""The registry of live nodes, in the capacity store itself.

Each node with a node id (and no static ``--peers``) keeps one small
object, ``leases/_nodes/<node id>``: its id, the S3 endpoint other nodes
reach it at, a heartbeat (wall-clock milliseconds) and the time it started.

- Every ``interval`` seconds a node writes its entry again (a heartbeat)
  with a conditional write, as leases are written (``lease.py``): created
  with ``If-None-Match: *``, then always ``If-Match`` the ETag it wrote
  last. A conflict means another process wrote the entry in between:
  another gateway started with the same node id. The node logs an error
  naming the id, reads the entry again and keeps going (its next write
  replaces the other's; the other reports the same).
- On the same interval every node lists ``leases/_nodes/`` and reads each
  entry. A node is live while its heartbeat is at most ``ttl`` old on the
  reader's clock: by default three intervals plus ``SKEW``, the clock
  difference between nodes allowed for. A node is always live to itself.
- On a clean stop a node deletes its entry, so the others drop it at
  their next listing rather than a ``ttl`` later.

Subscribers (``subscribe``) are told the live set after every listing:
the peer client (``peers.py``) follows it, so a read miss asks the owner
among the nodes live now.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass

from tiering.capacity import CapacityStore
from tiering.cluster.lease import PREFIX
from tiering.errors import CapacityConflict, CapacityError, CapacityNotFound

log = logging.getLogger("tierstore.cluster.members")

NODES = f"{PREFIX}_nodes/"
SKEW = 5.0  # seconds two nodes' wall clocks may differ by, on top of three missed heartbeats
_READS = 16  # entries read at once


@dataclass(frozen=True, slots=True)
class Member:
    """One node's entry in the registry."""

    node: str
    endpoint: str  # its S3 endpoint URL, as other nodes reach it
    heartbeat_ms: int  # wall clock of its last heartbeat
    started_ms: int  # wall clock of its start: changes when it restarts
    nonce: str  # this process's: tells its writes from another process's

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Member:
        plain = json.loads(data)
        return cls(str(plain["node"]), str(plain["endpoint"]), int(plain["heartbeat_ms"]),
                   int(plain["started_ms"]), str(plain.get("nonce", "")))


@dataclass(slots=True)
class MemberStatus:
    """A node as ``GET /tiers`` shows it."""

    node: str
    endpoint: str
    heartbeat_age: float  # seconds since its last heartbeat, on this node's clock
    live: bool
    me: bool  # this node


Subscriber = Callable[[Mapping[str, Member]], Awaitable[None]]


class Membership:
    """This node's entry in the registry, and the live nodes it lists."""

    def __init__(
        self,
        store: CapacityStore,
        node: str,
        endpoint: str,
        interval: float = 2.0,
        ttl: float | None = None,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.node = node
        self.endpoint = endpoint
        self.interval = interval
        self.ttl = ttl if ttl is not None else 3 * interval + SKEW
        self._wall = wall
        self._name = NODES + node
        self._nonce = secrets.token_hex(8)
        self._started_ms = int(wall() * 1000)
        self._tag: str | None = None  # the ETag of our entry as we last wrote (or read) it
        self._written: Member | None = None
        self.members: dict[str, Member] = {}  # every entry as last listed, live or not
        self.conflicts = 0  # heartbeats that found another process's write of our entry
        self.errors = 0
        self.last_error: str | None = None
        self._subscribers: list[Subscriber] = []
        self._task: asyncio.Task[None] | None = None

    # -- what others ask ---------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> None:
        """``callback(live)`` after every listing, with the live members by node id."""
        self._subscribers.append(callback)

    def live(self) -> dict[str, Member]:
        """The live members by node id, this node always among them."""
        now = self._wall() * 1000
        live = {node: m for node, m in self.members.items() if now - m.heartbeat_ms <= self.ttl * 1000}
        live[self.node] = self._me()
        return live

    def status(self) -> list[MemberStatus]:
        """Every node listed (live or not), and this one, by node id."""
        now = self._wall()
        known = {**self.members, self.node: self._me()}
        live = self.live()
        return [
            MemberStatus(node, m.endpoint, round(max(0.0, now - m.heartbeat_ms / 1000), 3),
                         node in live, node == self.node)
            for node, m in sorted(known.items())
        ]

    def _me(self) -> Member:
        if self._written is not None:
            return self._written
        return Member(self.node, self.endpoint, int(self._wall() * 1000), self._started_ms, self._nonce)

    # -- rounds ----------------------------------------------------------------------

    async def beat(self) -> None:
        """Write this node's entry with a fresh heartbeat."""
        record = Member(self.node, self.endpoint, int(self._wall() * 1000), self._started_ms, self._nonce)
        try:
            self._tag = await self.store.put_conditional(self._name, record.encode(), self._tag)
        except CapacityConflict:
            await self._conflict(record)
            return
        self._written = record

    async def _conflict(self, record: Member) -> None:
        """Our conditional write failed: read what is there. Our own write
        (an answer lost and retried), a leftover of an earlier run of this
        node (at start), or another process with our node id."""
        try:
            data, tag = await self.store.read_versioned(self._name)
        except CapacityNotFound:
            self._tag = None  # deleted meanwhile: created again at the next beat
            return
        found = Member.decode(data)
        self._tag = tag
        if found.nonce == self._nonce:
            self._written = found  # our own write landed (its answer was lost)
            return
        if self._written is None and found.nonce != self._nonce:
            # First beat of this process: the entry of an earlier run of this
            # node (it crashed, or was killed), or of another live process.
            log.warning(
                "node %s: replacing a registry entry written %.1f s ago by a process at %s "
                "(an earlier run of this node; if another gateway runs with this node id, it reports a conflict)",
                self.node, max(0.0, record.heartbeat_ms - found.heartbeat_ms) / 1000, found.endpoint,
            )
            try:
                self._tag = await self.store.put_conditional(self._name, record.encode(), tag)
                self._written = record
            except CapacityConflict:
                self._tag = None  # raced again: the next beat reads it afresh
                self.conflicts += 1
                log.error("node id %s: another process writes its registry entry at the same time", self.node)
            return
        self.conflicts += 1
        log.error(
            "node id %s is used by another gateway too: its registry entry (leases/_nodes/%s) was written "
            "by a process at %s that started at %d ms; give every gateway its own --node-id",
            self.node, self.node, found.endpoint, found.started_ms,
        )

    async def refresh(self) -> dict[str, Member]:
        """List the registry and read every entry; return the live members."""
        names = [name async for name, _ in self.store.list(NODES)]
        gate = asyncio.Semaphore(_READS)

        async def read(name: str) -> Member | None:
            async with gate:
                try:
                    data, _ = await self.store.read_versioned(name)
                except CapacityNotFound:
                    return None  # deleted since the listing: stopped
            try:
                return Member.decode(data)
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring a registry entry that is not a member record: %s", name)
                return None

        found = await asyncio.gather(*(read(name) for name in names if name != self._name))
        self.members = {m.node: m for m in found if m is not None and m.node != self.node}
        return self.live()

    async def round(self) -> dict[str, Member]:
        """One heartbeat and one listing; subscribers are told the live set."""
        await self.beat()
        live = await self.refresh()
        for callback in self._subscribers:
            await callback(live)
        return live

    # -- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """The first round (errors raise), then one every ``interval`` seconds."""
        await self.round()
        self._task = asyncio.create_task(self._run(), name="tierstore membership")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.round()
                self.last_error = None
            except (CapacityError, OSError) as exc:
                self.errors += 1
                self.last_error = str(exc) or type(exc).__name__
                log.warning("node registry round failed (%s); retrying", self.last_error)

    async def stop(self) -> None:
        """Stop heartbeating and delete this node's entry (if it is still
        ours), so the other nodes drop this one at their next listing."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._written is None:
            return
        try:
            data, _ = await self.store.read_versioned(self._name)
            if Member.decode(data).nonce == self._nonce:
                await self.store.delete(self._name)
        except CapacityNotFound:
            pass
        except (CapacityError, OSError, ValueError) as exc:
            log.warning("could not remove this node's registry entry (%s); it lapses in %.0f s", exc, self.ttl)
        self._written = None
