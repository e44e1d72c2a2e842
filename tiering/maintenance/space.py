"""The disk's free space kept above the floor, in the background.

Writes and cache fills evict as they go (``tiering/hot/space.py``); this
task covers the time between them, when nothing of the gateway's writes
but the disk fills all the same (another tenant of a shared NVMe), and
gives back what a full disk took. Every ``INTERVAL`` seconds:

- free space below the floor: evict clean cache until it is back at the
  floor and its slack; when clean cache is not enough, start a flush, so
  that staged data becomes clean cache the next pass can evict;
- the index read-only (a full disk left no room to open it for writes):
  open it for writes once there is room; else keep room allocated ahead
  of its write-ahead log (``IndexRoom.keep_log_room``);
- the index's reserve given up (``tiering/index/room.py``): evict clean
  cache for its room too, and make it again once the filesystem has room
  for it above the floor. The reserve is what lets the next start open the
  index on a disk someone else filled meanwhile: it outranks cache.

Also what an operator sees of it (``DiskStatus``, in ``/tiers``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from tiering import pool
from tiering.hot.tier import HotTier
from tiering.index.db import Index
from tiering.maintenance.flush import Flusher

log = logging.getLogger("tierstore.space")

INTERVAL = 0.5  # seconds between passes; a pass is a statvfs when nothing is wrong


@dataclass(slots=True)
class DiskStatus:
    """The hot tier's filesystem against its floor, and what a full disk cost."""

    size: int  # bytes of the filesystem
    free: int  # bytes free (as an unprivileged process may use them)
    floor: int  # free bytes the gateway leaves; 0: no floor
    reserve: int  # bytes of the index's reserve
    reserve_held: bool  # False once given to the index, until made again
    index_writable: bool  # False while the index is open read-only (no room)
    refusals: dict[str, int] = field(default_factory=dict)  # writes refused, by cause
    fills_skipped: int = 0  # cache fills left out for room (their reads were answered)
    warning: str | None = None  # the budget is more than the filesystem can hold


class SpaceKeeper:
    """Eviction and flushes for the floor, the index's reserve and its
    reopening; one per node, run by ``Tiers``."""

    def __init__(self, index: Index, hot: HotTier, flusher: Flusher, interval: float = INTERVAL) -> None:
        self._index = index
        self._hot = hot
        self._flusher = flusher
        self._interval = interval

    async def run(self) -> None:
        if (warning := self.warning()) is not None:
            log.warning("%s", warning)
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.keep()
            except OSError as exc:  # the disk failing in another way than room
                log.warning("keeping free space above the floor failed: %s", exc)

    async def keep(self) -> None:
        """One pass (see the module's docstring)."""
        hot, index = self._hot, self._index
        room = index.room
        missing = room.size if room.size and not room.held else 0  # the reserve, to make again
        if hot.disk.low or (missing and hot.disk.short(missing)):
            await pool.run(hot.evict, None, missing)
            if hot.disk.wanted(missing) and hot.staged:
                self._flusher.request()
        if not index.writable:
            await pool.run(index.reopen)
        else:
            await pool.run(room.keep_log_room)
        if missing and not hot.disk.short(missing):
            await pool.run(room.restore, hot.disk.floor)

    def warning(self) -> str | None:
        """Said when the budget is more than the filesystem can hold beside
        the floor and the index's reserve: free space, not the budget, is
        then what bounds the hot tier (and the watermarks never act)."""
        hot, room = self._hot, self._index.room
        size = hot.disk.space()[1]
        holds = size - hot.disk.floor - room.size
        if not hot.disk.floor or hot.budget <= holds:
            return None
        return (f"the hot tier's budget ({hot.budget // _MiB} MiB) is more than its filesystem can hold "
                f"({max(holds, 0) // _MiB} MiB of {size // _MiB} MiB above the free-space floor and the "
                "index's reserve): free space, not the budget, bounds the hot tier; lower --hot-size")

    def status(self) -> DiskStatus:
        hot, room = self._hot, self._index.room
        free, size = hot.disk.space()
        refusals = dict(hot.disk.refusals)
        refusals["index"] = refusals.get("index", 0) + room.refusals
        return DiskStatus(
            size=size, free=free, floor=hot.disk.floor, reserve=room.size, reserve_held=room.held,
            index_writable=self._index.writable, refusals=refusals, fills_skipped=hot.disk.fills_skipped,
            warning=self.warning(),
        )


_MiB = 1024 * 1024
