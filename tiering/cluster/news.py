"""When a node follows: the news a writer gives, and what makes a follower look.

Writer side (``Publisher``): the flusher and the compactor report each
segment they commit and each they delete (``Cluster.committed``,
``Cluster.deleted``), and taking a lease reports the new term. The
publisher gathers what comes within ``GATHER`` seconds of the first report
(a flush of several segments, a compaction pass) into one update of the
follow head (``head.py``), then one notice to the other nodes (the
callbacks of ``tell``: ``push.py`` sends it). All of it runs beside the
write path: a write is acknowledged whether or not its news goes out. An
update that fails is tried again ``RETRY`` seconds later, merged with what
came meanwhile; the notice goes out either way (the segments are in the
store, and a round lists them, head or no head). A change of the
identities document is published the same way (``identity``: its new tag
in the head), without a notice of segments (``Identities`` sends its own).

Follower side (``Watch``): a round runs when a notice comes (``nudge``),
but not sooner than ``interval`` after the previous round began, so the
notices of a busy writer, or of several, make one round. Every
``fallback`` seconds the node reads the head conditionally and runs a
round only if another node changed it: a lost notice delays a change by
at most ``fallback``, and an idle node costs one 304 per ``fallback``. A
round that failed is tried again ``interval`` later. The same read tells
the identities document's reader that it changed (``on_identity``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from tiering.cluster.head import Change, Head
from tiering.errors import CapacityError

log = logging.getLogger("tierstore.cluster")

GATHER = 0.1  # seconds the reports after a first one are gathered into its update
RETRY = 5.0  # seconds before a failed update is tried again


class Publisher:
    """A writer's reports, gathered into head updates and notices."""

    def __init__(self, head: Head) -> None:
        self._head = head
        self._pending: dict[str, Change] = {}
        self._identity: str | None = None  # the identities document's tag to publish
        self._task: asyncio.Task[None] | None = None
        self._told: list[Callable[[], None]] = []
        self.errors = 0

    def tell(self, callback: Callable[[], None]) -> None:
        """``callback()`` after each update (tried): it tells the other nodes."""
        self._told.append(callback)

    def add(self, bucket: str, change: Change) -> None:
        """Report ``change`` of ``bucket``; published within ``GATHER``."""
        earlier = self._pending.get(bucket)
        self._pending[bucket] = change if earlier is None else earlier.merged(change)
        self._soon()

    def identity(self, tag: str | None) -> None:
        """This node wrote the identities document (its new version tag):
        published within ``GATHER``, so that the other nodes read it."""
        if tag is not None:
            self._identity = tag
            self._soon()

    def _soon(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="tierstore follow head")

    async def _run(self) -> None:
        delay = GATHER
        while self._pending or self._identity is not None:
            await asyncio.sleep(delay)
            delay = GATHER if await self._publish() else RETRY

    async def _publish(self) -> bool:
        pending, self._pending = self._pending, {}
        identity, self._identity = self._identity, None
        published = False
        try:
            await self._head.publish(pending, identity)
            published = True
        except (CapacityError, OSError) as exc:
            self.errors += 1
            log.warning("could not update the follow head (%s); retrying in %.0f s", exc, RETRY)
            self._restore(pending, identity)
        except asyncio.CancelledError:
            self._restore(pending, identity)
            raise
        if pending:  # segments or a term: the notice (the identities document has its own)
            for callback in self._told:
                callback()
        return published

    def _restore(self, pending: dict[str, Change], identity: str | None) -> None:
        for bucket, change in pending.items():
            later = self._pending.get(bucket)
            self._pending[bucket] = change if later is None else change.merged(later)
        if self._identity is None:  # else a later change's tag came meanwhile: that one
            self._identity = identity

    async def close(self) -> None:
        """Stop; what is still pending (a last flush's) is published now, once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._pending or self._identity is not None:
            await self._publish()


class Watch:
    """When this node runs a follow round, and from which head version."""

    def __init__(self, head: Head, interval: float, fallback: float, *, settle: float = 0.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``settle``: for this long after the start, the head is read every
        ``interval`` rather than every ``fallback``: the other nodes of a
        registry learn of a new node at their next listing of it (the
        members interval), and until then their notices miss it.
        ``monotonic``: the clock (a simulation's, ``benchmarks/cluster_cost.py``)."""
        self._head = head
        self.interval = interval
        self.fallback = fallback
        self._monotonic = monotonic
        self._settled_at = monotonic() + settle
        self._nudged = asyncio.Event()
        self._looked_at = monotonic()  # the last read of the head (or the start)
        self._round_at = -interval  # monotonic: when the last round began
        self._followed: int | None = None  # the head version the last complete round began from
        self._failed = False
        self._quiet_at: float | None = None  # the last read of the head that found nothing new
        self.pushes = 0  # notices received
        self.looks = 0  # conditional reads of the head

    def on_identity(self, callback: Callable[[], None]) -> None:
        """``callback()`` when a read of the head finds that another node
        changed the identities document."""
        self._head.heard(callback)

    def nudge(self) -> None:
        """A notice came: another node changed what this one follows."""
        self.pushes += 1
        self._nudged.set()

    async def wait(self, tick: float) -> None:
        """Sleep ``tick`` seconds, or until a notice comes; for a notice,
        until ``interval`` after the last round began (gathering more)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(tick):  # not wait_for: see Flusher.run
                await self._nudged.wait()
        if self._nudged.is_set() and (wait := self._round_at + self.interval - self._monotonic()) > 0:
            await asyncio.sleep(wait)

    async def due(self, now: bool = False) -> int | None:
        """The head version a round begins from, if one is asked for
        ``now`` or due: a notice came, the last round failed, or the
        fallback time came and another node changed the head. None if not."""
        pushed = self._nudged.is_set() or now
        at = self._monotonic()
        retry = self._failed and at >= self._round_at + self.interval
        fallback = self.fallback if at >= self._settled_at else min(self.fallback, self.interval)
        if not (pushed or retry or at >= self._looked_at + fallback):
            return None
        self._nudged.clear()
        self._looked_at = at
        self._failed = pushed or retry  # a notice is not lost to a failed read of the head
        self.looks += 1
        await self._head.look()
        if not (pushed or retry) and self._head.version == self._followed:
            self._quiet_at = at
            return None
        self._round_at, self._failed = at, True  # until done() says otherwise
        return self._head.version

    def done(self, version: int) -> None:
        """A round that began from head ``version`` completed."""
        self._followed = version
        self._failed = False

    def lag(self, current_at: float | None, behind: int) -> float | None:
        """Seconds since this node last knew it had applied all the store
        held: ``current_at``, the start of the last round that left nothing
        unapplied (``behind`` is what the last round left), or a later read
        of the head that found nothing new. None: never yet."""
        if current_at is None:
            return None
        if not behind and self._quiet_at is not None:
            current_at = max(current_at, self._quiet_at)
        return round(self._monotonic() - current_at, 3)
