"""An extent's bytes while they arrive from the store, sent on before the
last one came.

A cold read of a large object used to send nothing of an extent until all
of it had arrived and its CRC had been checked: with eight 8 MiB extents
fetched at once, sharing the store's bandwidth, the client's first byte
waited for about 64 MiB. An extent stored as it is (codec ``none``: its
stored bytes are its raw bytes) is now read into an :class:`Arrival`
instead: the socket's bytes land in the extent's buffer as they come, the
CRC is carried along as they land, and readers send them on at once.

The CRC is a CRC32C for extents of segments written since footer version 3
(packer/crc.py): about 1 us per 32 KiB, carried on the event loop as each
piece lands. A segment written before carries zlib's CRC32, 25 us per
32 KiB, which is carried in the pool a MiB at a time.

What keeps that safe:

- **The bytes that end a reader's range wait for the check.** The piece
  holding a range's last byte is handed out only once the whole extent has
  arrived and its CRC matched. A body built from arrivals therefore cannot
  end on unchecked bytes: if the CRC fails, the reader raises before its
  last bytes, and the client sees a body shorter than its Content-Length,
  which every HTTP client reports as an error. Wrong bytes never pass as a
  complete answer.
- **A mismatch is fetched again whole and checked** (``ExtentReader``). A
  reader that has sent nothing of the extent yet then sends the checked
  bytes; one that has sent some goes on only if they equal the checked
  bytes at the same offsets, else it fails (the answer is cut short).
- **Memory**: an arrival holds one extent (``part_size``, 8 MiB by
  default) until its cache fill has written it, as a fetched extent did;
  it is the same buffer the cache fill writes, and readers send slices of.
  Once nothing refers to it, the next extent or piece of its size lands in
  it (``tiering/reads/buffers.py``).

Compressed extents (zstd) keep the whole-extent path: their CRC covers the
compressed bytes, so nothing decoded could be checked before the end
either, decoding in pieces would cost a pool call each, and a large
extent is only compressed where that saves at least 5 %: data sets of
JPEGs, video, packed tensors or compressed shards are stored as they are.
"""

from __future__ import annotations

import asyncio
import mmap
import zlib
from collections.abc import AsyncIterator
from typing import Any

from packer.crc import extent_crc
from tiering import pool
from tiering.admission import ADMISSION
from tiering.errors import CapacityError
from tiering.reads.buffers import BUFFERS

# Bytes a CRC32 is carried over per pool call (2.8 GB/s here: about 0.4 ms).
CRC_STEP = 1024 * 1024
# A reader hands out at least this many bytes at a time (unless its range
# ends sooner): a store sends a large GET in pieces of 16 to 64 KiB (rclone
# writes 32 KiB at a time), and a send per piece cost the gateway more CPU
# than the whole GET did before.
BLOCK = 512 * 1024
# After a range's first block, a reader waits for this many: the first
# bytes leave early, the rest in fewer sends and wake-ups (512 KiB blocks
# cost a cold GiB about 0.3 s more CPU than whole 8 MiB pieces did).
LATER_BLOCK = 4 * BLOCK


