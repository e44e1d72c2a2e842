"""One registered epoch: its read order, its readers' positions, and where
its objects sit (for the prefetcher and the eviction advice of
``tiering.prefetch.epochs``). Plain data and pure functions: no I/O, no event loop.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from tiering.meta import Extent

RATE_PERIOD = 0.25  # seconds: the shortest period the read rate is measured over
# The window and depth of an epoch before its read rate is known: deep
# enough that the first readers find their objects coming, not merely
# keeping pace. From 4 per reader, the depth could only double with each
# rate measurement (the readers cannot read faster than the prefetch brings
# objects in), and a hinted epoch 50 ms from its store spent a third of its
# run ramping up (docs/benchmarks.md). A store that pushes back halves it.
START_DEPTH = 64
# A prefetch that fails (the source or store failed, not "no such key") is
# tried again after RETRY_BASE, then twice as long, ... (at most RETRY_CAP
# seconds), MAX_ATTEMPTS times in all; then the key counts as failed and is
# not prefetched again in the epoch (a reader that asks still fetches it).
MAX_ATTEMPTS = 3
RETRY_BASE = 1.0
RETRY_CAP = 30.0
SHOWN = 10  # missing and failed keys named in an epoch's view
# An object's size before any is known (a mount's keys are sized as they are
# fetched): what the prefetcher's bound on bytes in flight assumes.
UNKNOWN_SIZE = 1024 * 1024
# After the store pushes back, the depth is not cut again for one fetch time
# (at least CALM_MIN seconds): the fetches in flight at the cut answer
# within it, and a burst of their failures is one signal, not one each.
CALM_MIN = 0.1
# A fetch's floor is the fastest prefetch of the last FLOOR_PERIOD to
# 2 * FLOOR_PERIOD seconds (a windowed minimum, as TCP BBR keeps a path's
# shortest round trip): the store's latency without the queues of the
# gateway's own that lengthen the average (the prefetcher's depth).
FLOOR_PERIOD = 5.0
# An epoch whose readers read keys it does not name is silent otherwise: it
# stays active with nothing consumed, hit or prefetched (issue 43: DLIO read
# ``s3://resnet50/train/img_0001.npz`` as the literal key, the hint named
# ``train/img_0001.npz``). Its view warns once the epoch has seen at least
# WARN_READS GETs of its bucket and fewer than WARN_SHARE of them were of
# keys in its order (a trainer that reads a few other objects, a label file
# or a checkpoint, stays well above 1 %); and when more than WARN_MISSING of
# its positions are missing at the source.
WARN_READS = 100
WARN_SHARE = 0.01
WARN_MISSING = 0.5


@dataclass(slots=True)
class Entry:
    """One position of an epoch: the key and, once resolved, its cache files."""

    key: str
    size: int = 0
    names: tuple[str, ...] = ()
    extents: tuple[Extent, ...] = ()  # managed objects: what a fetch brings
    resolved: bool = False
    missing: bool = False
    elsewhere: bool = False  # hot on the node that owns it (a cluster): a read here asks that node


@dataclass(slots=True)
class Epoch:
    id: str
    bucket: str
    entries: list[Entry]
    readers: int
    lookahead_bytes: int
    lookahead_objects: int
    idle_timeout: float
    created: float = field(default_factory=time.time)
    state: str = "queued"  # queued | active | finished | ended | abandoned
    started: float | None = None
    finished: float | None = None
    last_read: float = field(default_factory=time.monotonic)
    positions: list[int] = field(default_factory=list)  # per reader: last position read
    consumed: set[int] = field(default_factory=set)
    hits: int = 0  # reads that found the whole object hot
    late: int = 0  # reads of an object the prefetcher was still fetching: they waited for it
    misses: int = 0  # reads of an object nobody was fetching: the reader fetched it
    bucket_reads: int = 0  # GETs of the bucket seen while active, in the order or not
    unmatched_reads: int = 0  # ... of keys the order does not name
    unmatched_key: str | None = None  # the first of those, for the warning
    prefetched_objects: int = 0  # objects the prefetcher brought in, counted as each lands
    prefetched_bytes: int = 0
    window: int = 0  # current lookahead in objects
    lead: int = 0  # at the last round: upcoming objects hot in a row ahead of the readers
    in_flight: int = 0  # objects being prefetched now
    one_by_one: int = 0  # ... of them fetched alone or in small runs (bounded by the readers)
    bulk_bytes: int = 0  # bytes of bulk batches in flight (bounded by lookahead_bytes)
    bulk_horizon: int = -1  # the horizon when bulk last found nothing to add
    fetch_time: float = 0.0  # seconds one object's prefetch takes (moving average)
    fetch_floor: float = 0.0  # ... at the fastest, over the last FLOOR_PERIOD or two
    _floor_now: float = 0.0  # the fastest in the current period
    _floor_before: float = 0.0  # ... in the period before it (0: none)
    _floor_at: float = 0.0  # when the current period began (monotonic)
    depth: int = 0  # the window's fetches the epoch may have in flight at once (at the last round)
    ceiling: float = 0.0  # ... at most this many since the store pushed back (0: no such bound now)
    _calm_until: float = 0.0  # no second cut of the ceiling before this (monotonic)
    # Keys whose prefetch failed: attempts so far, and when the next may start
    # (monotonic). At MAX_ATTEMPTS the key is failed for the epoch.
    failures: dict[str, tuple[int, float]] = field(default_factory=dict)
    _where: dict[str, list[int]] = field(default_factory=dict)
    _by_segment: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # segment -> (offset, position)
    _cum: list[int] = field(default_factory=list)  # bytes of positions before each position
    _sized: int = 0  # positions whose size is known (not 0)
    _rate: float = 0.0  # objects read per second, over periods of RATE_PERIOD
    _rate_at: float = field(default_factory=time.monotonic)
    _rate_reads: int = 0  # reads since _rate_at

    def __post_init__(self) -> None:
        self.positions = [reader - self.readers for reader in range(self.readers)]
        for position, entry in enumerate(self.entries):
            self._where.setdefault(entry.key, []).append(position)
        self.window = min(self.lookahead_objects, max(4 * self.readers, START_DEPTH))

    @property
    def live(self) -> bool:
        return self.state in ("queued", "active")

    @property
    def laid_out(self) -> bool:
        return len(self._cum) == len(self.entries) + 1

    def index_layout(self) -> None:
        """After resolution: where each position's extents sit, and the
        running byte count (how far ahead the hot tier's room reaches)."""
        self._by_segment = {}
        self._cum = [0]
        self._sized = 0
        for position, entry in enumerate(self.entries):
            self._cum.append(self._cum[-1] + entry.size)
            self._sized += entry.size > 0
            for ext in entry.extents:
                self._by_segment.setdefault(ext.segment, []).append((ext.offset, position))
        for run in self._by_segment.values():
            run.sort()

    def horizon(self, room: int) -> int:
        """The first position beyond what fits in ``room`` bytes counted
        from the slowest reader: fetching past it would evict sooner needs."""
        low = max(0, min(self.positions) + 1)
        return bisect.bisect_right(self._cum, self._cum[min(low, len(self.entries))] + room) - 1

    def neighbours(self, extents: Iterable[Extent], reach: int) -> Iterator[int]:
        """Positions with an extent in the same segment within ``reach``
        bytes of one of ``extents``: one ranged GET can bring them along.
        Overlapping reaches are walked once."""
        spans: dict[str, list[tuple[int, int]]] = {}
        for ext in extents:
            spans.setdefault(ext.segment, []).append((ext.offset - reach, ext.offset + reach))
        for segment, wanted in spans.items():
            run = self._by_segment.get(segment, [])
            wanted.sort()
            done = -1  # offsets up to here were walked already
            for low, high in wanted:
                i = bisect.bisect_left(run, (max(low, done + 1), -1))
                while i < len(run) and run[i][0] <= high:
                    yield run[i][1]
                    i += 1
                done = max(done, high)

    def count_read(self, now: float) -> None:
        """One more read for the rate, counted over periods of at least
        RATE_PERIOD. Many readers finish reads in bursts: an average of
        1 / (time since the previous read) made 900 a second of 16 readers
        of a mount that read 120, and the window grew to match."""
        if self._rate == 0 and self._rate_reads == 0:
            self._rate_at = now  # the first period starts at the first read, not at registration
        self._rate_reads += 1
        elapsed = now - self._rate_at
        if elapsed >= RATE_PERIOD:
            rate = self._rate_reads / elapsed
            self._rate = rate if self._rate == 0 else 0.5 * self._rate + 0.5 * rate
            self._rate_at, self._rate_reads = now, 0

    def count_fetch(self, seconds: float, now: float) -> None:
        """One more prefetch of one object landed after ``seconds``: the
        moving average, and the floor (the fastest of this period and the
        one before)."""
        self.fetch_time = seconds if self.fetch_time == 0 else 0.8 * self.fetch_time + 0.2 * seconds
        if now - self._floor_at >= FLOOR_PERIOD:
            self._floor_before, self._floor_now, self._floor_at = self._floor_now, seconds, now
        else:
            self._floor_now = min(self._floor_now, seconds)
        self.fetch_floor = min(self._floor_before or seconds, self._floor_now)

    @property
    def rate(self) -> float:
        return self._rate

    def object_bytes(self) -> int:
        """An object's size on average: of those prefetched, else of those
        whose size was known when the epoch was laid out, else UNKNOWN_SIZE."""
        if self.prefetched_objects and self.prefetched_bytes:
            return max(1, self.prefetched_bytes // self.prefetched_objects)
        if self._sized and self.laid_out:
            return max(1, self._cum[-1] // self._sized)
        return UNKNOWN_SIZE

    def count_pushback(self, now: float) -> bool:
        """The store pushed back (503 SlowDown, 429, or the hot tier's own
        SlowDown): halve the depth (multiplicative decrease), counted from
        the objects in flight when it did (at most the depth), at most once
        per fetch time. True when the ceiling was cut."""
        if now < self._calm_until:
            return False
        in_flight = min(self.depth, self.in_flight) if self.depth else self.in_flight
        self.ceiling = max(1.0, min(self.ceiling or in_flight, in_flight) / 2)
        self._calm_until = now + max(self.fetch_time, CALM_MIN)
        return True

    def count_landed(self) -> None:
        """A prefetch landed: after a cut, the ceiling grows back by one
        object per round trip (1 / ceiling per landing: additive increase)."""
        if self.ceiling:
            self.ceiling += 1.0 / self.ceiling

    def mark_missing(self, key: str) -> None:
        """The source answered that ``key`` does not exist (404) or may not
        be read (403): an answer, not a failure. Every position of it is
        missing for the rest of the epoch, never prefetched again."""
        for position in self._where.get(key, ()):
            entry = self.entries[position]
            entry.missing = True
            entry.resolved = True
        self.failures.pop(key, None)

    def count_failure(self, key: str, now: float) -> bool:
        """A prefetch of ``key`` failed: back off before the next attempt.
        True when that was the last attempt (the key is failed)."""
        attempts = self.failures.get(key, (0, 0.0))[0] + 1
        self.failures[key] = (attempts, now + min(RETRY_CAP, RETRY_BASE * 2 ** (attempts - 1)))
        return attempts >= MAX_ATTEMPTS

    def held(self, key: str, now: float) -> bool:
        """Whether a prefetch of ``key`` must wait (backing off) or not start
        at all (failed)."""
        failure = self.failures.get(key)
        return failure is not None and (failure[0] >= MAX_ATTEMPTS or now < failure[1])

    def missing_keys(self) -> tuple[int, int, list[str]]:
        """Positions whose key is missing, how many distinct keys that is,
        and the first SHOWN of them in read order. O(entries)."""
        positions = 0
        seen: set[str] = set()
        shown: list[str] = []
        for entry in self.entries:
            if entry.missing:
                positions += 1
                if entry.key not in seen:
                    seen.add(entry.key)
                    if len(shown) < SHOWN:
                        shown.append(entry.key)
        return positions, len(seen), shown

    def failed_keys(self) -> tuple[int, list[str]]:
        failed = [key for key, (attempts, _) in self.failures.items() if attempts >= MAX_ATTEMPTS]
        return len(failed), failed[:SHOWN]

    def names(self, key: str) -> bool:
        """Whether ``key`` is in the order (consumed or not): one dict lookup."""
        return key in self._where

    def warning(self, missing_objects: int) -> str | None:
        """What looks wrong, in words (see WARN_READS): reads that were not
        of this epoch's keys, most of its keys missing; None when neither."""
        warnings = []
        reads, unmatched = self.bucket_reads, self.unmatched_reads
        if reads >= WARN_READS and reads - unmatched < WARN_SHARE * reads:
            example = f" ({self.unmatched_key!r} is not one of them)" if self.unmatched_key is not None else ""
            warnings.append(
                f"{reads - unmatched} of the {reads} reads of bucket {self.bucket!r} since this epoch started "
                f"were of keys in its order{example}: check the keys (keys are taken literally; "
                f"see docs/prefetch.md)"
            )
        if self.entries and missing_objects > WARN_MISSING * len(self.entries):
            warnings.append(f"{missing_objects} of {len(self.entries)} entries are missing at the source")
        return "; ".join(warnings) or None

    def position_of(self, key: str) -> int | None:
        """The position a read of ``key`` stands for: the first not yet consumed."""
        for position in self._where.get(key, ()):
            if position not in self.consumed:
                return position
        return None

    def upcoming(self) -> Iterator[int]:
        """Positions not yet read, the soonest first: the readers' next
        positions interleaved (reader 0's next, reader 1's next, ...)."""
        step = self.readers
        cursors = [p + step for p in self.positions]
        end = len(self.entries)
        while True:
            moved = False
            for reader, cursor in enumerate(cursors):
                while cursor < end and cursor in self.consumed:
                    cursor += step
                if cursor < end:
                    yield cursor
                    cursors[reader] = cursor + step
                    moved = True
            if not moved:
                return

    def view(self) -> dict[str, object]:
        reads = self.hits + self.late + self.misses
        missing_objects, missing, missing_keys = self.missing_keys()
        failed, failed_keys = self.failed_keys()
        return {
            "id": self.id, "bucket": self.bucket, "state": self.state, "objects": len(self.entries),
            "readers": self.readers, "positions": list(self.positions), "consumed": len(self.consumed),
            "hits": self.hits, "late": self.late, "misses": self.misses,
            "hit_ratio": self.hits / reads if reads else None,
            "prefetched_objects": self.prefetched_objects, "prefetched_bytes": self.prefetched_bytes,
            "ahead_objects": self.lead, "in_flight_objects": self.in_flight,
            "lookahead_objects": self.window, "lookahead_bytes": self.lookahead_bytes,
            "missing_objects": missing_objects,
            "missing": missing, "missing_keys": missing_keys, "failed": failed, "failed_keys": failed_keys,
            "bucket_reads": self.bucket_reads, "unmatched_reads": self.unmatched_reads,
            "warning": self.warning(missing_objects),
            "created": self.created, "started": self.started, "finished": self.finished,
        }


def future_of(chains: list[list[tuple[list[Entry], Collection[int]]]]) -> dict[str, float]:
    """Cache file -> when it is next needed, over chains of epochs: an
    active epoch's unread positions, then the queued ones after it (a queued
    epoch's time starts where the one before it ends)."""
    future: dict[str, float] = {}
    for chain in chains:
        offset = 0
        for entries, consumed in chain:
            for position, entry in enumerate(entries):
                if position in consumed:
                    continue
                when = float(offset + position)
                for name in entry.names:
                    if when < future.get(name, float("inf")):
                        future[name] = when
            offset += len(entries)
    return future
