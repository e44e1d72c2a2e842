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

# Fills the writer thread may have queued before new ones go to the pool:
# enough for the misses of a busy node to be written in batches, few enough
# that a slow disk cannot hold more than about this many bodies in memory.
WRITER_BACKLOG = 64
# What the loop submits is posted to the writer thread this long after the
# first of it, or once POST_ITEMS wait: the misses of a few milliseconds
# wake the writer once. At 4 ms a cold epoch's writer woke for two misses
# or so, and each wake (the thread's, its GIL handoffs, the loop's) cost
# it more system time than the two writes; at 10 ms it takes about five.
POST_DELAY = 0.01
POST_ITEMS = 16


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

    def write(self, name: str, data: bytes, fill: Callable[[], bool]) -> asyncio.Future[bool]:
        """Have ``fill`` (which caches ``data`` as ``name``) run by the
        fills' writer thread; its future holds True when it cached the bytes
        (False for a full or failing disk, logged). The bytes are held until
        it ends, registered before the caller yields, so a reader right after
        finds them."""
        if self._writer.pending < WRITER_BACKLOG:
            future: asyncio.Future[bool] = self._writer.submit(name, fill)
        else:  # the writer falls behind (a slow disk): the pool's threads write in parallel
            future = asyncio.ensure_future(_logged(name, pool.run(fill)))
        self._running[name] = (data, future)
        future.add_done_callback(functools.partial(self._done, name))
        return future

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


# A fill for the writer thread: the loop to tell, the name, the write, its future.
_Fill = tuple[asyncio.AbstractEventLoop, str, Callable[[], bool], asyncio.Future[bool]]


class _Writer:
    """A thread of its own that runs fills one after another, those queued
    meanwhile together, and tells the loop once per batch. In the pool, a
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

    def submit(self, name: str, fill: Callable[[], bool]) -> asyncio.Future[bool]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._put(loop, (loop, name, fill, future))
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

    def _run(self) -> None:
        while True:
            posted = self._queue.get()
            batch: list[_Fill | _Gathered | None] = [*posted] if posted is not None else [None]
            with contextlib.suppress(queue.Empty):
                while len(batch) < 64:
                    more = self._queue.get_nowait()
                    batch.extend(more if more is not None else [None])
            done: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[bool], bool, BaseException | None]]] = {}
            gathered: dict[tuple[Callable[..., None], Any], list[Any]] = {}
            stop = False
            for item in batch:
                if item is None:
                    stop = True
                    continue
                if isinstance(item, _Gathered):
                    gathered.setdefault((item.call, item.head), []).append(item.item)
                    continue
                loop, name, fill, future = item
                try:
                    outcome: tuple[bool, BaseException | None] = (bool(fill()), None)
                except OSError as exc:  # a full or failing disk costs the cache, not the read
                    log.warning("could not cache %s: %s", name, exc)
                    outcome = (False, None)
                except BaseException as exc:  # noqa: BLE001  handed to whoever awaits the fill
                    outcome = (False, exc)
                done.setdefault(loop, []).append((future, *outcome))
            for (call, head), items in gathered.items():
                try:
                    call(head, *items)
                except Exception as exc:  # noqa: BLE001  what a read learnt is not worth the thread
                    log.warning("could not write %d records behind their reads: %s", len(items), exc)
            for loop, results in done.items():
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(_settle, results)
            if stop:
                return


def _settle(results: list[tuple[asyncio.Future[bool], bool, BaseException | None]]) -> None:
    for future, cached, exc in results:
        if future.done():
            continue
        if exc is not None:
            future.set_exception(exc)
            future.exception()  # retrieved: a caller that waits sees it; none that does not
        else:
            future.set_result(cached)
