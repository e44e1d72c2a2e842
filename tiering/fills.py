"""Hot-tier fills that run behind the answers whose bytes they cache.

A read that fetched bytes from a store answers with them at once; writing
them to the hot tier (a file write and a rename in the thread pool) runs
after, as a task. While it runs its bytes are held here: a read of the
same name takes them instead of fetching again, and a warm, which reports
what is in the hot tier, waits for the write. Used for extents
(``tiering/fetch.py``) and mounted pieces (``tiering/mounts/buckets.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("tierstore.fills")


async def logged(name: str, fill: Awaitable[bool | None]) -> bool:
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
        self._running: dict[str, tuple[bytes, asyncio.Task[Any]]] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._running

    def start(self, name: str, data: bytes, write: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``write`` (which caches ``data`` as ``name``) as a task, the
        bytes held until it ends. Registered before the caller yields, so a
        reader right after finds them."""
        task = asyncio.create_task(write, name=f"fill {name}")
        self._running[name] = (data, task)
        task.add_done_callback(functools.partial(self._done, name))
        return task

    def _done(self, name: str, task: asyncio.Task[Any]) -> None:
        if (running := self._running.get(name)) is not None and running[1] is task:
            del self._running[name]

    def held(self, name: str) -> bytes | None:
        """The bytes a running fill of ``name`` is writing, or None."""
        running = self._running.get(name)
        return running[0] if running is not None else None

    def task(self, name: str) -> asyncio.Task[Any] | None:
        running = self._running.get(name)
        return running[1] if running is not None else None

    async def wait(self, names: Iterable[str]) -> None:
        """Until the running fills of any of ``names`` have ended."""
        tasks = [running[1] for name in names if (running := self._running.get(name)) is not None]
        if tasks:
            await asyncio.gather(*(asyncio.shield(task) for task in tasks), return_exceptions=True)

    async def drain(self) -> None:
        """Until no fill runs (at shutdown)."""
        while self._running:
            await asyncio.gather(*[task for _, task in self._running.values()], return_exceptions=True)
