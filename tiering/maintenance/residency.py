"""What stays in the hot tier: evict, pin and unpin by bucket and prefix.

Each walks the index under a prefix in pages (one pool call per page, so
the event loop stays free) and acts on the cached extents of the objects it
finds. Staged chunks are left alone: they are the only copy until flushed,
and a pinned object's staged files become pinned cache when flushed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from tiering import pool
from tiering.hot.tier import HotTier
from tiering.index.bucket_settings import Policies
from tiering.index.db import Index
from tiering.jobs import Job
from tiering.meta import Extent, ObjectMeta
from tiering.reads.fetch import ExtentReader

_PAGE = 1000  # objects per index page


def cache_names(objects: Iterable[ObjectMeta]) -> list[str]:
    """The hot-tier cache names of every flushed chunk of ``objects``."""
    return [c.extent.cache_name for meta in objects for c in meta.chunks if c.extent is not None]


class PinTooLarge(Exception):
    """The pinned data would not fit in the hot tier."""


@dataclass(slots=True)
class EvictReport:
    evicted_bytes: int = 0
    skipped_pinned_bytes: int = 0  # pinned: evict never drops them


@dataclass(slots=True)
class PinReport:
    objects: int = 0
    bytes: int = 0  # raw bytes of the objects now pinned
    fetched_bytes: int = 0  # of which fetched from the capacity tier now
    staged_bytes: int = 0  # not flushed yet: pinned when the flusher writes them


class Residency:
    """Evict, pin and unpin for one node."""

    def __init__(self, index: Index, hot: HotTier, reader: ExtentReader, policies: Policies, concurrency: int) -> None:
        self._index = index
        self._hot = hot
        self._reader = reader
        self._policies = policies
        self._concurrency = concurrency

    async def _pages(self, bucket: str, prefix: str) -> AsyncIterator[list[ObjectMeta]]:
        after: str | None = None
        while True:
            page = await pool.run(self._index.objects_page, bucket, prefix, after, _PAGE)
            if not page:
                return
            yield page
            after = page[-1].key

    async def _expect(self, job: Job | None, bucket: str, prefix: str) -> None:
        """Totals for the progress bar: one pass counting the objects."""
        if job is None:
            return

        def count() -> tuple[int, int]:
            objects = size = 0
            for meta in self._index.iter_objects(bucket, prefix):
                objects += 1
                size += meta.size
            return objects, size

        job.expect(*await pool.run(count))

    async def evict(self, bucket: str | None = None, prefix: str = "", job: Job | None = None) -> EvictReport:
        """Drop cached extents (of bucket/prefix, or all); pinned ones stay."""
        report = EvictReport()
        if bucket is None:
            report.skipped_pinned_bytes = self._hot.pinned
            if job is not None:
                job.expect(None, self._hot.cached - self._hot.pinned)
            report.evicted_bytes = await pool.run(self._hot.evict, 0)
            if job is not None:
                job.advance(0, report.evicted_bytes)
            return report
        await self._expect(job, bucket, prefix)
        async for page in self._pages(bucket, prefix):
            dropped, kept = await pool.run(self._hot.drop_cached, cache_names(page), True)
            report.evicted_bytes += dropped
            report.skipped_pinned_bytes += kept
            if job is not None:
                job.advance(len(page), sum(m.size for m in page))
        return report

    async def pin(self, bucket: str, prefix: str = "", job: Job | None = None) -> PinReport:
        """Record the pin, then bring every object it covers into the hot
        tier and pin it there. Raises PinTooLarge when the hot tier cannot
        hold them beside the staged data (the pin stays: unpin to drop it)."""
        await pool.run(self._policies.add_pin, bucket, prefix)
        await self._expect(job, bucket, prefix)
        report = PinReport()
        gate = asyncio.Semaphore(self._concurrency)

        async def warm(ext: Extent) -> tuple[bool, bool]:
            async with gate:
                cached = self._hot.is_cached(ext.cache_name)
                return await self._reader.warm(ext, pin=True), not cached

        async for page in self._pages(bucket, prefix):
            extents = [c.extent for m in page for c in m.chunks if c.extent is not None]
            outcomes = await asyncio.gather(*(warm(ext) for ext in extents))
            if not all(fits for fits, _ in outcomes):
                raise PinTooLarge(
                    f"{bucket}/{prefix} does not fit in the hot tier: {self._hot.pinned} bytes pinned "
                    f"and {self._hot.staged} staged of a {self._hot.high}-byte high watermark"
                )
            report.objects += len(page)
            report.bytes += sum(m.size for m in page)
            report.fetched_bytes += sum(e.raw for e, (_, fetched) in zip(extents, outcomes) if fetched)
            report.staged_bytes += sum(c.size for m in page for c in m.chunks if c.file_id is not None)
            if job is not None:
                job.advance(len(page), sum(m.size for m in page))
        return report

    async def hold(self, bucket: str, prefix: str = "") -> None:
        """Record the pin and pin what is cached of it already, without
        fetching the rest (reads and flushes pin it as it comes)."""
        await pool.run(self._policies.add_pin, bucket, prefix)
        await self._pin_cached(bucket, prefix)

    async def restore(self) -> None:
        """At start: the hot tier does not remember pins across restarts,
        the index does; pin again what each pin covers and the cache holds."""
        await pool.run(self._policies.load)
        for bucket, prefix in self._policies.pins():
            await self._pin_cached(bucket, prefix)

    async def _pin_cached(self, bucket: str, prefix: str) -> None:
        async for page in self._pages(bucket, prefix):
            await pool.run(self._hot.pin, cache_names(page))

    def states(self, meta: ObjectMeta) -> list[str]:
        """Where each chunk of ``meta`` is: staged, cached or capacity."""
        return [
            "staged" if c.file_id is not None
            else "cached" if c.extent is not None and self._hot.is_cached(c.extent.cache_name)
            else "capacity"
            for c in meta.chunks
        ]

    async def unpin(self, bucket: str, prefix: str = "") -> int:
        """Remove a pin; what it covered becomes evictable unless another
        pin covers it. Bytes unpinned; raises KeyError if no such pin."""
        if not await pool.run(self._policies.remove_pin, bucket, prefix):
            raise KeyError((bucket, prefix))
        unpinned = 0
        async for page in self._pages(bucket, prefix):
            loose = [m for m in page if not self._policies.pinned(m.bucket, m.key)]
            unpinned += await pool.run(self._hot.unpin, cache_names(loose))
        return unpinned
