"""What ``Cluster`` (``cluster.py``) keeps about its part: its status as the
admin API shows it, each bucket it writes, what one follow round knows, and
the one check (or take) of a bucket's lease that concurrent writes share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tiering.cluster.lease import Lease
from tiering.cluster.members import MemberStatus
from tiering.errors import ServiceUnavailable


@dataclass(slots=True)
class ClusterStatus:
    node: str
    role: str  # "writer" (of at least one bucket) or "replica"
    writing: list[str]  # the buckets whose write lease this node holds
    writers: dict[str, str]  # bucket -> the node of the newest term this node applied or wrote it in
    terms: int  # write terms claimed in the store so far
    lag_seconds: float | None  # since this node last had applied all the store held (None: never yet)
    lag_segments: int  # segments listed but not yet applied
    follow_rounds: int
    pushes: int  # notices from writers received (each asks for a round soon)
    head_looks: int  # conditional reads of the follow head
    head_updates: int  # updates of the follow head this node wrote
    errors: int
    last_error: str | None
    # The node registry (members.py), this node included; None with fixed --peers.
    members: list[MemberStatus] | None = None


@dataclass(slots=True)
class Held:
    """A bucket this node writes."""

    lease: Lease
    term: int
    renewed: float  # monotonic time of the last renewal
    issued: int = 0  # the last sequence named in the term
    written: float = 0.0  # monotonic time the last write to the bucket started
    writes: int = 0  # writes started (checked) under this lease so far
    active: int = 0  # writes under way: from their check to their commit
    releasing: bool = False  # giving the lease up (idle): writes get 503 until it is released
    renewing: bool = False  # a renewal is under way: the store has not answered it yet

    async def renew(self) -> bool:
        """Renew the lease (False: lost), known as under way meanwhile."""
        self.renewing = True
        try:
            return await self.lease.renew()
        finally:
            self.renewing = False

    def acknowledge(self, bucket: str, now: Held | None) -> None:
        """Return if a write checked under this lease may be acknowledged
        now that it committed: ``now`` (what the node holds of ``bucket``
        now) is still this lease, in this term, and held on this node's
        clock, so no other node can have taken it yet (``lease.py``)."""
        if now is self and self.lease.held:
            return
        raise ServiceUnavailable(
            f"This gateway's write lease of bucket {bucket} ran out while the write ran: it is not "
            "acknowledged; retry (another gateway may be the bucket's writer by now)"
        )

    def refuse_if_lapsed(self, bucket: str) -> None:
        """503 at once if this lease ran out while its renewal is still
        unanswered (the store is cut off or slow): the renewal goes on and
        keeps the term or learns it lost it; a write that waited for it
        could wait past its client's timeout."""
        if self.renewing and not self.lease.held and not self.releasing:
            raise ServiceUnavailable(
                f"This gateway could not renew bucket {bucket}'s write lease in time (the capacity "
                "store does not answer); retry, or write through another gateway"
            )


@dataclass(slots=True)
class Round:
    """What one follow round knows of each bucket's lease (read once)."""

    lease_terms: dict[str, int] = field(default_factory=dict)
    blocked: set[str] = field(default_factory=set)  # buckets waiting for a seal or an earlier term
    # Terms sealed before this round listed, all of whose listed segments
    # the round applied or skipped: every valid segment they still have is
    # applied (compaction may have deleted the rest, the seal's own included).
    complete: set[int] = field(default_factory=set)


class Checks:
    """One check (or take) of a bucket's lease at a time, which every write
    that needs it waits for, each no longer than its own bound. A write
    that gives up gets 503 and leaves the check running: cancelled midway,
    a take could leave a lease or a term claimed that this node does not
    know it has."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Task[None]] = {}

    async def wait(self, bucket: str, check: Callable[[str], Awaitable[None]], bound: float) -> None:
        task = self._running.get(bucket)
        if task is None:
            task = self._running[bucket] = asyncio.create_task(check(bucket))
            task.add_done_callback(lambda done: self._done(bucket, done))
        try:
            async with asyncio.timeout(bound):
                await asyncio.shield(task)
        except TimeoutError:
            raise ServiceUnavailable(
                f"The capacity store did not answer in time to check bucket {bucket}'s write lease; retry"
            ) from None

    def _done(self, bucket: str, task: asyncio.Task[None]) -> None:
        if self._running.get(bucket) is task:
            del self._running[bucket]
        if not task.cancelled():
            task.exception()  # retrieved here: each write that waited raised it already
