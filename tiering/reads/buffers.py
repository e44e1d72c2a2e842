"""Arriving extents' buffers, used again once nothing refers to them.

An extent or mounted piece arrives from the store into anonymous memory of
its size (``tiering/reads/arrival.py``). Fresh anonymous memory costs the
kernel a page fault and a page of zeros for every 4 KiB the socket then
writes: 0.66 ms of CPU per MiB here, against 0.05 for a buffer whose pages
are there already, and on a cold large GET that was the largest cost left
on the event loop's thread after the socket copies.

So an arrival that is gone gives its buffer back (:meth:`Buffers.give`),
and the next arrival of the same size takes it (:meth:`Buffers.take`) if
nothing refers to it any more: no reader's slice, no fill writing it, no
settled outcome holding it, no transport with it in its write buffer.
CPython's reference count says so exactly, since every slice and every
memoryview of the buffer keeps a reference to it; a buffer still referred
to is left for later, and dropped from here after ``IDLE`` seconds or when
the bytes given back pass the bound.

The retired buffers are a cache like any other: their bound is the
``buffers`` kind's in the registry (``tiering/memo.py``), squeezed with the
others under memory pressure and shown in ``GET /stats``. A bound smaller
than one buffer keeps none: every arrival then takes fresh memory, as
before.
"""

from __future__ import annotations

import mmap
import sys
import threading
import time
from collections import deque

from tiering.memo import CACHES, Caches

# Seconds a given-back buffer waits to be taken again before it is let go.
IDLE = 5.0
# References to a retired buffer nobody else holds, as take() counts them:
# its entry in the retired list, the loop's name for it, getrefcount's argument.
_FREE_REFS = 3


def anonymous(size: int) -> mmap.mmap:
    """``size`` bytes of fresh private anonymous memory (not a bytearray:
    that is zeroed with a memset that faults in every page only for the
    socket's bytes to overwrite them; the kernel zeroes these as they are
    first written. Private: a shared mapping would be shmem, dearer to
    fault in and to free)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


class Buffers:
    """The retired buffers: those given back, oldest first, at most
    ``bound`` bytes of them (the registry's ``buffers`` kind)."""

    name = "buffers"

    def __init__(self, registry: Caches | None = None) -> None:
        self._retired: deque[tuple[mmap.mmap, float]] = deque()
        self.bytes = 0
        self.bound = 0
        self.reused = 0  # buffers taken again
        self._lock = threading.Lock()
        (registry or CACHES).join(self)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._retired)

    def take(self, size: int) -> mmap.mmap:
        """A buffer of ``size`` bytes: a retired one nothing refers to, or
        fresh memory. Its bytes are whatever was in it: the caller writes
        each before it reads it."""
        with self._lock:
            self._expire(time.monotonic())
            for index, (buf, _) in enumerate(self._retired):
                if len(buf) == size and sys.getrefcount(buf) == _FREE_REFS:
                    del self._retired[index]
                    self.bytes -= size
                    self.reused += 1
                    return buf
        return anonymous(size)

    def give(self, buf: mmap.mmap) -> None:
        """``buf``'s arrival is gone: it may be taken again once nothing
        else refers to it. Any thread (the last reference may go anywhere)."""
        size = len(buf)
        with self._lock:
            self._expire(time.monotonic())
            if size > self.bound:
                return
            self._retired.append((buf, time.monotonic()))
            self.bytes += size
            self._shrink(self.bound)

    def fit(self, bound: int) -> None:
        """Hold at most ``bound`` bytes of retired buffers from now on."""
        with self._lock:
            self.bound = bound
            self._shrink(bound)

    def clear(self) -> None:
        with self._lock:
            self._retired.clear()
            self.bytes = 0

    def expire(self) -> None:
        """Let go of those given back more than IDLE ago (the gateway asks
        now and then: with no arrivals, nothing else would)."""
        with self._lock:
            self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        """Under the lock: let go of those given back more than IDLE ago."""
        retired = self._retired
        while retired and now - retired[0][1] > IDLE:
            self.bytes -= len(retired.popleft()[0])

    def _shrink(self, bound: int) -> None:
        """Under the lock: let go of the oldest while over ``bound``."""
        retired = self._retired
        while retired and self.bytes > bound:
            self.bytes -= len(retired.popleft()[0])


BUFFERS = Buffers()
