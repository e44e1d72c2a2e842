"""Reading extents back from the capacity tier.

A miss costs one ranged GET of exactly the extent's stored bytes; they are
checked against the extent's CRC and decoded before anyone sees them, and a
mismatch is fetched again rather than served. Concurrent misses on the same
extent share one GET (single flight), and a node-wide semaphore bounds how
many GETs are in flight. Verified bytes are written to the hot-tier cache in
the background while the caller already streams them.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from packer import format as seg
from packer.errors import FormatError
from tiering import _pool
from tiering.capacity import CapacityStore
from tiering.errors import CapacityError
from tiering.flight import SingleFlight
from tiering.hot import HotTier
from tiering.meta import Extent

log = logging.getLogger("tierstore.fetch")

SEGMENTS = "segments/"
_ATTEMPTS = 3  # fetches of one extent before a checksum mismatch is an error


def segment_path(name: str) -> str:
    """The capacity-store name of a segment."""
    return SEGMENTS + name


class ExtentReader:
    """Cache-first reads of extents, filling the hot tier on misses."""

    def __init__(self, capacity: CapacityStore, hot: HotTier, concurrency: int) -> None:
        self._capacity = capacity
        self._hot = hot
        self._gets = asyncio.Semaphore(concurrency)
        self._flight: SingleFlight[bytes] = SingleFlight()
        self._fills: dict[str, asyncio.Task[None]] = {}  # cache name -> fill
        self.hits = 0
        self.misses = 0

    async def open_cached(self, ext: Extent) -> int | None:
        """A descriptor on the cached copy, or None on a miss."""
        fd = await _pool.run(self._hot.open_cached, ext.cache_name, ext.raw)
        if fd is not None:
            self.hits += 1
        return fd

    async def fetch(self, ext: Extent, pin: bool = False) -> bytes:
        """The extent's raw bytes from the capacity tier (shared by
        concurrent callers), verified; queued for the hot-tier cache
        (pinned there when ``pin``)."""
        data, leader = await self._flight.run(ext.place, lambda: self._fetch(ext))
        if not leader:
            return data
        name = ext.cache_name
        task = asyncio.create_task(self._fill(ext, data, pin))
        self._fills[name] = task
        task.add_done_callback(functools.partial(self._filled, name))
        return data

    def _filled(self, name: str, task: asyncio.Task[None]) -> None:
        if self._fills.get(name) is task:
            del self._fills[name]

    async def warm(self, ext: Extent, pin: bool = False) -> bool:
        """Make sure the extent is cached (pinned when ``pin``); False when
        it does not fit in the hot tier."""
        name = ext.cache_name
        if self._hot.is_cached(name):
            if pin:
                self._hot.pin([name])
            return True
        await self.fetch(ext, pin)
        fill = self._fills.get(name)
        if fill is not None:
            await asyncio.shield(fill)
        if pin:
            self._hot.pin([name])  # filled unpinned by a reader that fetched it first
        return self._hot.is_cached(name) or self._hot.is_filling(name)

    async def _fetch(self, ext: Extent) -> bytes:
        self.misses += 1
        ref = seg.EntryRef("", "", 0, 0, ext.offset, ext.stored, ext.raw, ext.codec, ext.crc)
        for attempt in range(1, _ATTEMPTS + 1):
            async with self._gets:
                stored = await self._capacity.get_range(segment_path(ext.segment), ext.offset, ext.offset + ext.stored)
            try:
                return await _pool.run(seg.decode_entry, ref, stored)
            except FormatError as exc:
                log.warning("extent %s@%d failed verification (attempt %d): %s", ext.segment, ext.offset, attempt, exc)
                if attempt == _ATTEMPTS:
                    raise CapacityError(
                        f"segment {ext.segment} returned corrupt bytes at offset {ext.offset} "
                        f"{_ATTEMPTS} times; not served"
                    ) from exc
        raise AssertionError("unreachable")

    async def _fill(self, ext: Extent, data: bytes, pin: bool) -> None:
        try:
            await _pool.run(self._hot.fill, ext.cache_name, data, pin)
        except OSError as exc:  # a full or failing disk costs the cache, not the read
            log.warning("could not cache extent %s@%d: %s", ext.segment, ext.offset, exc)

    async def drain(self) -> None:
        """Wait for background cache fills (at shutdown)."""
        while self._fills:
            await asyncio.gather(*list(self._fills.values()), return_exceptions=True)
