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
import functools
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NamedTuple

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


async def _logged(name: str, fill: Awaitable[bool | None]) -> bool:
    """Await a hot-tier write of ``name``: True when it cached the bytes.
    A full or failing disk (OSError) costs the cache, not the read that
    fetched them: logged, False."""
    try:
        return bool(await fill)
    except OSError as exc:
        log.warning("could not cache %s: %s", name, exc)
        return False


class Fills:
    """The fills running now, by hot-tier name: their bytes and tasks."""

    def __init__(self) -> None:
        self._running: dict[str, tuple[bytes, asyncio.Future[Any]]] = {}
        self._writer = _Writer()
        self.bytes = 0  # of the fills running now
        self._room: list[asyncio.Future[None]] = []  # reads waiting for fills to end (room)

    def write(self, name: str, data: bytes, fill: Callable[[], bool]) -> asyncio.Future[bool]:
        """Have ``fill`` (which caches ``data`` as ``name``) run by the
        fills' writer thread; its future holds True when it cached the bytes
        (False for a full or failing disk, logged). The bytes are held until
        it ends, registered before the caller yields, so a reader right after
        finds them."""
        if self.bytes + len(data) <= WRITER_BACKLOG or not self._writer.pending:
            future: asyncio.Future[bool] = self._writer.submit(name, fill, len(data) >= LARGE)
        else:  # the writer falls behind (a slow disk): the pool's threads write in parallel
            future = asyncio.ensure_future(_logged(name, pool.run(fill)))
        if (running := self._running.get(name)) is not None:
            self.bytes -= len(running[0])  # replaced: its _done finds another task and leaves the count
        self._running[name] = (data, future)
        self.bytes += len(data)
        future.add_done_callback(functools.partial(self._done, name))
        return future

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

    def _done(self, name: str, task: asyncio.Future[Any]) -> None:
        if (running := self._running.get(name)) is not None and running[1] is task:
            del self._running[name]
            self.bytes -= len(running[0])
            for waiter in self._room:  # each looks again
                if not waiter.done():
                    waiter.set_result(None)

    def held(self, name: str) -> bytes | None:
        """The bytes a running fill of ``name`` is writing, or None."""
        running = self._running.get(name)
        return running[0] if running is not None else None

    def task(self, name: str) -> asyncio.Future[Any] | None:
        running = self._running.get(name)
        return running[1] if running is not None else None

    async def wait(self, names: Iterable[str]) -> None:
        """Until the running fills of any of ``names`` have ended."""
        tasks = [running[1] for name in names if (running := self._running.get(name)) is not None]
        if tasks:
            await asyncio.gather(*(asyncio.shield(task) for task in tasks), return_exceptions=True)

    async def drain(self) -> None:
        """Until no fill runs and every gathered call ran (at shutdown); the
        writer thread then ends."""
        while self._running:
            await asyncio.gather(*[task for _, task in self._running.values()], return_exceptions=True)
        await self._writer.submit("", lambda: True)  # after what was queued before it
        self._writer.stop()


class _Gathered(NamedTuple):
    call: Callable[..., None]
    head: Any
    item: Any


class _Fill(NamedTuple):
    """A fill for the writer thread: the loop to tell, the name, the write,
    its future, and whether it is settled on its own (a large one)."""

    loop: asyncio.AbstractEventLoop
    name: str
    fill: Callable[[], bool]
    future: asyncio.Future[bool]
    alone: bool


class _Writer:
    """A thread of its own that runs fills one after another, those queued
    meanwhile together, and tells the loop once per batch (a large fill at
    once, as soon as it is written: its bytes go then). In the pool, a
    fill behind each answer cost about 185 us of CPU where the write itself
    costs 46: a thread woken for each, a second settling through the loop,
    a task around it (docs/performance.md)."""

    def __init__(self) -> None:
        self.pending = 0  # submitted, not settled yet (the loop's count)
        # What the loop submitted since the first of it: posted to the thread
        # as one list POST_DELAY later, so the misses answered meanwhile
        # wake the writer once (woken for each, it took them one at a time).
        self._outbox: list[_Fill | _Gathered] = []
        self._queue: queue.SimpleQueue[list[_Fill | _Gathered] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, name: str, fill: Callable[[], bool], large: bool = False) -> asyncio.Future[bool]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._put(loop, _Fill(loop, name, fill, future, large))
        if large:
            self._post()
        self.pending += 1
        future.add_done_callback(self._settled)
        return future

    def gather(self, call: Callable[..., None], head: Any, item: Any) -> None:
        self._put(asyncio.get_running_loop(), _Gathered(call, head, item))

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

    def _settled(self, _: asyncio.Future[bool]) -> None:
        self.pending -= 1

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
            done: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[bool], bool, BaseException | None]]] = {}
            gathered: dict[tuple[Callable[..., None], Any], list[Any]] = {}
            stop = False
            for at, item in enumerate(batch):
                if item is None:
                    stop = True
                    continue
                if isinstance(item, _Gathered):
                    gathered.setdefault((item.call, item.head), []).append(item.item)
                    continue
                batch[at] = None  # a large fill's bytes go as soon as it is settled
                try:
                    outcome: tuple[bool, BaseException | None] = (bool(item.fill()), None)
                except OSError as exc:  # a full or failing disk costs the cache, not the read
                    log.warning("could not cache %s: %s", item.name, exc)
                    outcome = (False, None)
                except BaseException as exc:  # noqa: BLE001  handed to whoever awaits the fill
                    outcome = (False, exc)
                if item.alone:
                    _tell(item.loop, [(item.future, *outcome)])
                else:
                    done.setdefault(item.loop, []).append((item.future, *outcome))
                del item
            for (call, head), items in gathered.items():
                try:
                    call(head, *items)
                except Exception as exc:  # noqa: BLE001  what a read learnt is not worth the thread
                    log.warning("could not write %d records behind their reads: %s", len(items), exc)
            for loop, results in done.items():
                _tell(loop, results)
            if stop:
                return


def _tell(loop: asyncio.AbstractEventLoop, results: list[tuple[asyncio.Future[bool], bool, BaseException | None]]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(_settle, results)


def _settle(results: list[tuple[asyncio.Future[bool], bool, BaseException | None]]) -> None:
    for future, cached, exc in results:
        if future.done():
            continue
        if exc is not None:
            future.set_exception(exc)
            future.exception()  # retrieved: a caller that waits sees it; none that does not
        else:
            future.set_result(cached)
