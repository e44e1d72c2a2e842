"""Admission by bytes: the one byte semaphore for the buffers requests and
background work hold while they run.

Why bytes and not requests: a refusal made when RSS is already over the
memory budget (gateway/serving/memory.py) comes too late, because the
requests admitted before it keep allocating. What a request will hold is
known before it allocates (a PUT's body blocks, a cold read's extent, a
flush's segment), so it reserves those bytes first, and gives them back
when its buffers are freed. The sum of reservations stays under
:attr:`Admission.limit` (the gateway derives it from its memory budget:
``gateway.serving.memory.buffer_budget``), except that one reservation is
always granted when nothing else is held, so a buffer larger than the
limit still gets its turn, alone ("alone" leaving out what the asker
itself already holds: ``mine``, e.g. a request's body reservation).

The ways to reserve, by who is asking:

- :meth:`Admission.take_now`: new work that has not started (a PUT's body
  not yet read). A few attribute operations, no await; False means
  "answer 503 SlowDown now", never allocate.
- :meth:`Admission.take` with a wait: work already started whose answer
  has not (a body streamed on to the store) waits its turn a bounded time,
  first come first served, before it gives up with
  :class:`~tiering.errors.SlowDown` (:meth:`Admission.hold`).
- :meth:`Admission.hold` with ``force``: as :meth:`Admission.force`, for
  the block of a read under way (an extent fetched and checked), which is
  never refused.
- :meth:`Admission.lend`: as :meth:`Admission.force`, for a buffer that
  outlives the call that fills it (an extent arriving from the store,
  which readers send on and a cache fill writes): its bytes are given back
  when the buffer is freed, whoever held it last.
- :meth:`Admission.force`: work the node needs to make room (the flusher's
  segment builds): it waits its turn a while, then takes its bytes anyway,
  so new work is refused while it runs rather than the flush postponed.

While anyone waits, :meth:`Admission.take_now` refuses, so waiting work is
never starved by a stream of new requests.

With no limit (0: no memory budget) every reservation is granted at once;
the bytes held are still counted for ``GET /stats``. Everything here runs
on the event loop: no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable

from tiering.errors import SlowDown

# Seconds a run of a prefetch or a batch read waits its turn before it
# takes its bytes anyway, and what a held block waits by default before
# it gives up with SlowDown. A read under way waits ROOM_WAIT (lend).
UNDER_WAY_WAIT = 10.0
# What a request's body holds while it is read, whatever its length: the
# body gathered into 1 MiB blocks (tiering/model/digests.py: the block,
# its copy for the pool and the next block arriving) and the server's
# read buffers. Measured: 16 concurrent PUTs of 24 MiB raised RSS by 69
# MiB, about 4 MiB each. The gateway reserves it at the edge
# (gateway/serving/memory.py); a body streamed on reserves more beside it
# (tiering/managed/staging.py).
BODY_HELD = 4 * 1024 * 1024
# Seconds background work that makes room (a flush) waits before it takes
# its bytes regardless.
ROOM_WAIT = 2.0


class Admission:
    """At most ``limit`` bytes of buffers reserved at once (0: no limit)."""

    __slots__ = ("limit", "held", "peak", "high", "refused", "waited", "forced", "_waiting")

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self.held = 0  # bytes reserved now
        self.peak = 0  # the most reserved at once
        self.high = 0  # the most reserved at once since its reader last reset it (the memory sampler)
        self.refused = 0  # reservations not granted (at once or after their wait)
        self.waited = 0  # reservations that had to wait for their bytes
        self.forced = 0  # reservations taken over the limit by work that makes room
        self._waiting: deque[tuple[int, int, asyncio.Future[bool]]] = deque()

    def configure(self, limit: int) -> None:
        """A new limit (0: none); waiters that now fit are let in."""
        self.limit = limit
        self._wake()

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, future in self._waiting if not future.done())

    def _fits(self, size: int, mine: int = 0) -> bool:
        return not self.limit or self.held <= mine or self.held + size <= self.limit

    def _grant(self, size: int) -> None:
        held = self.held = self.held + size
        if held > self.high:
            self.high = held
            if held > self.peak:
                self.peak = held

    def take_now(self, size: int) -> bool:
        """Reserve ``size`` bytes if they fit now and nobody waits; False
        (and nothing reserved) otherwise."""
        if self._waiting or not self._fits(size):
            self.refused += 1
            return False
        self._grant(size)
        return True

    async def take(self, size: int, wait: float, mine: int = 0) -> bool:
        """Reserve ``size`` bytes, waiting up to ``wait`` seconds, in turn,
        while they do not fit (``mine``: bytes the caller holds already);
        False (nothing reserved) when they did not. Nothing (0 bytes) is
        always had at once."""
        if not size or (not self._waiting and self._fits(size, mine)):
            self._grant(size)
            return True
        self.waited += 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        entry = (size, mine, future)
        self._waiting.append(entry)
        timer = loop.call_later(wait, _expire, future)
        try:
            granted = await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.result():
                self.give(size)  # granted just as the caller was cancelled
            raise
        finally:
            timer.cancel()
            with contextlib.suppress(ValueError):
                self._waiting.remove(entry)
            self._wake()  # an expired head of the line may have held others back
        if not granted:
            self.refused += 1
        return granted

    async def force(self, size: int, wait: float = ROOM_WAIT) -> None:
        """Reserve ``size`` bytes: in turn if they come within ``wait``
        seconds, else at once over the limit."""
        if not await self.take(size, wait):
            self.refused -= 1  # not a refusal: taken anyway
            self.forced += 1
            self._grant(size)

    def give(self, size: int) -> None:
        """Give back ``size`` bytes reserved before; waiters that now fit
        get theirs, first come first served."""
        self.held -= size
        if self._waiting:
            self._wake()

    def _wake(self) -> None:
        waiting = self._waiting
        while waiting:
            size, mine, future = waiting[0]
            if future.done():  # expired or cancelled: its taker removes it too
                waiting.popleft()
                continue
            if not self._fits(size, mine):
                return
            waiting.popleft()
            self._grant(size)
            future.set_result(True)

    @contextlib.asynccontextmanager
    async def hold(self, size: int, wait: float = UNDER_WAY_WAIT, mine: int = 0, *,
                   force: bool = False) -> AsyncIterator[None]:
        """``size`` bytes reserved for the block (:meth:`take`), given back
        after it; SlowDown when they could not be had within ``wait``.
        With ``force``, taken anyway then (:meth:`force`): for a read under
        way, which is never refused (:meth:`lend` says why)."""
        if force:
            await self.force(size, wait)
        elif not await self.take(size, wait, mine):
            raise SlowDown("The gateway is at its memory budget for buffers in flight; retry shortly",
                           cause="memory")
        try:
            yield
        finally:
            self.give(size)

    async def lend(self, buffer: object, size: int, wait: float = ROOM_WAIT,
                   when_free: Callable[[object, Callable[[], None]], bool] | None = None) -> None:
        """Reserve ``size`` bytes for as long as ``buffer`` is in use: until
        ``when_free`` says nothing else refers to it (a pool's, which keeps
        the buffer for its next use: ``tiering/reads/buffers.py``; it
        returns False for a buffer not its own), else until it dies (it
        must take weak references: an ``mmap``). In turn
        if they come within ``wait`` seconds, else at once over the limit
        (:meth:`force`). The last holder may let go on another thread (a
        cache fill's writer): the bytes are given back on the loop.

        Forced, not refused: a lent buffer is a read under way (the next
        piece of an answer whose head, and maybe most of its body, has gone
        out). Refusing it would cut that answer short, and the client would
        read it again from its start, holding more than it saves. What
        bounds these is the reads themselves: each holds a few pieces (its
        window, the fills' writer ``BEHIND``), and new reads are refused at
        the edge (gateway/serving/memory.py)."""
        if not size:
            return
        await self.force(size, wait)
        if when_free is None or not when_free(buffer, functools.partial(self.give, size)):
            weakref.finalize(buffer, _give_on, asyncio.get_running_loop(), self, size)

    def stats(self) -> dict[str, int | None]:
        """The ``admission`` part of ``GET /stats``'s ``memory``."""
        return {
            "limit": self.limit or None,
            "held": self.held,
            "peak": self.peak,
            "waiting": self.waiting,
            "refused": self.refused,
            "waited": self.waited,
            "forced": self.forced,
        }


def _give_on(loop: asyncio.AbstractEventLoop, admission: Admission, size: int) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits any more
        loop.call_soon_threadsafe(admission.give, size)


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)


# The process's admission: memory is a process's (as tiering.memo.CACHES is).
ADMISSION = Admission()
