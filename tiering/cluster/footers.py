"""What a follower reads of the store besides the new segments' names:
their footers, a few ahead of the one being applied (``ReadAhead``), and,
after a writer's compaction, every name, to forget the segments it
deleted (``forget_deleted``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from packer.format import Footer
from tiering import pool
from tiering.capacity import CapacityStore
from tiering.capacity.layout import list_segments, read_footer
from tiering.index.db import Index

FOOTER_READ_AHEAD = 8  # footers read at once while following


class ReadAhead:
    """Reads the footers of listed segments a few ahead of the one being
    applied: one at a time, a round costs a store round trip per segment."""

    def __init__(self, capacity: CapacityStore, index: Index, listed: list[tuple[str, int]]) -> None:
        self._capacity = capacity
        self._index = index
        self._listed = listed
        self._reads: dict[int, asyncio.Task[Footer]] = {}
        self._looked = 0  # listed segments before this one were looked at

    def footer(self, position: int) -> Awaitable[Footer] | None:
        """The footer of the ``position``-th listed segment (None: the index
        knows it, nothing to read); starts the reads of the next few."""
        for ahead in range(max(position, self._looked), min(position + FOOTER_READ_AHEAD, len(self._listed))):
            name = self._listed[ahead][0]
            if self._index.get_segment(name) is None:
                self._reads[ahead] = asyncio.ensure_future(read_footer(self._capacity, name))
            self._looked = ahead + 1
        return self._reads.pop(position, None)

    def cancel(self) -> None:
        for read in self._reads.values():
            read.cancel()
            read.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._reads.clear()


async def forget_deleted(capacity: CapacityStore, index: Index) -> None:
    """Forget the segments a writer's compaction deleted from the store."""
    present = {name async for name, _ in list_segments(capacity)}
    known = await pool.run(index.segments)
    missing = [s.name for s in known if s.name not in present]
    if missing:
        await pool.run(index.forget_segments, missing)
