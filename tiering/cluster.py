"""Many gateway nodes over one capacity store: one writer, the rest replicas.

Each node keeps its own index and hot tier; the capacity store is the only
state they share, and they coordinate through it alone (``tiering/lease.py``):

- The node that holds the store's write lease (``leases/_store``) is the
  writer: it flushes, compacts and takes writes to managed buckets. Every
  other node is a replica: it serves reads from its own index and hot tier,
  answers writes with ``NotWriter`` naming the writer, and follows.
- A segment's name is its writer's term in the top bits and a sequence in
  the low ones (16 hex digits either way, as on a single node, whose term
  is 0). Names sort in write order within a term, and every term after
  every earlier one.
- Following: a replica lists the segments after the last one it applied,
  *then* reads the lease, then applies what it listed in order
  (``Index.apply_segment``). Reading the lease after the listing is what
  makes the seal rule below safe.
- Seals: a node that takes the lease over (term t) first applies every
  segment of the earlier terms, then writes, for each earlier term it saw,
  a seal naming that term's last segment it applied. A segment of an ended
  term that lands after that (an upload the old writer started before it
  lost the lease) sorts after the seal and is ignored by every node, and
  deleted by the new writer; a replica that lists a segment of an ended
  term before its seal exists waits for the seal. So every node applies
  the same history.
- A writer acknowledges a write-through write only if its lease was still
  valid when the segment landed (``Flusher``), so an acknowledged write is
  always in a segment the next writer applies before it writes.
- A writer that cannot renew (it lost the lease, or its lease ran out on
  its own clock) stops flushing and compacting and refuses writes at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tiering import _pool
from tiering.capacity import CapacityStore
from tiering.compact import read_footer
from tiering.errors import CapacityConflict, CapacityError, CapacityNotFound, NotWriter, ServiceUnavailable
from tiering.fetch import list_segments
from tiering.hot import HotTier
from tiering.index import Index
from tiering.lease import PREFIX as LEASE_PREFIX
from tiering.lease import Lease, LeaseRecord
from tiering.meta import now_ms
from tiering.policy import Policies
from tiering.settings import TierSettings

log = logging.getLogger("tierstore.cluster")

TERM_SHIFT = 40  # a segment name is (term << 40 | sequence) in 16 hex digits
LEASE_NAME = "_store"  # leases/_store: no bucket name starts with "_"
SEAL_PREFIX = "leases/_store-seals/"  # + term in 8 hex digits: its last valid segment
PRUNE_EVERY = 30  # follow rounds between full listings that drop deleted segments


def term_of(name: str) -> int:
    """The write term a segment name was issued in (0: a single node's)."""
    return int(name, 16) >> TERM_SHIFT


def seal_name(term: int) -> str:
    return f"{SEAL_PREFIX}{term:08x}"


async def store_lease(capacity: CapacityStore) -> LeaseRecord | None:
    """The store's write lease as it is now; None on a store no gateway with
    a node id has used (a single gateway's)."""
    try:
        data, _ = await capacity.read_versioned(LEASE_PREFIX + LEASE_NAME)
    except CapacityNotFound:
        return None
    return LeaseRecord.decode(data)


APPLY, SKIP, WAIT = "apply", "skip", "wait"


class Seals:
    """The seals of ended terms in one store, each read once it exists."""

    def __init__(self, capacity: CapacityStore) -> None:
        self._capacity = capacity
        self._known: dict[int, str] = {}

    async def get(self, term: int) -> str | None:
        """The last valid segment of ended ``term`` (None: not sealed yet)."""
        if term not in self._known:
            try:
                data, _ = await self._capacity.read_versioned(seal_name(term))
            except CapacityNotFound:
                return None
            self._known[term] = data.decode()
        return self._known[term]

    async def verdict(self, name: str, current: int) -> str:
        """Whether a segment counts, the lease's term being ``current``:
        APPLY, SKIP (written after its term was sealed) or WAIT (its term
        ended and is not sealed yet: a takeover is under way)."""
        term = term_of(name)
        if term >= current:
            return APPLY
        seal = await self.get(term)
        if seal is None:
            return WAIT
        return SKIP if name > seal else APPLY

    async def write(self, term: int, name: str) -> None:
        """Seal ended ``term`` at ``name`` (kept as it is if already sealed)."""
        try:
            await self._capacity.put_conditional(seal_name(term), name.encode(), None)
            self._known[term] = name
        except CapacityConflict:
            written = await self.get(term)
            if written != name:
                log.warning("term %d was sealed at %s, this node applied up to %s", term, written, name)


@dataclass(slots=True)
class ClusterStatus:
    node: str
    role: str  # "writer" or "replica"
    writer: str | None  # the lease holder as last read (None: no lease yet)
    term: int  # the lease's term as last read
    lease_expires_ms: int
    applied: str  # the last segment this node applied ("" for none)
    lag_seconds: float | None  # since this node last had applied all the store held (None: never yet)
    lag_segments: int  # segments listed but not yet applied
    follow_rounds: int
    errors: int
    last_error: str | None


class Cluster:
    """This node's part among several gateways over one capacity store.

    ``start_writing`` is called once when the node becomes the writer (at
    start or on a takeover): it starts the flusher and compactor."""

    def __init__(
        self,
        index: Index,
        hot: HotTier,
        capacity: CapacityStore,
        settings: TierSettings,
        policies: Policies,
        region: str,
        start_writing: Callable[[], Awaitable[None]],
    ) -> None:
        assert settings.node_id is not None
        self.node = settings.node_id
        self._index = index
        self._policies = policies
        self._hot = hot
        self._capacity = capacity
        self._settings = settings
        self._region = region
        self._start_writing = start_writing
        ttl = settings.lease_ttl
        self.lease = Lease(capacity, LEASE_NAME, self.node, ttl, skew=min(5.0, ttl / 4))
        self.role = "replica"
        self._seals = Seals(capacity)
        self._renewed = 0.0  # monotonic time of the last renewal
        self._current_at: float | None = None  # monotonic: when the last complete round listed
        self._behind = 0
        self._rounds = 0
        self._errors = 0
        self._last_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    # -- what the rest of the node asks -------------------------------------

    @property
    def writing(self) -> bool:
        """True while this node may write segments: it is the writer and
        its lease is still valid on its own clock."""
        return self.role == "writer" and self.lease.held

    def check_write(self) -> None:
        """Raise unless this node takes writes to managed buckets now."""
        if self.writing:
            return
        record = self.lease.record
        if record is not None and record.holder != self.node and record.expires_ms > now_ms():
            raise NotWriter(
                f"This gateway ({self.node}) serves managed buckets read-only: "
                f"node {record.holder} holds the write lease, send writes there",
                Writer=record.holder,
            )
        raise ServiceUnavailable(
            f"No gateway holds the write lease right now (node {self.node} is "
            f"{'renewing' if self.role == 'writer' else 'waiting to take it over'}); retry shortly"
        )

    def status(self) -> ClusterStatus:
        record = self.lease.record
        lag: float | None = 0.0
        if self.role == "replica":
            lag = None if self._current_at is None else round(time.monotonic() - self._current_at, 3)
        return ClusterStatus(
            node=self.node,
            role=self.role,
            writer=record.holder if record is not None and record.expires_ms > 0 else None,
            term=record.term if record is not None else 0,
            lease_expires_ms=record.expires_ms if record is not None else 0,
            applied=self._index.follow_point,
            lag_seconds=lag,
            lag_segments=0 if self.role == "writer" else self._behind,
            follow_rounds=self._rounds,
            errors=self._errors,
            last_error=self._last_error,
        )

    # -- life cycle ----------------------------------------------------------

    async def start(self) -> None:
        """Catch up with the store, take the lease if nobody holds it, and
        keep following (or renewing) in the background."""
        await self.follow()
        await self._take_if_free()
        self._task = asyncio.create_task(self._run(), name="tierstore cluster")

    async def stop(self, release: bool = True) -> None:
        """Stop; a writer gives its lease up so another node need not wait
        out its expiry (nothing is left to flush by then)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if release and self.writing:
            try:
                await self.lease.release()
            except (CapacityError, OSError) as exc:
                log.warning("could not release the write lease (%s); it expires on its own", exc)
        self.role = "replica"

    async def _run(self) -> None:
        while True:
            writer = self.role == "writer"
            await asyncio.sleep(self.lease.ttl / 6 if writer else self._settings.follow_interval)
            try:
                if writer:
                    await self._renew()
                else:
                    await self.follow()
                    await self._take_if_free()
                self._last_error = None
            except (CapacityError, OSError) as exc:
                self._errors += 1
                self._last_error = str(exc) or type(exc).__name__
                log.warning("cluster round failed (%s); retrying", self._last_error)

    async def _renew(self) -> None:
        if time.monotonic() - self._renewed < self.lease.ttl / 3 and self.lease.held:
            return
        started = time.monotonic()
        if await self.lease.renew():
            self._renewed = started
            return
        self.role = "replica"
        log.error(
            "node %s lost the write lease to %s: flushing stopped, writes refused from now on",
            self.node, self.lease.holder,
        )

    # -- taking the lease ------------------------------------------------------

    async def _take_if_free(self) -> None:
        record = self.lease.record
        if record is not None and record.holder != self.node and not self.lease.takeable(record):
            return
        if not await self.lease.acquire():
            return
        self._renewed = time.monotonic()
        term = self.lease.record.term  # type: ignore[union-attr]
        await self._catch_up(term)
        await _pool.run(self._index.issue_names_from, term << TERM_SHIFT)
        await self._prune()
        self.role = "writer"
        log.info("node %s is the writer (term %d)", self.node, term)
        await self._start_writing()

    async def _catch_up(self, term: int) -> None:
        """Apply every segment of the terms before ``term`` (we hold the
        lease, so no valid one can appear any more), then seal each."""
        last: dict[int, str] = {}
        if point := self._index.follow_point:
            last[term_of(point)] = point
        async for name, size in list_segments(self._capacity, after=self._index.follow_point):
            if term_of(name) >= term:
                continue  # our own, from an earlier start in this term
            if await self._seals.verdict(name, term) == SKIP:
                continue
            await self._apply(name, size)
            last[term_of(name)] = name
        for ended, name in sorted(last.items()):
            if ended < term and await self._seals.get(ended) is None:
                await self._seals.write(ended, name)

    # -- following ---------------------------------------------------------------

    async def follow(self) -> int:
        """One round: apply the segments written since the last round, in
        order; return how many were applied."""
        started = time.monotonic()
        listed = [item async for item in list_segments(self._capacity, after=self._index.follow_point)]
        record = await self.lease.read()  # after the listing: see the module notes
        current = record.term if record is not None else 0
        applied = waiting = 0
        for index, (name, size) in enumerate(listed):
            verdict = await self._seals.verdict(name, current)
            if verdict == WAIT:
                waiting = len(listed) - index
                break  # the new writer is still catching up: its seal comes next
            if verdict == APPLY:
                await self._apply(name, size)
                applied += 1
        self._behind = waiting
        if not waiting:
            self._current_at = started
        self._rounds += 1
        if self._rounds % PRUNE_EVERY == 0:
            await self._prune()
        return applied

    async def _apply(self, name: str, size: int) -> None:
        if self._index.get_segment(name) is not None:  # written or recovered here: nothing to read
            await _pool.run(self._index.advance_follow_point, name)
            return
        footer = await read_footer(self._capacity, name)
        gone, buckets = await _pool.run(self._index.apply_segment, size, footer, self._region)
        for bucket in buckets:
            self._policies.changed(bucket)
        cached = [c.extent.cache_name for c in gone if c.extent is not None]
        if cached:
            await _pool.run(self._hot.drop_cached, cached)

    async def _prune(self) -> None:
        """Forget segments the writer's compaction deleted from the store."""
        present = {name async for name, _ in list_segments(self._capacity)}
        known = await _pool.run(self._index.segments)
        missing = [s.name for s in known if s.name not in present]
        if missing:
            await _pool.run(self._index.forget_segments, missing)
