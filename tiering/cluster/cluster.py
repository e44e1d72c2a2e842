"""Many gateway nodes over one capacity store: one writer per bucket.

Each node keeps its own index and hot tier; the capacity store is the only
state they share, and they coordinate through it alone (``tiering/cluster/lease.py``):

- A bucket's writer is the node that holds its write lease
  (``leases/<bucket>``). It takes the lease when a client first writes the
  bucket through it and nobody else holds it; it flushes and compacts that
  bucket. Every other node serves the bucket read-only, answers writes with
  ``NotWriter`` naming the writer, and follows. Different buckets may have
  different writers at the same time.
- Terms: every acquisition of a bucket's lease claims a new store-wide
  term number (``leases/_terms/<term>``, created once, naming the bucket)
  and writes it into the lease. A segment's name is its term in the top 24
  bits and a sequence in the low 40, so writers never collide; a segment
  holds one bucket's data and records, the bucket of its term. A single
  gateway's segments are term 0 and may mix buckets.
- Following: each round a node lists, per term it has not closed, the
  segments after the last one it applied, *then* reads the term registry
  (and, if a later term of that bucket exists, the bucket's lease), then
  applies what it listed (``Index.apply_segment``). A bucket's terms apply
  in order: a term only after every earlier term of its bucket is closed,
  and any term only after term 0 is. A round runs when there is news
  (``news.py``): a writer's notice that it committed segments, or, read
  every ``follow_fallback`` seconds, a change of the follow head
  (``head.py``), read before the round lists; an idle node runs none.
- Seals: a node that takes a bucket over first applies every segment of
  the bucket's earlier terms, then writes for each a seal naming its last
  segment (``leases/_seals/<term>``; the first node ever to take a lease
  seals term 0 the same way). A segment that lands after its term's seal
  (an upload its writer started before it lost the lease) is ignored by
  every node and deleted by the bucket's writer; a node that lists a
  segment of a term whose lease moved on waits for the seal. Reading the
  registry and lease after the listing is what makes this safe: a seal
  exists only after its successor's lease was taken, so a segment listed
  before the lease still showed its term was written before the seal.
- A writer commits a segment (and acknowledges the write-through writes in
  it) only if the bucket's lease was still valid, in the term that named
  the segment, when it landed (``Flusher``): an acknowledged write is always
  in a segment the next writer applies before it writes. A segment that
  fails this is sealed out or will be; its writes stay queued and are
  flushed again in the node's next term.
- A writer that cannot renew a lease (it was taken, or it ran out on its
  own clock) stops flushing and compacting that bucket and refuses its
  writes at once (503 while its renewal is unanswered, NotWriter once it
  knows the new holder). A write is acknowledged only if the lease it was
  checked under is still held, in the same term, once it has committed;
  held means less than ``ttl - skew`` on this node's clock since the
  renewal, and another node takes over only ``skew`` after the expiry on
  its own (``lease.py``): a node cut off from the store stops acknowledging
  before anyone can take its buckets. A write whose lease check needs the
  store waits for it at most ``min(write_through_timeout, ttl)``, then 503.
- Newest acknowledged write wins, across terms: a node that takes a lease
  raises its sequence counter to ``term << 40`` before it acknowledges a
  write. Terms are claimed in real-time order and every node keeps the
  version with the higher sequence, so a write acknowledged in a term
  outranks every write acknowledged in the bucket's earlier terms, flushed
  or not. A cut-off writer keeps its unflushed writes queued, takes the
  bucket back once it is free (``_reclaim``) and flushes them in its new
  term; a key the writer between wrote keeps that newer version (the old
  one is superseded at catch-up and its queue entry dropped as stale).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from packer.format import Footer
from tiering import pool
from tiering.capacity import CapacityStore
from tiering.capacity.layout import list_segments, read_footer
from tiering.cluster.catchup import Earlier, catch_up
from tiering.cluster.footers import ReadAhead, forget_deleted
from tiering.cluster.head import Change, Head
from tiering.cluster.lease import Lease, check_conditional_writes
from tiering.cluster.members import Membership
from tiering.cluster.news import Publisher, Watch
from tiering.cluster.state import Checks, ClusterStatus, Held, Round
from tiering.cluster.terms import LEGACY, Seals, Terms, term_prefix
from tiering.errors import (
    CapacityError,
    InsufficientStorage,
    NotWriter,
    ServiceUnavailable,
    SlowDown,
)
from tiering.hot.tier import HotTier
from tiering.index.bucket_settings import Policies
from tiering.index.db import Index
from tiering.index.keys import FOLLOW_CLOSED, TERM_SHIFT, term_of
from tiering.index.tiers import QUEUE_BATCH as _QUEUE_BATCH
from tiering.index.tiers import by_bucket
from tiering.meta import now_ms
from tiering.settings import TierSettings

log = logging.getLogger("tierstore.cluster")

_SEQUENCE = (1 << TERM_SHIFT) - 1

APPLY, SKIP, WAIT = "apply", "skip", "wait"


class Cluster:
    """This node's part among several gateways over one capacity store.

    ``start_writing`` is called when the node takes its first bucket: it
    starts the flusher and compactor (once)."""

    per_bucket = True

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
        self._ttl = settings.lease_ttl
        self._skew = min(5.0, self._ttl / 4)
        self._terms = Terms(capacity)
        self._seals = Seals(capacity)
        self._earlier = Earlier(capacity, index, self._terms, self._seals)  # what a takeover catches up with
        self._leases: dict[str, Lease] = {}  # every bucket lease this node has read
        self._read_at: dict[str, float] = {}  # monotonic: when each was last read
        self._held: dict[str, Held] = {}
        self._writers: dict[str, int] = {}  # bucket -> the newest term this node saw write it
        self._taking = Checks()  # each bucket's lease being checked or taken, for the writes that wait
        # Buckets whose lease this node lost with writes of them still queued.
        self._stranded: set[str] = set()
        self._applying = asyncio.Lock()  # one of: a follow round, a takeover's catch-up
        self._current_at: float | None = None  # monotonic: when the last complete round listed
        self._behind = 0
        self._rounds = 0
        self._errors = 0
        self._last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        # What tells this node to follow (``watch.nudge``: a writer's notice), and
        # what tells the other nodes this one wrote (news.py).
        registry = settings.advertise_url is not None  # the node registry's (members.py), not fixed --peers
        self._head = Head(capacity)
        self.watch = Watch(self._head, settings.follow_interval, settings.follow_fallback,
                           settle=settings.members_interval if registry else 0.0)
        self.publisher = Publisher(self._head)
        self._pruned: dict[str, int] | None = None  # the head's deletions at the last prune (None: not yet)
        # The live nodes (with an advertised endpoint).
        self.members = Membership.of(capacity, self.node, settings.advertise_url, settings) if registry else None

    # -- what the flusher and compactor ask (tiering/cluster/writing.py) -------------

    def may_write(self, bucket: str) -> bool:
        held = self._held.get(bucket)
        return held is not None and held.lease.held

    def check(self, bucket: str, segment: str | None = None) -> None:
        if self.may_write(bucket):
            held = self._held[bucket]
            if segment is None or term_of(segment) == held.term:
                return
            raise ServiceUnavailable(
                f"segment {segment} of bucket {bucket} landed after its term ended (now {held.term}); "
                "its writes are flushed again"
            )
        lease = self._leases.get(bucket)
        record = lease.record if lease is not None else None
        if record is not None and record.holder != self.node and record.expires_ms > now_ms():
            raise NotWriter(
                f"This gateway ({self.node}) serves bucket {bucket} read-only: node "
                f"{record.holder} holds its write lease, send writes there",
                Writer=record.holder,
            )
        raise ServiceUnavailable(
            f"No gateway holds the write lease of bucket {bucket} right now; retry shortly"
        )

    async def name(self, bucket: str) -> str:
        self.check(bucket)
        held = self._held[bucket]
        held.issued += 1
        if held.issued > _SEQUENCE:
            raise ServiceUnavailable(f"write term {held.term} of bucket {bucket} is out of names")
        return f"{held.term << TERM_SHIFT | held.issued:016x}"

    def bucket_of(self, segment: str) -> str | None:
        return self._terms.bucket(term_of(segment))

    def compactable(self, segment: str) -> bool:
        bucket = self.bucket_of(segment)
        return bucket is not None and self.may_write(bucket)

    def committed(self, bucket: str, segment: str) -> None:
        self.publisher.add(bucket, Change(term_of(segment), segment))

    def deleted(self, bucket: str, count: int) -> None:
        held = self._held.get(bucket)
        if held is not None:
            self.publisher.add(bucket, Change(held.term, deleted=count))

    # -- what a write asks -----------------------------------------------------

    @contextlib.asynccontextmanager
    async def writing_to(self, bucket: str) -> AsyncIterator[None]:
        """Around one write to ``bucket`` (``Tiers.writing_to``): the lease is
        checked (or taken) first and not given up for idleness until the
        write has committed."""
        await self.check_write(bucket)
        held = self._held[bucket]
        held.active += 1
        held.writes += 1
        held.written = time.monotonic()
        try:
            yield
        finally:
            held.active -= 1
        held.acknowledge(bucket, self._held.get(bucket))

    async def check_write(self, bucket: str) -> None:
        """Return once this node may take writes to ``bucket``: it holds the
        bucket's lease, or took it now (free or expired) and caught up.
        NotWriter if another node holds it; 503 if its own lapsed unrenewed
        or the store did not answer within the write's bound."""
        if self.may_write(bucket) and not self._held[bucket].releasing:
            return
        if bucket in self._held:
            self._held[bucket].refuse_if_lapsed(bucket)
        await self._taking.wait(bucket, self._check_or_take, min(self._settings.write_through_timeout, self._ttl))

    async def _check_or_take(self, bucket: str) -> None:
        if bucket in self._held and self._held[bucket].releasing:
            raise ServiceUnavailable(f"This gateway is giving up bucket {bucket}'s idle write lease; retry")
        if self.may_write(bucket):
            return
        lease = self._lease(bucket)
        if time.monotonic() - self._read_at.get(bucket, -1e9) > self._settings.follow_interval:
            await lease.read()
            self._read_at[bucket] = time.monotonic()
        record = lease.record
        if record is not None and record.holder != self.node and not lease.takeable(record):
            self.check(bucket)  # raises NotWriter (or 503 on a released lease being retaken)
        await self._take(bucket, lease)

    async def _take(self, bucket: str, lease: Lease) -> None:
        started = time.monotonic()
        if not await lease.acquire(lambda above: self._terms.claim(bucket, self.node, above)):
            self._read_at[bucket] = time.monotonic()
            self.check(bucket)
        term = lease.record.term  # type: ignore[union-attr]
        async with self._applying:
            await catch_up(self._earlier, bucket, term, self._apply, self._close_if_done)
        # From here, its writes outrank all of the earlier terms' (module notes).
        await pool.run(self._index.raise_seq, term << TERM_SHIFT)
        self._held[bucket] = Held(lease, term, started, written=started)
        self._stranded.discard(bucket)
        self._wrote(term)
        self.publisher.add(bucket, Change(term))  # the other nodes learn of the new term
        log.info("node %s writes bucket %s (term %d)", self.node, bucket, term)
        await self._start_writing()

    # -- status ----------------------------------------------------------------

    def writes(self) -> list[str]:
        """The buckets whose write lease this node holds now."""
        return sorted(b for b in self._held if self.may_write(b))

    def status(self) -> ClusterStatus:
        writing = self.writes()
        writers = {bucket: self._terms.known[term].node for bucket, term in sorted(self._writers.items())}
        return ClusterStatus(
            node=self.node,
            role="writer" if writing else "replica",
            writing=writing,
            writers=writers,
            terms=self._terms.last,
            lag_seconds=self.watch.lag(self._current_at, self._behind),
            lag_segments=self._behind,
            follow_rounds=self._rounds,
            pushes=self.watch.pushes,
            head_looks=self.watch.looks,
            head_updates=self._head.updates,
            errors=self._errors,
            last_error=self._last_error,
            members=self.members.status() if self.members is not None else None,
        )

    # -- life cycle ----------------------------------------------------------

    async def start(self) -> None:
        """Catch up with the store, take the buckets this node has unflushed
        writes of (if nobody else holds them), and keep following (and
        renewing the leases it takes) in the background. A store without
        conditional writes is refused first."""
        await check_conditional_writes(self._capacity, self.node)
        if self.members is not None:
            await self.members.start()
        await self.follow_news(now=True)
        for term in await pool.run(self._index.follow_points):
            self._wrote(term)
        for bucket in await self._queued_buckets():
            try:
                await self.check_write(bucket)
            except (NotWriter, ServiceUnavailable) as exc:
                self._stranded.add(bucket)
                log.warning("node %s keeps unflushed writes of %s: %s", self.node, bucket, exc)
        self._task = asyncio.create_task(self._run(), name="tierstore cluster")

    async def _queued_buckets(self) -> set[str]:
        items = await pool.run(self._index.flush_queue, _QUEUE_BATCH)
        records = await pool.run(self._index.pending_records, _QUEUE_BATCH)
        return set(by_bucket(items, records))

    async def stop(self, release: bool = True) -> None:
        """Stop; with ``release``, give up the leases this node holds so
        other nodes need not wait out their expiry (nothing is left to
        flush by then)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await self.publisher.close()  # what the last flush committed
        if self.members is not None:
            await self.members.stop()
        if release:
            for bucket in self.writes():
                try:
                    await self._held[bucket].lease.release()
                except (CapacityError, OSError) as exc:
                    log.warning("could not release the lease of %s (%s); it expires on its own", bucket, exc)
        self._held.clear()

    async def _run(self) -> None:
        tick = min(self._settings.follow_interval, self._ttl / 6)
        while True:
            await self.watch.wait(tick)
            try:
                await self._renew()
                await self._reclaim()
                await self.follow_news()
                self._last_error = None
            except (CapacityError, OSError, SlowDown, InsufficientStorage) as exc:  # the last two: a full disk
                self._errors += 1
                self._last_error = str(exc) or type(exc).__name__
                log.warning("cluster round failed (%s); retrying", self._last_error)

    async def _renew(self) -> None:
        for bucket, held in list(self._held.items()):
            idle = self._settings.lease_idle
            if idle and time.monotonic() - held.written > idle and not held.active:
                if await self._release_idle(bucket, held):
                    continue
            if time.monotonic() - held.renewed < self._ttl / 3 and held.lease.held:
                continue
            started = time.monotonic()
            if await held.renew():
                held.renewed = started
                continue
            del self._held[bucket]
            self._stranded.add(bucket)  # until its queue is known to be empty
            log.error(
                "node %s lost the write lease of %s to %s: its writes are refused from now on",
                self.node, bucket, held.lease.holder,
            )

    async def _reclaim(self) -> None:
        """Take back, once free, each bucket this node lost with acknowledged
        writes still queued: only its writer may flush them (lease read at
        most once a follow interval; the writes wait here meanwhile)."""
        self._stranded &= await self._queued_buckets() if self._stranded else set()
        for bucket in sorted(self._stranded - set(self._held)):
            try:
                await self.check_write(bucket)
            except (NotWriter, ServiceUnavailable):
                continue
            log.info("node %s took bucket %s back to flush the writes it acknowledged before", self.node, bucket)

    async def _release_idle(self, bucket: str, held: Held) -> bool:
        """Give up the lease of a bucket nothing was written to for
        ``lease_idle`` seconds, so that another node can take it at once;
        only with no write under way and nothing of it left to flush (or
        an open multipart upload, whose parts only this node knows)."""
        writes = held.writes  # a write checked from here on keeps the lease: the bucket is not idle
        if await pool.run(self._index.has_uploads, bucket) or bucket in await self._queued_buckets():
            return False
        if held.active or held.writes != writes:
            return False
        held.releasing = True  # from here (no await since the check), writes get 503 until it is released
        try:
            await held.lease.release()
        finally:
            held.releasing = False
        del self._held[bucket]
        log.info("node %s gave up the idle write lease of %s (term %d)", self.node, bucket, held.term)
        return True

    def _wrote(self, term: int) -> None:
        """A segment of ``term`` counted: its node writes (or wrote) its bucket."""
        bucket = self._terms.bucket(term)
        if bucket is not None and term > self._writers.get(bucket, 0):
            self._writers[bucket] = term

    def _lease(self, bucket: str) -> Lease:
        if bucket not in self._leases:
            self._leases[bucket] = Lease(self._capacity, bucket, self.node, self._ttl, skew=self._skew)
        return self._leases[bucket]

    # -- following ---------------------------------------------------------------

    async def follow(self) -> int:
        """One round: apply the segments written since the last round, in
        each bucket's order; return how many were applied."""
        async with self._applying:
            return await self._follow()

    async def _follow(self) -> int:
        started = time.monotonic()
        state = Round()
        sealed = self._seals.known()  # before the listing
        await self._terms.refresh()
        points = await pool.run(self._index.follow_points)
        own = {held.term for held in self._held.values()}  # written here: nothing to apply
        terms = [t for t in [LEGACY, *sorted(self._terms.known)] if points.get(t) != FOLLOW_CLOSED and t not in own]
        listed = {
            t: [item async for item in list_segments(self._capacity, points.get(t, ""), term_prefix(t))]
            for t in terms
        }
        await self._terms.refresh()  # after the listing: see the module notes
        applied = behind = 0
        for term in terms:
            bucket = self._terms.bucket(term)
            todo = listed[term]
            if term != LEGACY and (bucket in state.blocked or not await self._ready(term, bucket, state)):
                state.blocked.add(bucket)  # type: ignore[arg-type]
                behind += len(todo)
                continue
            ahead = ReadAhead(self._capacity, self._index, todo)
            try:
                for index, (name, size) in enumerate(todo):
                    verdict = await self._verdict(name, term, bucket, state)
                    if verdict == WAIT:
                        behind += len(todo) - index
                        if bucket is not None:
                            state.blocked.add(bucket)
                        break
                    if verdict == APPLY:
                        await self._apply(name, size, ahead.footer(index))
                        self._wrote(term)
                        applied += 1
                    else:
                        await pool.run(self._index.advance_follow_point, name)
                else:
                    if term in sealed:
                        state.complete.add(term)
                    await self._close_if_done(term, bucket, term in state.complete)
            finally:
                ahead.cancel()
        self._behind = behind
        if not behind:
            self._current_at = started
        self._rounds += 1
        return applied

    async def _ready(self, term: int, bucket: str | None, state: Round) -> bool:
        """True once term 0 and every earlier term of ``bucket`` are closed."""
        points = await pool.run(self._index.follow_points)
        earlier = [LEGACY] + [t for t in self._terms.of(bucket) if t < term] if bucket else [LEGACY]
        for before in earlier:
            if points.get(before) == FOLLOW_CLOSED:
                continue
            if not await self._close_if_done(before, self._terms.bucket(before), before in state.complete):
                return False
        return True

    async def _verdict(self, name: str, term: int, bucket: str | None, state: Round) -> str:
        """APPLY, SKIP (landed after its term's seal) or WAIT (its term may
        have ended and is not sealed yet)."""
        if term == LEGACY:
            if not self._terms.known:
                return APPLY  # no node has taken a lease: term 0 cannot have ended
        elif bucket is not None and self._terms.is_newest(term, bucket):
            return APPLY  # nobody has claimed the bucket since (read after the listing)
        seal = await self._seals.get(term)
        if seal is not None:
            return SKIP if name > seal else APPLY
        if term != LEGACY and bucket is not None:
            if bucket not in state.lease_terms:
                record = await self._lease(bucket).read()
                state.lease_terms[bucket] = record.term if record is not None else 0
            if state.lease_terms[bucket] == term:
                return APPLY  # a later claim that never took the lease
        return WAIT

    async def _close_if_done(self, term: int, bucket: str | None, complete: bool = False) -> bool:
        """Close ``term`` if it is sealed and applied up to its seal, or
        ``complete``: listed whole after its seal existed, and applied."""
        if term != LEGACY and bucket is not None and self._terms.is_newest(term, bucket):
            return False  # the bucket's newest term: it may still grow
        seal = await self._seals.get(term)
        if seal is None:
            return False
        point = await pool.run(self._index.follow_point, term)
        if point == FOLLOW_CLOSED:
            return True
        if seal and point < seal and not complete:
            return False
        await pool.run(self._index.close_term, term)
        return True

    async def _apply(self, name: str, size: int, footer: Awaitable[Footer] | None = None) -> None:
        if self._index.get_segment(name) is not None:  # written or recovered here: nothing to read
            await pool.run(self._index.advance_follow_point, name)
            return
        footer = await (footer if footer is not None else read_footer(self._capacity, name))
        gone, buckets = await pool.run(self._index.apply_segment, size, footer, self._region)
        for bucket in buckets:
            self._policies.changed(bucket)
        cached = [c.extent.cache_name for c in gone if c.extent is not None]
        if cached:
            await pool.run(self._hot.drop_cached, cached)
        # Staged in a term this node lost, superseded by a later writer's write.
        if staged := [c for c in gone if c.file_id is not None]:
            await pool.run(self._hot.remove, staged)

    async def follow_news(self, now: bool = False) -> None:
        """A round if one is due (``news.py``), or ``now``; then a prune if
        the head says another writer deleted segments since the last."""
        version = await self.watch.due(now)
        if version is None:
            return
        await self.follow()
        self.watch.done(version)
        await self._prune_if_deleted()

    async def _prune_if_deleted(self) -> None:
        """Prune once the head says another writer deleted segments since
        the last prune (the first time: since this process started)."""
        deletions = self._head.deletions(skip=set(self._held))
        if deletions and deletions != self._pruned:
            await forget_deleted(self._capacity, self._index)
        self._pruned = deletions
