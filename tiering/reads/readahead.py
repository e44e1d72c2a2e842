"""Streaming an object's pieces in order, fetching the next ones meanwhile.

Shared by managed objects (staged files, cached or fetched extents) and
mounted ones (cached or fetched pieces). A piece's source is a descriptor
on a hot-tier file, read with pread in blocks in the pool, or bytes just
fetched from the capacity side, sent as they are. ``ReadTally`` counts what
each tier produced.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import NamedTuple

from packer.ranges import ByteRange
from tiering import pool
from tiering.hot.open_files import Opened, close_unused
from tiering.hot.tier import HotTier
from tiering.reads.plan import ReadTally

READ_BLOCK = 1024 * 1024  # bytes per pool call when streaming from a local file


class Held(NamedTuple):
    """A piece's bytes in memory while they are written to the hot tier
    (fetched a moment ago by another read): served from there, counted hot."""

    data: bytes


class Peered(NamedTuple):
    """A piece's bytes as the node that keeps them sent them: counted peer."""

    data: bytes


# An open descriptor (the caller's to close), fetched bytes, held ones, or a peer's.
Source = Opened | bytes | Held | Peered


async def stream(
    pieces: Sequence[tuple[int, ByteRange]],
    open_piece: Callable[[int], Awaitable[Source]],
    *,
    window: int,
    tally: ReadTally,
    prefetch: Callable[[int], bool] = lambda index: True,
) -> AsyncIterator[bytes]:
    """Yield each (piece index, byte range) of ``pieces`` in order; up to
    ``window`` pieces for which ``prefetch`` says yes are opened ahead (a
    fetch runs meanwhile), the others when their turn comes."""
    ahead: dict[int, asyncio.Task[Source]] = {}
    alone = len(pieces) == 1  # most objects: nothing to open ahead, so no task to make
    try:
        for position, (index, wanted) in enumerate(pieces):
            for later, _ in pieces[position : position + window] if not alone else ():
                if later not in ahead and prefetch(later):
                    ahead[later] = asyncio.create_task(open_piece(later))
            task = ahead.pop(index, None)
            source = await task if task is not None else await open_piece(index)
            if isinstance(source, (Held, Peered)):
                if isinstance(source, Held):
                    tally.hot += wanted.end - wanted.start
                else:
                    tally.peer += wanted.end - wanted.start
                source = source.data
                yield source if wanted.start == 0 and wanted.end == len(source) else source[wanted.start : wanted.end]
                continue
            if isinstance(source, bytes):
                # Fetched: one send, and no copy for a whole piece.
                tally.capacity += wanted.end - wanted.start
                whole = wanted.start == 0 and wanted.end == len(source)
                yield source if whole else source[wanted.start : wanted.end]
                continue
            # One open descriptor per piece: a delete or overwrite that
            # unlinks the file mid-stream does not cut the response short.
            fd, base = source
            try:
                offset = wanted.start
                while offset < wanted.end:
                    length = min(READ_BLOCK, wanted.end - offset)
                    yield await pool.run(HotTier.pread, fd, base + offset, length)
                    tally.hot += length
                    offset += length
            finally:
                os.close(fd)
    finally:
        for task in ahead.values():
            task.cancel()
            task.add_done_callback(close_unused)
