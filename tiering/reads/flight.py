"""Single flight: concurrent callers asking for the same key share one run
of the work (one capacity-store GET for an extent or a mounted piece, however
many readers wait for it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._inflight: dict[Hashable, asyncio.Future[T]] = {}

    def __contains__(self, key: Hashable) -> bool:
        """True while someone runs the work for ``key`` (a batch fetch
        leaves such keys to that caller)."""
        return key in self._inflight

    async def run(self, key: Hashable, work: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """``work()``'s result, and True for the caller that ran it (the
        others got the same result, or the same exception)."""
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending), False
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume)
        self._inflight[key] = future
        try:
            value = await work()
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            del self._inflight[key]
        future.set_result(value)
        return value, True


def _consume(future: asyncio.Future[T]) -> None:
    # A failure nobody else waited for must not log "exception never retrieved".
    if not future.cancelled():
        future.exception()
