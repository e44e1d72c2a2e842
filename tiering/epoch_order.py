"""One registered epoch: its read order, its readers' positions, and where
its objects sit (for the prefetcher and the eviction advice of
``tiering.epochs``). Plain data and pure functions: no I/O, no event loop.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from tiering.meta import Extent


@dataclass(slots=True)
class Entry:
    """One position of an epoch: the key and, once resolved, its cache files."""

    key: str
    size: int = 0
    names: tuple[str, ...] = ()
    extents: tuple[Extent, ...] = ()  # managed objects: what a fetch brings
    resolved: bool = False
    missing: bool = False


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
    hits: int = 0
    misses: int = 0
    prefetched_objects: int = 0
    prefetched_bytes: int = 0
    window: int = 0  # current lookahead in objects
    _where: dict[str, list[int]] = field(default_factory=dict)
    _by_segment: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # segment -> (offset, position)
    _cum: list[int] = field(default_factory=list)  # bytes of positions before each position
    _rate: float = 0.0  # objects read per second (moving average)
    _rate_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.positions = [reader - self.readers for reader in range(self.readers)]
        for position, entry in enumerate(self.entries):
            self._where.setdefault(entry.key, []).append(position)
        self.window = min(self.lookahead_objects, 4 * self.readers)

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
        for position, entry in enumerate(self.entries):
            self._cum.append(self._cum[-1] + entry.size)
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
        reads = self.hits + self.misses
        return {
            "id": self.id, "bucket": self.bucket, "state": self.state, "objects": len(self.entries),
            "readers": self.readers, "positions": list(self.positions), "consumed": len(self.consumed),
            "hits": self.hits, "misses": self.misses, "hit_ratio": self.hits / reads if reads else None,
            "prefetched_objects": self.prefetched_objects, "prefetched_bytes": self.prefetched_bytes,
            "lookahead_objects": self.window, "lookahead_bytes": self.lookahead_bytes,
            "missing_objects": sum(1 for e in self.entries if e.missing),
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
