"""The free-space floor: the filesystem's free space as a watermark.

The byte budget says how much the hot tier may hold; it says nothing of
what else is on the disk (other tenants of a shared NVMe, the index, the
embedded capacity store) or of a budget larger than the disk. The floor
is the free space the hot tier leaves on its filesystem, whichever comes
first:

- eviction starts when free space falls below the floor (or the tier
  passes its high watermark) and frees clean cache until free space is
  back at ``floor + floor / 4`` (the slack, so one pass serves many
  writes, as the watermarks' 10 % do);
- a write (or a cache fill) is taken only if free space stays at or
  above the floor once it and every write already promised room are
  written; bytes promised but not written yet are not in ``statvfs``.

Free space is read with one ``statvfs`` per question (about 1.4 us), but
for a cache fill: its questions are answered from a reading up to
``READING_AGE`` old, less the bytes fills landed since. A fill asked twice
per piece, and each ``statvfs`` lets the fills' writer thread drop the GIL
and wait to take it back from the event loop (a few context switches),
which cost a cold miss more than the call itself; a fill that finds the
disk full after all fails with ENOSPC and costs the cache only. An
evicted file the event loop keeps a descriptor of gives its room back a
turn of the loop later (``tiering/hot/open_files.py``): those bytes count
as free already, or every fill and write of that turn would evict the same
shortfall again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tiering.errors import WRITE_REFUSALS, InsufficientStorage, SlowDown, TierstoreError
from tiering.files import disk_space

READING_AGE = 0.02  # seconds a free-space reading answers cache fills


class Floor:
    """Free space at or above ``floor`` bytes on the filesystem holding
    ``path`` (0: no floor), and the count of writes refused by cause.
    ``closing``: bytes of unlinked files whose last descriptor is about to
    close."""

    def __init__(self, path: Path, floor: int = 0, closing: Callable[[], int] = lambda: 0) -> None:
        self.path = path
        self.floor = floor
        self.refusals = dict.fromkeys(WRITE_REFUSALS, 0)
        self.fills_skipped = 0  # cache fills left out for room
        self._closing = closing
        self._reading = (-READING_AGE, 0)  # (monotonic time, free bytes) of the last statvfs
        self._landed = 0  # bytes fills wrote since that reading

    def space(self) -> tuple[int, int]:
        """(free, size) of the filesystem, in bytes."""
        return disk_space(self.path)

    def free(self, recent: bool = False) -> int:
        """Free bytes, those of files unlinked and about to close included;
        ``recent`` (a cache fill's question): from the last reading if it is
        younger than ``READING_AGE``, less what fills landed since."""
        now = time.monotonic()
        at, free = self._reading
        if not recent or now - at >= READING_AGE:
            free = disk_space(self.path)[0]
            self._reading, self._landed = (now, free), 0
        return free - self._landed + self._closing()

    def landed(self, size: int) -> None:
        """A fill wrote ``size`` bytes (or gave up its room: counted all the same)."""
        self._landed += size

    def short(self, pending: int, recent: bool = False) -> int:
        """Bytes missing for ``pending`` more bytes to land while free space
        stays at or above the floor; 0 when they fit."""
        if not self.floor:
            return 0
        return max(0, self.floor + pending - self.free(recent))

    @property
    def low(self) -> bool:
        """Free space is below the floor: time to evict."""
        return bool(self.floor) and self.free() < self.floor

    def wanted(self, pending: int = 0) -> int:
        """Bytes to free for free space to be back at the floor plus its
        slack with ``pending`` more bytes written; 0 when it is there."""
        if not self.floor:
            return 0
        return max(0, self.floor + self.floor // 4 + pending - self.free())

    def refuse(self, cause: str, can_free: bool) -> TierstoreError:
        """The error of a write refused for ``cause`` (counted): SlowDown
        while flushing or eviction can make room, else 507."""
        self.refusals[cause] += 1
        if can_free:
            return SlowDown(_MESSAGES[cause], cause=cause)
        return InsufficientStorage(_FULL[cause], cause=cause)


_MESSAGES = {
    "budget": "The hot tier is full of data not yet in the capacity tier; retry later",
    "floor": "The gateway's disk is nearly full; it is making room, retry shortly",
    "disk": "The gateway's disk is full; it is making room, retry shortly",
}
_FULL = {
    "budget": "The hot tier's budget is taken by pinned data; unpin some or raise --hot-size",
    "floor": "The gateway's disk is full of data it cannot free (other data, pinned data or its index)",
    "disk": "The gateway's disk is full of data it cannot free (other data, pinned data or its index)",
}
