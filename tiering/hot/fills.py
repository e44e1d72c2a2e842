"""Hot-tier fills that run behind the answers whose bytes they cache.

A read that fetched bytes from a store answers with them at once; writing
them to the hot tier (a file write and a rename) runs after, by a writer
thread of its own that takes the fills queued meanwhile together (the
pool's threads once it falls behind). While it runs its bytes are held here: a read of the
same name takes them instead of fetching again, and a warm, which reports
what is in the hot tier, waits for the write. Used for extents
(``tiering/reads/fetch.py``) and mounted pieces (``tiering/mounts/buckets.py``).

The same thread writes what such reads learnt behind their answers, many
reads' worth in one call (:meth:`Fills.gather`: the index records of a
batch of mounted misses in one database write).

What the fills hold is bounded by the reads that make them: a cold read
of a large object asks for room (:meth:`Fills.room`) before it fetches
another piece, so the writer is never more than ``BEHIND`` pieces behind
it (docs/benchmarks/large-objects.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from tiering import pool

log = logging.getLogger("tierstore.fills")

# Bytes of fills not yet written (``Fills.bytes``) past which new ones go
# to the pool instead of the writer thread: enough for the misses of a
# busy node to be written in batches and to ride out a writer slowed for a
# while, few enough that a slow disk cannot hold more than this in memory.
# Counted in fills (64) it spilled too soon: where new page-cache pages
# are dear (this machine past a few GiB written: 150 us a 64 KiB write
# against 20), a hinted epoch's fills went to the pool's 16 threads,
# whose wake-ups and GIL handoffs cost more than the writes (0.83-0.88
# against 0.74 ms of CPU an object, 1,040-1,100 against 1,170-1,180
# objects/s; docs/benchmarks/cold-miss-whole-process.md).
WRITER_BACKLOG = 32 * 1024 * 1024
# What the loop submits is posted to the writer thread this long after the
# first of it, or once POST_ITEMS wait: the misses of a few milliseconds
# wake the writer once. At 4 ms a cold epoch's writer woke for two misses
# or so, and each wake (the thread's, its GIL handoffs, the loop's) cost
# it more system time than the two writes; at 10 ms it takes about five.
POST_DELAY = 0.01
POST_ITEMS = 16
# A fill at least this large is posted to the writer at once and settled
# as soon as it is written, not with its batch: its bytes (a large piece,
# 8 MiB by default) are what a cold read's memory is made of, and a post
# or a settle costs nothing beside writing them.
LARGE = 1024 * 1024
# Pieces a cold read lets the writer fall behind by before it fetches
# another (Fills.room): with the pieces it keeps in flight, what bounds
# its memory.
BEHIND = 2
# Seconds a read waits for that (Fills.room) before it goes on regardless.
ROOM_WAIT = 10.0


class FillTarget(Protocol):
    """Where fills are written: the hot tier (``HotTier``)."""

    def fill(self, name: str, data: bytes, pin: bool = False) -> bool: ...

    def fill_many(self, fills: Sequence[tuple[str, bytes, bool]]) -> list[bool | BaseException]: ...


# What a fill came to: True cached, False not (no room, a full or failing
# disk), or what it raised.
Outcome = bool | BaseException


class _Running:
    """A fill running now: its bytes, held for readers meanwhile, and the
    future of its outcome, made only once someone asks to wait for it (most
    fills, behind a cold read's answer, have no waiter)."""

    __slots__ = ("name", "data", "pin", "by_writer", "future")

    def __init__(self, name: str, data: bytes, pin: bool, by_writer: bool) -> None:
        self.name = name
        self.data = data
        self.pin = pin
        self.by_writer = by_writer  # else by the pool's threads
        self.future: asyncio.Future[bool] | None = None


class Fills:
    """The fills running now, by hot-tier name, and their writer."""

    def __init__(self, target: FillTarget) -> None:
        self._target = target
        self._running: dict[str, _Running] = {}
        self._writer = _Writer(target, self._ended)
        self._pooled: set[asyncio.Task[None]] = set()
        self.bytes = 0  # of the fills running now
        self._queued = 0  # fills handed to the writer, not ended yet
        self._room: list[asyncio.Future[None]] = []  # reads waiting for fills to end (room)

    def write(self, name: str, data: bytes, pin: bool = False) -> None:
        """Cache ``data`` as ``name`` (pinned with ``pin``) behind the
        caller, by the fills' writer thread; ``task`` gives a future of the
        outcome to whoever must wait for it. The bytes are held until it
        ends, registered before the caller yields, so a reader right after
        finds them."""
        running = _Running(name, data, pin, self.bytes + len(data) <= WRITER_BACKLOG or not self._queued)
        if (replaced := self._running.get(name)) is not None:
            self.bytes -= len(replaced.data)  # it ends uncounted
        self._running[name] = running
        self.bytes += len(data)
        if running.by_writer:
            self._queued += 1
            self._writer.submit(running)
        else:  # the writer falls behind (a slow disk): the pool's threads write in parallel
            task = asyncio.ensure_future(self._in_pool(running))
            self._pooled.add(task)
            task.add_done_callback(self._pooled.discard)

    async def _in_pool(self, running: _Running) -> None:
        try:
            outcome: Outcome = await pool.run(self._target.fill, running.name, running.data, running.pin)
        except asyncio.CancelledError as exc:
            self._ended([(running, exc)])
            raise
        except Exception as exc:  # noqa: BLE001  the fill's outcome, to whoever waits for it
            outcome = exc
        self._ended([(running, outcome)])

    async def room(self, most: int, wait: float = ROOM_WAIT) -> bool:
        """Until the fills running hold at most ``most`` bytes (True), or
        ``wait`` seconds went by (False). A cold read asks before it
        fetches a large piece: its pieces are written behind the answer,
        and a client that takes bytes faster than the writer writes them
        would otherwise leave a backlog of pieces in memory (19 of 8 MiB
        were seen behind one 1 GiB read on a loaded node); this way the
        read goes at the writer's pace instead. A writer stuck that long
        (a disk that hangs) does not stop the reads: they go on, holding
        what they hold, and the admission by bytes still bounds them."""
        if self.bytes <= most:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while self.bytes > most:
            left = deadline - loop.time()
            if left <= 0:
                log.warning("cache fills are %d bytes behind for %.0f s: reads go on", self.bytes, wait)
                return False
            waiter = loop.create_future()
            self._room.append(waiter)
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                pass
            finally:
                with contextlib.suppress(ValueError):
                    self._room.remove(waiter)
        return True

    def gather(self, call: Callable[..., None], head: Any, item: Any) -> None:
        """Have the writer thread call ``call(head, *items)`` with ``item``
        among the items gathered for the same ``call`` and ``head`` by the
        end of its batch (after the batch's fills). Nothing waits for it; an
        error is logged."""
        self._writer.gather(call, head, item)

    def __contains__(self, name: str) -> bool:
        return name in self._running

    def _ended(self, results: list[tuple[_Running, Outcome]]) -> None:
        """Fills ended (a batch of the writer's, or one of the pool's): their
        bytes go, their waiters learn the outcome, reads waiting for room
        look again."""
        for running, outcome in results:
            if running.by_writer:
                self._queued -= 1
            if self._running.get(running.name) is running:
                del self._running[running.name]
                self.bytes -= len(running.data)
            if isinstance(outcome, OSError):  # a full or failing disk costs the cache, not the read
                log.warning("could not cache %s: %s", running.name, outcome)
                outcome = False
            _settle(running, outcome)
        for waiter in self._room:  # each looks again
            if not waiter.done():
                waiter.set_result(None)

    def held(self, name: str) -> bytes | None:
        """The bytes a running fill of ``name`` is writing, or None."""
        running = self._running.get(name)
        return running.data if running is not None else None

    def task(self, name: str) -> asyncio.Future[bool] | None:
        """A future of the outcome of the fill of ``name`` running now
        (True: cached; what it raised), or None when none runs."""
        running = self._running.get(name)
        return _future(running) if running is not None else None

    async def wait(self, names: Iterable[str]) -> None:
        """Until the running fills of any of ``names`` have ended."""
        tasks = [_future(running) for name in names if (running := self._running.get(name)) is not None]
        if tasks:
            await asyncio.gather(*(asyncio.shield(task) for task in tasks), return_exceptions=True)

    async def drain(self) -> None:
        """Until no fill runs and every gathered call ran (at shutdown); the
        writer thread then ends."""
        while self._running:
            await asyncio.gather(*[_future(running) for running in self._running.values()],
                                 return_exceptions=True)
        await self._writer.flushed()
        self._writer.stop()


def _future(running: _Running) -> asyncio.Future[bool]:
    if running.future is None:
        running.future = asyncio.get_running_loop().create_future()
    return running.future


def _settle(running: _Running, outcome: Outcome) -> None:
    future = running.future
    if future is None:
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            log.error("cache fill of %s failed", running.name, exc_info=outcome)
    elif future.done():
        pass
    elif isinstance(outcome, asyncio.CancelledError):
        future.cancel()
    elif isinstance(outcome, BaseException):
        future.set_exception(outcome)
        future.exception()  # retrieved: a caller that waits sees it; none that does not
    else:
        future.set_result(outcome)


class _Gathered(NamedTuple):
    call: Callable[..., None]
    head: Any
    item: Any


class _Fill(NamedTuple):
    """A fill for the writer thread: the loop to tell, the fill, and
    whether it is written and told on its own (a large one)."""

    loop: asyncio.AbstractEventLoop
    running: _Running
    alone: bool


Ended = Callable[[list[tuple[_Running, Outcome]]], None]


class _Writer:
    """A thread of its own that writes fills, those queued meanwhile
    together (``fill_many``: one write for a batch's log records), and
    tells the loop once per batch (a large fill at once, as soon as it is
    written: its bytes go then). In the pool, a fill behind each answer
    cost about 185 us of CPU where the write itself costs 46: a thread
    woken for each, a second settling through the loop, a task around it
    (docs/performance.md)."""

    def __init__(self, target: FillTarget, ended: Ended) -> None:
        self._target = target
        self._ended = ended
        # What the loop submitted since the first of it: posted to the thread
        # as one list POST_DELAY later, so the misses answered meanwhile
        # wake the writer once (woken for each, it took them one at a time).
        self._outbox: list[_Fill | _Gathered] = []
        self._queue: queue.SimpleQueue[list[_Fill | _Gathered] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, running: _Running) -> None:
        loop = asyncio.get_running_loop()
        large = len(running.data) >= LARGE
        self._put(loop, _Fill(loop, running, large))
        if large:
            self._post()

    def gather(self, call: Callable[..., None], head: Any, item: Any) -> None:
        self._put(asyncio.get_running_loop(), _Gathered(call, head, item))

    async def flushed(self) -> None:
        """Until what was queued before this call ran (its gathered calls too)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self.gather(_wake, (loop, future), None)  # its own key: the batch's last call
        await future

    def _put(self, loop: asyncio.AbstractEventLoop, item: _Fill | _Gathered) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tierstore-fills", daemon=True)
            self._thread.start()
        self._outbox.append(item)
        if len(self._outbox) == 1:
            loop.call_later(POST_DELAY, self._post)
        elif len(self._outbox) >= POST_ITEMS:
            self._post()  # the timer finds the outbox empty, or the next items

    def _post(self) -> None:
        if self._outbox:
            items, self._outbox = self._outbox, []
            self._queue.put(items)

    def stop(self) -> None:
        if self._thread is not None:
            self._post()
            self._queue.put(None)
            self._thread = None

    def _batch(self) -> list[_Fill | _Gathered | None]:
        """What was posted, waited for, and what more is queued (None: stop).
        The one list that holds the items, so a large one's bytes go once
        its entry is cleared."""
        posted = self._queue.get()
        batch: list[_Fill | _Gathered | None] = posted if posted is not None else [None]
        with contextlib.suppress(queue.Empty):
            while len(batch) < 64:
                more = self._queue.get_nowait()
                batch.extend(more if more is not None else [None])
        return batch

    def _run(self) -> None:
        while True:
            batch = self._batch()
            small: list[_Fill] = []
            gathered: dict[tuple[Callable[..., None], Any], list[Any]] = {}
            stop = False
            for at, item in enumerate(batch):
                if item is None:
                    stop = True
                elif isinstance(item, _Gathered):
                    gathered.setdefault((item.call, item.head), []).append(item.item)
                elif item.alone:
                    batch[at] = None  # a large fill's bytes go as soon as it is told
                    _tell(item.loop, self._ended, [(item.running, self._fill(item.running))])
                else:
                    small.append(item)
                del item
            outcomes = self._fill_many([fill.running for fill in small]) if small else []
            for (call, head), items in gathered.items():
                try:
                    call(head, *items)
                except Exception as exc:  # noqa: BLE001  what a read learnt is not worth the thread
                    log.warning("could not write %d records behind their reads: %s", len(items), exc)
            done: dict[asyncio.AbstractEventLoop, list[tuple[_Running, Outcome]]] = {}
            for fill, outcome in zip(small, outcomes, strict=True):
                done.setdefault(fill.loop, []).append((fill.running, outcome))
            for loop, results in done.items():
                _tell(loop, self._ended, results)
            if stop:
                return

    def _fill(self, running: _Running) -> Outcome:
        try:
            return bool(self._target.fill(running.name, running.data, running.pin))
        except Exception as exc:  # noqa: BLE001  handed to whoever waits for the fill
            return exc

    def _fill_many(self, fills: list[_Running]) -> list[Outcome]:
        try:
            return self._target.fill_many([(running.name, running.data, running.pin) for running in fills])
        except Exception as exc:  # noqa: BLE001  handed to whoever waits for the fills
            return [exc] * len(fills)


def _tell(loop: asyncio.AbstractEventLoop, ended: Ended, results: list[tuple[_Running, Outcome]]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(ended, results)


def _wake(head: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]], *_: Any) -> None:
    loop, future = head
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_set_none, future)


def _set_none(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
