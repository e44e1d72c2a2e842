"""Streaming an object's pieces in order, fetching the next ones meanwhile.

Shared by managed objects (staged files, cached or fetched extents) and
mounted ones (cached or fetched pieces). A piece's source is a descriptor
on a hot-tier file, read with pread in blocks in the pool (or, when the
server can send a file itself, handed over as a :class:`Region` of it:
``sendfile``, no read into memory), bytes just fetched from the capacity
side, sent as they are, or an extent still arriving from the store
(:class:`Arrival`), sent in blocks as it comes. ``ReadTally`` counts
what each tier produced.
"""

from __future__ import annotations

import asyncio
import mmap
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import NamedTuple

from packer.ranges import ByteRange
from tiering import pool
from tiering.hot.open_files import Opened, close_unused
from tiering.hot.tier import HotTier
from tiering.reads.arrival import Arrival
from tiering.reads.plan import Block, ReadTally, Region

READ_BLOCK = 1024 * 1024  # bytes per pool call when streaming from a local file


class Held(NamedTuple):
    """A piece's bytes in memory while they are written to the hot tier
    (fetched a moment ago by another read): served from there, counted hot."""

    data: bytes


class Peered(NamedTuple):
    """A piece's bytes as another node sent them: counted peer. Cached here
    only when ``kept``: this node keeps the piece now (its share, handed
    over by the node that kept it before); else that node does."""

    data: bytes
    kept: bool = False


# An open descriptor (the caller's to close), fetched bytes (or an arriving
# extent's buffer, read right after it arrived), held ones, a peer's, or an
# extent arriving.
Source = Opened | bytes | bytearray | mmap.mmap | Held | Peered | Arrival


async def stream(
    pieces: Sequence[tuple[int, ByteRange]],
    open_piece: Callable[[int], Awaitable[Source]],
    *,
    window: int,
    tally: ReadTally,
    prefetch: Callable[[int], bool] = lambda index: True,
    blocks: bool = False,
) -> AsyncIterator[Block]:
    """Yield each (piece index, byte range) of ``pieces`` in order; up to
    ``window`` pieces for which ``prefetch`` says yes are opened ahead (a
    fetch runs meanwhile), the others when their turn comes. With
    ``blocks`` (the consumer is a server that takes them), a piece in a
    hot-tier file is yielded as one :class:`Region` of its descriptor,
    which the consumer sends before it asks for the next block (the
    descriptor is closed then), and an arriving extent's blocks as views of
    its buffer; else every block is bytes.

    Memory: at most ``window`` pieces ahead of the one being sent are
    fetched, each held whole (an extent, 8 MiB by default) until it is sent
    and cached; a hot piece is read 1 MiB at a time, or not at all."""
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
                if type(source) is not bytes:  # an arrival's buffer, held while it is written
                    source = memoryview(source) if blocks else bytes(source)
                yield source if wanted.start == 0 and wanted.end == len(source) else source[wanted.start : wanted.end]
                continue
            if isinstance(source, (bytes, bytearray, mmap.mmap)):
                # Fetched: one send, and no copy for a whole piece. An
                # arrival's buffer (read right after the miss that fetched
                # it) goes as a view to a server that takes one, else as bytes.
                if type(source) is not bytes:
                    source = memoryview(source) if blocks else bytes(source)
                tally.capacity += wanted.end - wanted.start
                whole = wanted.start == 0 and wanted.end == len(source)
                yield source if whole else source[wanted.start : wanted.end]
                continue
            if isinstance(source, Arrival):
                async for block in source.read(wanted.start, wanted.end, views=blocks):
                    tally.capacity += len(block)
                    yield block
                continue
            # One open descriptor per piece: a delete or overwrite that
            # unlinks the file mid-stream does not cut the response short.
            fd, base = source
            try:
                if blocks:
                    tally.hot += wanted.end - wanted.start
                    yield Region(fd, base + wanted.start, wanted.end - wanted.start)
                    continue
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