class Arrival:
    """The stored bytes of one extent of ``size`` bytes and CRC ``crc`` (a
    CRC32C if ``crc32c``, else zlib's CRC32) as they arrive, readable
    meanwhile (:meth:`read`); settled by its fetch with the checked bytes
    or an error. With ``crc`` None (a piece of a mounted object: S3 sends
    no checksum of a range), the check is the length: every byte arrived.

    It is the ``Into`` of the store's GET (``tiering/capacity/store.py``):
    the bytes land in one buffer of the extent's size (the event loop reads
    the socket straight into it), which is also what the cache fill writes
    and what readers send slices of: no copy of the extent in this process."""

    __slots__ = ("size", "_crc", "_crc32c", "_crc_at", "_checking", "_expect", "_buf", "_view", "received",
                 "checked", "corrupt", "_wake", "_wake_at", "outcome")

    def __init__(self, size: int, crc: int | None, crc32c: bool = False) -> None:
        self.size = size
        self._expect = crc
        self._crc32c = crc32c
        self._crc = 0
        self._crc_at = 0  # the CRC covers the bytes before this
        self._checking: asyncio.Future[None] | None = None  # the pool carrying a CRC32 on
        # Anonymous memory, not a bytearray (zeroed with a memset only for
        # the socket's bytes to overwrite it), used again once nothing
        # refers to it (tiering/reads/buffers.py): a new mapping per piece cost
        # a fault and a zeroed page per 4 KiB.
        self._buf = BUFFERS.take(size) if size else bytearray()
        self._view = memoryview(self._buf)
        self.received = 0
        self.checked = False  # all arrived, CRC matched
        self.corrupt = False  # all arrived, CRC did not match
        self._wake: asyncio.Future[None] | None = None
        self._wake_at = size  # readers wait until this many bytes are in (or the end)
        # The extent's checked bytes, whole (after a refetch, if need be), or
        # the error that ended the fetch. Set by ExtentReader.
        self.outcome: asyncio.Future[bytes | bytearray] = asyncio.get_running_loop().create_future()
        self.outcome.add_done_callback(_retrieve)

    async def reserve(self) -> None:
        """Reserve the buffer's bytes in the memory budget's admission for
        as long as it is in use: readers send it on, the fill writes it,
        and its pool tells the admission once nothing holds it."""
        await ADMISSION.lend(self._buf, self.size, when_free=BUFFERS.when_free)

    # -- the store's side (an Into) ------------------------------------------

    def buffer(self) -> memoryview:
        """Where the next bytes go: the rest of the extent."""
        return self._view[self.received :]

    def landed(self, count: int) -> None:
        """``count`` more bytes are in: readers woken once what they wait
        for is in, and the CRC carried on over them: a CRC32C at once, a
        CRC32 in the pool, a step at a time (on the event loop a CRC32 cost
        about 8 us per 32 KiB, a third of the loop's time in a cold GET)."""
        if self.checked or self.corrupt or count <= 0:
            return
        self.received += count
        if self._expect is None:
            if self.received >= self.size:
                self._judge()
        elif self._crc32c:
            self._crc = extent_crc(self._view[self._crc_at : self.received], True, self._crc)
            self._crc_at = self.received
            if self._crc_at >= self.size:
                self._judge()
        elif self._checking is None and (self.received - self._crc_at >= CRC_STEP or self.received >= self.size):
            self._checking = asyncio.ensure_future(self._check())
        if self.received >= self._wake_at:
            self._wakeup()

    async def _check(self) -> None:
        """Carry a CRC32 over what landed, one pool call per step; the
        verdict once it covers the whole extent."""
        while self.received - self._crc_at >= CRC_STEP or self._crc_at < self.received >= self.size:
            end = self.received
            self._crc = await pool.run(zlib.crc32, self._view[self._crc_at : end], self._crc)
            self._crc_at = end
        self._checking = None  # with no await since the test above: landed() starts another when due
        if self._crc_at >= self.size:
            self._judge()

    def _judge(self) -> None:
        """The CRC covers every byte: the verdict, and readers woken."""
        self.checked = self._expect is None or self._crc == self._expect
        self.corrupt = not self.checked
        self._wakeup()

    async def verdict(self) -> None:
        """Until the CRC covers every byte (all have landed)."""
        while not (self.checked or self.corrupt):
            await self._until(self.size)

    @property
    def data(self) -> mmap.mmap | bytearray:
        """The whole extent's bytes (checked once ``checked``)."""
        return self._buf

    def settle(self, data: bytes | bytearray | None, error: BaseException | None = None) -> None:
        """The fetch ended: the extent's checked bytes, or why there are none."""
        if not self.outcome.done():
            if error is not None:
                self.outcome.set_exception(error)
            else:
                assert data is not None
                self.outcome.set_result(data)
        self._wakeup()

    def failed_with(self, task: asyncio.Future[Any], what: str) -> None:
        """The fetch ``task`` that fills this arrival ended: if it failed (or
        was cancelled: the gateway stops), settle readers with why."""
        if task.cancelled():
            self.settle(None, CapacityError(f"the {what}'s fetch was cancelled (the gateway stops)"))
        elif (exc := task.exception()) is not None:
            self.settle(None, exc)

    def _wakeup(self) -> None:
        self._wake_at = self.size
        wake, self._wake = self._wake, None
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _until(self, received: int) -> None:
        """Until ``received`` bytes are in, or all, or the fetch ended."""
        self._wake_at = min(self._wake_at, received)
        if self._wake is None:
            self._wake = asyncio.get_running_loop().create_future()
        await self._wake

    # -- readers -----------------------------------------------------------------

    async def read(self, start: int, end: int, views: bool = False) -> AsyncIterator[bytes | memoryview]:
        """The bytes ``[start, end)`` of the extent as they arrive, at least
        ``BLOCK`` at a time: slices of its buffer with ``views`` (for a
        consumer that sends them before they could change: they never do
        once landed), else copies. The range's last byte only once the
        extent is checked (see the module's docstring), or, checked by its
        length, once it landed. Raises CapacityError
        when the extent could not be fetched intact, or when bytes sent
        already differ from the ones fetched again."""
        at = start
        while at < end:
            if self.corrupt or (self.outcome.done() and not self.checked):
                break
            # What may go now: up to the end once checked; while bytes are
            # still on the way, all that is in but the range's last byte;
            # nothing once all are in and the CRC's verdict is due.
            if self.checked:
                limit = end
            elif self._expect is None:  # checked by length: a byte that landed is as good as it gets
                limit = min(self.received, end)
            else:
                limit = min(self.received, end - 1) if self.received < self.size else at
            step = BLOCK if at == start else LATER_BLOCK
            if limit - at >= step or (limit == end and limit > at) or (limit > at and self.received >= end):
                block = self._view[at:limit]
                at = limit
                yield block if views else bytes(block)
                continue
            await self._until(min(at + step, end) if self.received < end else self.size)
        if at >= end:
            return
        # Not from the buffer: it failed its CRC (or the fetch failed).
        data = await asyncio.shield(self.outcome)  # raises when the refetch failed too
        if at > start and memoryview(data)[start:at] != self._view[start:at]:
            raise CapacityError(
                f"an extent of {self.size} bytes failed its CRC after {at - start} of them were sent, "
                "and those differ from the bytes fetched again; the answer is cut short"
            )
        yield data[at:end]


def _retrieve(future: asyncio.Future[bytes | bytearray]) -> None:
    # An outcome nobody read (no reader was left) must not log "never retrieved".
    if not future.cancelled():
        future.exception()
