"""Fetching ahead in a managed batch: the cold extents of the members after
the one being sent, in runs of packed neighbours."""

from __future__ import annotations

import asyncio
import itertools
import logging

from tiering.errors import TierstoreError
from tiering.hot.tier import HotTier
from tiering.meta import Extent, ObjectMeta
from tiering.prefetch.prefetcher import BULK_GAP, BULK_SPAN
from tiering.reads.fetch import ExtentReader

log = logging.getLogger("tierstore.batch")


class Ahead:
    """The cold extents of the objects ahead of a managed batch's member
    being sent, fetched in runs of packed neighbours (``fetch_many``), up
    to ``window`` object bytes ahead."""

    def __init__(self, reader: ExtentReader, hot: HotTier, found: list[ObjectMeta | TierstoreError],
                 window: int) -> None:
        self._reader = reader
        self._hot = hot
        self._found = found
        self._window = window
        self._planned = 0  # positions before this one were looked at
        # Object bytes before each position: what is pending ahead, in O(1).
        self._before = list(itertools.accumulate(
            (m.size if isinstance(m, ObjectMeta) else 0 for m in found), initial=0))
        self._landed: dict[str, asyncio.Event] = {}  # cache name -> set once cached
        self._fetch_of: dict[int, asyncio.Task[None]] = {}  # position -> the fetch that brings it
        self._tasks: set[asyncio.Task[None]] = set()

    def advance(self, position: int) -> None:
        """Fetch what is cold among the next ``window`` bytes of objects
        from ``position`` on, not asked for yet: one ``fetch_many`` for them."""
        if self._window <= 0:
            return
        self._planned = max(self._planned, position)
        # Top up once half the window was sent: fewer, larger calls.
        pending = self._before[self._planned] - self._before[position]
        if pending > self._window // 2:
            return
        extents: list[Extent] = []
        positions: list[int] = []
        nbytes = pending
        while self._planned < len(self._found) and nbytes < self._window:
            i = self._planned
            self._planned += 1
            meta = self._found[i]
            if not isinstance(meta, ObjectMeta):
                continue
            nbytes += meta.size
            cold = [c.extent for c in meta.chunks
                    if c.file_id is None and c.extent is not None and not self._hot.is_cached(c.extent.cache_name)]
            if cold:
                extents += cold
                positions.append(i)
        if not extents:
            return
        for ext in extents:
            self._landed.setdefault(ext.cache_name, asyncio.Event())
        task = asyncio.create_task(self._fetch(extents))
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        for i in positions:
            self._fetch_of[i] = task

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # retrieved: the members read alone
            log.warning("batch read-ahead failed: %s", task.exception())

    async def _fetch(self, extents: list[Extent]) -> None:
        def filled(ext: Extent) -> None:
            event = self._landed.get(ext.cache_name)
            if event is not None:
                event.set()

        # Failures are not raised here: the member whose extent failed is
        # read alone in its turn, which fetches (and reports) it again.
        await self._reader.fetch_many(extents, gap=BULK_GAP, span=BULK_SPAN, on_filled=filled)

    async def landed(self, position: int) -> None:
        """Wait until the member at ``position`` is cached, or the fetch that
        was to bring it has ended (it may have failed: the member is then
        read alone)."""
        task = self._fetch_of.pop(position, None)
        meta = self._found[position]
        if task is None or not isinstance(meta, ObjectMeta):
            return
        events = [self._landed[c.extent.cache_name] for c in meta.chunks
                  if c.extent is not None and c.extent.cache_name in self._landed]
        waiting = [asyncio.ensure_future(e.wait()) for e in events if not e.is_set()]
        if not waiting:
            return
        gathered = asyncio.ensure_future(asyncio.gather(*waiting))
        try:
            await asyncio.wait([gathered, task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gathered.cancel()
            # Its CancelledError retrieved: nobody awaits a gather cut short here.
            gathered.add_done_callback(_retrieved)
            for w in waiting:
                w.cancel()

    async def close(self) -> None:
        """Stop what is still being fetched (the stream ended or was cut)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _retrieved(done: asyncio.Future[object]) -> None:
    if not done.cancelled():
        done.exception()
