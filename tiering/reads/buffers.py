"""The buffers large pieces arrive in, used again once nothing refers to them.

A cold read of a large object lands each piece (8 MiB by default) from the
store in a buffer of its own (``tiering/reads/arrival.py``), which readers
send slices of and the hot tier's fill writes. A fresh anonymous mapping
for every piece costs the kernel a page fault and a zeroed page per 4 KiB,
and an unmapping after: 0.41-0.44 s of system time for a GiB of 8 MiB
buffers on this machine, against none for the same buffer written again.
That was about a third of the gateway's CPU for a cold 1 GiB read.

So a piece's buffer comes from :data:`BUFFERS`, which keeps every buffer it
handed out until nothing else refers to it: no arrival, no reader's slice
(a ``memoryview`` of the buffer holds a reference to it, however it was
sliced, until it is released), no transport still holding a slice to send,
no fill waiting for the writer. CPython's reference count says when that
is; no holder has to give the buffer back, so none can forget to, and a
buffer still referenced is never handed out. A free buffer is then kept
(at most ``KEEP`` of them, for ``QUIET`` seconds of no use) for the next
piece of its size, or unmapped.

The memory budget's admission (``tiering/admission.py``) lends a piece's
bytes for as long as its buffer is in use: :meth:`Buffers.when_free` tells
it when that ended. While buffers are lent, they are looked at every
``LOOK_EVERY`` seconds, and at every :meth:`Buffers.take`.

Everything here runs on the event loop. A reference dropped on another
thread (the fills' writer) is seen at the next look.
"""

from __future__ import annotations

import asyncio
import mmap
import sys
from collections.abc import Callable

# Free buffers kept for the next pieces: enough for a read's window to turn
# over without a new mapping, few enough that a node at rest holds little.
KEEP = 4
# Seconds a free buffer is kept while no piece asks for one.
QUIET = 5.0
# Seconds between looks at the buffers in use while a lender waits to hear.
LOOK_EVERY = 0.02


class _Lent:
    """A buffer handed out, and who waits to hear that it is free."""

    __slots__ = ("buffer", "freed")

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.freed: list[Callable[[], None]] = []


# References to a lent buffer when nothing else holds it: its _Lent's
# attribute and sys.getrefcount's own argument.
_UNHELD = 2


class Buffers:
    """Anonymous buffers for pieces, handed out and taken back when unused."""

    def __init__(self, keep: int = KEEP, quiet: float = QUIET) -> None:
        self.keep = keep
        self.quiet = quiet
        self._lent: list[_Lent] = []
        self._free: dict[int, list[mmap.mmap]] = {}
        # Timers, each with its loop (a process may run loops one after another: tests).
        self._look: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None
        self._drop: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None
        self.made = 0  # new mappings
        self.reused = 0  # buffers handed out again

    def take(self, size: int) -> mmap.mmap:
        """A buffer of ``size`` bytes (more than 0), free or new. Its bytes
        are whatever it held before: a piece tells what landed in it."""
        self.look()
        free = self._free.get(size)
        if free:
            buffer = free.pop()
            self.reused += 1
        else:
            # Private: a shared mapping would be shmem, dearer to fault in and to free.
            buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self.made += 1
        self._lent.append(_Lent(buffer))
        return buffer

    def when_free(self, buffer: object, freed: Callable[[], None]) -> bool:
        """Call ``freed`` (on the loop) once nothing but this refers to
        ``buffer`` (at once if that is so already: taken back meanwhile);
        False if ``buffer`` is not one of these."""
        for lent in self._lent:
            if lent.buffer is buffer:
                lent.freed.append(freed)
                self._look_soon()
                return True
        if any(kept is buffer for free in self._free.values() for kept in free):
            freed()
            return True
        return False

    @property
    def free(self) -> int:
        """Free buffers kept now."""
        return sum(len(free) for free in self._free.values())

    @property
    def lent(self) -> int:
        """Buffers handed out that were still referenced at the last look."""
        return len(self._lent)

    def look(self) -> None:
        """Take back the buffers nothing refers to any more: their lenders
        told, each kept for the next piece of its size or unmapped."""
        held: list[_Lent] = []
        for lent in self._lent:
            if sys.getrefcount(lent.buffer) > _UNHELD:
                held.append(lent)
                continue
            for freed in lent.freed:
                freed()
            self._put(lent.buffer)
        self._lent = held
        if any(lent.freed for lent in held):
            self._look_soon()

    def _put(self, buffer: mmap.mmap) -> None:
        if self.free >= self.keep:
            buffer.close()
            return
        self._free.setdefault(len(buffer), []).append(buffer)
        if self._drop is not None:
            self._drop[1].cancel()
        loop = asyncio.get_running_loop()
        self._drop = (loop, loop.call_later(self.quiet, self._quiet))

    def _quiet(self) -> None:
        """No piece asked for a buffer for ``quiet`` seconds: unmap the free ones."""
        self._drop = None
        for free in self._free.values():
            for buffer in free:
                buffer.close()
        self._free.clear()

    def _look_soon(self) -> None:
        loop = asyncio.get_running_loop()
        if self._look is None or self._look[0] is not loop:
            self._look = (loop, loop.call_later(LOOK_EVERY, self._looked))

    def _looked(self) -> None:
        self._look = None
        self.look()


# The process's buffers (as tiering.admission.ADMISSION is the process's).
BUFFERS = Buffers()
