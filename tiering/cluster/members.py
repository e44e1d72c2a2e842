"""The registry of live nodes, in the capacity store itself.

Each node with a node id (and no static ``--peers``) keeps one small
object, ``leases/_nodes/<node id>``: its id, the S3 endpoint other nodes
reach it at, the time it started and the time its current run of
heartbeats began. The record does not change from one heartbeat to the
next, so neither does its ETag: what a heartbeat changes is the object's
LastModified, which a listing carries.

- Every ``interval`` seconds (the heartbeat) a node writes its entry again
  with a conditional write, as leases are written (``lease.py``): created
  with ``If-None-Match: *``, then always ``If-Match`` the ETag it wrote
  last. A conflict means another process wrote the entry in between:
  another gateway started with the same node id. The node logs an error
  naming the id, reads the entry again and keeps going (its next write
  replaces the other's; the other reports the same).
- Every ``listing`` seconds, on a timer of its own, a node lists
  ``leases/_nodes/`` once (one request per 1,000 entries) and GETs only
  the entries that are new or whose ETag changed since it read them: a
  node that started, restarted or moved. Entries no longer listed are
  forgotten. A cluster of N nodes costs the store N heartbeat PUTs and N
  listings per interval, not N² reads.
- A node is live while its last heartbeat is at most ``ttl`` old:
  ``BEATS * interval + SKEW`` by default (25 s), one heartbeat missed
  and the clock difference between nodes and the store allowed for. The
  time of a heartbeat is the entry's LastModified on the store's clock,
  never later than the reader's own clock (``_Entry.seen``). A node is
  always live to itself. Both timers are jittered, each wait drawn
  between 90% and 100% of its interval (never longer), so that nodes do
  not beat in step and the bounds hold: with the defaults (heartbeats
  every 10 s, listings every 20 s, SKEW 5 s) a crashed node is dropped by
  every node within ttl + one listing = 45 s, and a node whose listings
  are slow is never the reason another looks dead.
- Why two heartbeats and a 20 s listing, not three and 10 s (the same
  45 s): the listing is the only part whose cost grows with N (one
  request per 1,000 entries: two from 1,000 nodes on), and a heartbeat
  costs one PUT whatever N. Per node and second that is 0.1 + 0.1 with
  two pages, against 0.1 + 0.2; what it gives up is a second missed
  heartbeat, and a node wrongly judged dead costs only its share of
  reads going to the store until the next listing, never a write
  (docs/scale-out.md, ``benchmarks/cluster_cost.py``).
- A node whose heartbeats lapsed for longer than ``ttl`` (paused, cut off
  from the store) starts a new run of them (``resumed_ms``): its record,
  and so its ETag, changes.
- Dead entries are collected: an entry whose heartbeat is more than
  ``COLLECT`` ttls old (a node that crashed and never came back) is
  deleted by the live node with the lowest id, conditionally on the ETag
  it listed, so an entry written again since (the node came back, which
  changes its record as said above) is never deleted.
- On a clean stop a node deletes its entry (if it is still its own), so
  the others drop it at their next listing rather than a ``ttl`` later.

Subscribers (``subscribe``) are told the live set after every listing:
the peer client (``peers.py``) follows it, so a read miss asks the owner
among the nodes live now.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass

from tiering.capacity import CapacityStore
from tiering.capacity.store import Listed
from tiering.cluster.lease import PREFIX
from tiering.errors import CapacityConflict, CapacityError, CapacityNotFound
from tiering.settings import TierSettings

log = logging.getLogger("tierstore.cluster.members")

NODES = f"{PREFIX}_nodes/"
BEATS = 2  # heartbeat intervals an entry may age by before it is dead: one missed heartbeat
SKEW = 5.0  # seconds two nodes' (and the store's) clocks may differ by, on top of that
COLLECT = 10  # an entry this many ttls past its last heartbeat is deleted
JITTER = 0.1  # each wait is 90-100% of its interval
_READS = 16  # entries read at once


@dataclass(frozen=True, slots=True)
class Member:
    """One node's entry in the registry: the same bytes at every heartbeat
    of one run of them."""

    node: str
    endpoint: str  # its S3 endpoint URL, as other nodes reach it
    started_ms: int  # wall clock of its start: changes when it restarts
    resumed_ms: int  # wall clock of the start of its current run of heartbeats
    nonce: str  # this process's: tells its writes from another process's

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Member:
        plain = json.loads(data)
        started = int(plain["started_ms"])
        return cls(str(plain["node"]), str(plain["endpoint"]), started,
                   int(plain.get("resumed_ms", started)), str(plain.get("nonce", "")))


@dataclass(slots=True)
class _Entry:
    """A registry entry as this node last listed it."""

    member: Member | None  # None: not a member record (logged once)
    etag: str  # of the record read
    modified: float  # its LastModified as last listed
    seen: float  # this node's wall clock for its last heartbeat


def _seen(listed: Listed, now: float) -> float:
    """When ``listed`` was last written, on this node's clock: the store's
    LastModified, but never in this node's future (a store clock ahead of
    ours would make a dead node live for longer)."""
    return min(now, listed.modified)


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
        interval: float = 10.0,
        ttl: float | None = None,
        *,
        listing: float | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``interval``: seconds between heartbeats; ``listing``: between
        listings (default: ``interval``)."""
        self.store = store
        self.node = node
        self.endpoint = endpoint
        self.interval = interval
        self.listing = listing if listing is not None else interval
        self.ttl = ttl if ttl is not None else BEATS * interval + SKEW
        self._wall = wall
        self._name = NODES + node
        self._nonce = secrets.token_hex(8)
        self._started_ms = self._resumed_ms = int(wall() * 1000)
        self._tag: str | None = None  # the ETag of our entry as we last wrote (or read) it
        self._written: Member | None = None
        self._beat_at: float | None = None  # wall clock of our last heartbeat that landed
        self._entries: dict[str, _Entry] = {}  # every other entry as last listed, by name
        self._listed_at: float | None = None  # wall clock of the start of the last listing
        self.conflicts = 0  # heartbeats that found another process's write of our entry
        self.collected = 0  # dead entries this node deleted
        self.errors = 0
        self.last_error: str | None = None
        self._subscribers: list[Subscriber] = []
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def of(cls, store: CapacityStore, node: str, endpoint: str, settings: TierSettings) -> Membership:
        """A node's membership on its settings' intervals."""
        return cls(store, node, endpoint, settings.heartbeat_interval, listing=settings.members_interval)

    # -- what others ask ---------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> None:
        """``callback(live)`` after every listing, with the live members by node id."""
        self._subscribers.append(callback)

    def live(self) -> dict[str, Member]:
        """The live members by node id, this node always among them: as of
        the last listing, when each entry's age was last known. (Judged on
        the clock now, an entry would age by up to a listing interval it was
        never given: with the defaults, a node that beat 10 s before one
        listing would look dead 20 s later, just before the next.)"""
        at = self._listed_at if self._listed_at is not None else self._wall()
        live = {e.member.node: e.member for e in self._entries.values()
                if e.member is not None and e.member.node != self.node and at - e.seen <= self.ttl}
        live[self.node] = self._me()
        return live

    def status(self) -> list[MemberStatus]:
        """Every node listed (live or not), and this one, by node id."""
        now = self._wall()
        seen = {e.member.node: (e.member, e.seen) for e in self._entries.values()
                if e.member is not None and e.member.node != self.node}
        seen[self.node] = (self._me(), self._beat_at if self._beat_at is not None else now)
        live = self.live()
        return [
            MemberStatus(node, m.endpoint, round(max(0.0, now - at), 3), node in live, node == self.node)
            for node, (m, at) in sorted(seen.items())
        ]

    def _me(self) -> Member:
        if self._written is not None:
            return self._written
        return Member(self.node, self.endpoint, self._started_ms, self._resumed_ms, self._nonce)

    # -- heartbeats ------------------------------------------------------------------

    async def beat(self) -> None:
        """Write this node's entry again: a heartbeat."""
        now = self._wall()
        if self._beat_at is not None and now - self._beat_at > self.ttl:
            # The others may have judged us dead, and one may be about to
            # delete the entry it listed: a new record, so that delete fails.
            self._resumed_ms = int(now * 1000)
        record = Member(self.node, self.endpoint, self._started_ms, self._resumed_ms, self._nonce)
        try:
            self._tag = await self.store.put_conditional(self._name, record.encode(), self._tag)
        except CapacityConflict:
            await self._conflict(record)
            return
        self._landed(record, now)

    def _landed(self, record: Member, at: float) -> None:
        self._written = record
        self._beat_at = at

    async def _conflict(self, record: Member) -> None:
        """Our conditional write failed: read what is there. Our own write
        (an answer lost and retried), a leftover of an earlier run of this
        node (at start), or another process with our node id."""
        try:
            data, tag = await self.store.read_versioned(self._name)
        except CapacityNotFound:
            # Deleted meanwhile (collected while we were away): written again
            # now rather than a heartbeat later.
            self._tag = None
            try:
                self._tag = await self.store.put_conditional(self._name, record.encode(), None)
                self._landed(record, self._wall())
            except CapacityConflict:
                pass  # created by another process meanwhile: the next beat reads it
            return
        found = Member.decode(data)
        self._tag = tag
        if found.nonce == self._nonce:
            self._landed(found, self._wall())  # our own write landed (its answer was lost)
            return
        if self._written is None:
            # First beat of this process: the entry of an earlier run of this
            # node (it crashed, or was killed), or of another live process.
            log.warning(
                "node %s: replacing a registry entry of a process at %s that started at %d ms "
                "(an earlier run of this node; if another gateway runs with this node id, it reports a conflict)",
                self.node, found.endpoint, found.started_ms,
            )
            try:
                self._tag = await self.store.put_conditional(self._name, record.encode(), tag)
                self._landed(record, self._wall())
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

    # -- listings --------------------------------------------------------------------

    async def refresh(self) -> dict[str, Member]:
        """List the registry, read the entries that changed, collect dead
        ones; return the live members."""
        now = self._wall()
        entries: dict[str, _Entry] = {}
        changed: list[Listed] = []
        async for listed in self.store.list_entries(NODES):
            if listed.name == self._name:
                continue
            known = self._entries.get(listed.name)
            if known is None or known.etag != listed.etag:
                changed.append(listed)
                continue
            if known.modified != listed.modified:
                known.modified, known.seen = listed.modified, _seen(listed, now)
            entries[listed.name] = known
        gate = asyncio.Semaphore(_READS)
        read = await asyncio.gather(*(self._read(listed, now, gate) for listed in changed))
        entries.update((listed.name, entry) for listed, entry in zip(changed, read, strict=True)
                       if entry is not None)
        self._entries = entries  # what was not listed is forgotten
        self._listed_at = now
        live = self.live()
        if min(live) == self.node:
            await self._collect(now)
        return live

    async def _read(self, listed: Listed, now: float, gate: asyncio.Semaphore) -> _Entry | None:
        """The entry ``listed`` read whole; None when it was deleted since."""
        async with gate:
            try:
                data, tag = await self.store.read_versioned(listed.name)
            except CapacityNotFound:
                return None  # deleted since the listing: stopped
        try:
            member: Member | None = Member.decode(data)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a registry entry that is not a member record: %s", listed.name)
            member = None
        return _Entry(member, tag, listed.modified, _seen(listed, now))

    async def _collect(self, now: float) -> None:
        """Delete the entries whose last heartbeat is more than COLLECT
        ttls old, each only at the version listed (this node is the live
        node with the lowest id: one node does it)."""
        for name, entry in list(self._entries.items()):
            if now - entry.seen <= COLLECT * self.ttl:
                continue
            try:
                await self.store.delete_conditional(name, entry.etag)
            except CapacityConflict:
                continue  # written again since it was listed: it came back
            del self._entries[name]
            self.collected += 1
            log.info("removed the registry entry %s: no heartbeat for %.0f s", name, now - entry.seen)

    # -- rounds ----------------------------------------------------------------------

    async def round(self) -> dict[str, Member]:
        """One heartbeat and one listing; subscribers are told the live set."""
        await self.beat()
        return await self._listed()

    async def _listed(self) -> dict[str, Member]:
        live = await self.refresh()
        for callback in self._subscribers:
            await callback(live)
        return live

    # -- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """The first round (errors raise), then heartbeats every ``interval``
        and listings every ``listing`` seconds, each on its own timer."""
        await self.round()
        self._tasks = [
            asyncio.create_task(self._every(self.interval, self.beat, "heartbeat"), name="tierstore heartbeat"),
            asyncio.create_task(self._every(self.listing, self._listed, "listing"), name="tierstore membership"),
        ]

    async def _every(self, interval: float, step: Callable[[], Awaitable[object]], what: str) -> None:
        while True:
            await asyncio.sleep(interval * (1 - JITTER * random.random()))
            try:
                await step()
                self.last_error = None
            except (CapacityError, OSError) as exc:
                self.errors += 1
                self.last_error = str(exc) or type(exc).__name__
                log.warning("node registry %s failed (%s); retrying", what, self.last_error)

    async def stop(self) -> None:
        """Stop heartbeating and delete this node's entry (if it is still
        ours), so the other nodes drop this one at their next listing."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []
        if self._written is None or self._tag is None:
            return
        try:
            await self.store.delete_conditional(self._name, self._tag)
        except CapacityConflict:
            pass  # another process's entry now: not ours to delete
        except (CapacityError, OSError) as exc:
            log.warning("could not remove this node's registry entry (%s); it lapses in %.0f s", exc, self.ttl)
        self._written = None
