"""Single flight: concurrent callers asking for the same key share one run
of the work (one capacity-store GET for an extent or a mounted piece, however
many readers wait for it)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._inflight: dict[Hashable, _Flight[T]] = {}

    def __contains__(self, key: Hashable) -> bool:
        """True while someone runs the work for ``key`` (a batch fetch
        leaves such keys to that caller)."""
        return key in self._inflight

    async def run(self, key: Hashable, work: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """``work()``'s result, and True for the caller that ran it (the
        others got the same result, or the same exception)."""
        flight = self._inflight.get(key)
        if flight is not None:
            return await asyncio.shield(flight.shared()), False
        flight = self._inflight[key] = _Flight()
        try:
            value = await work()
        except BaseException as exc:
            flight.fail(exc)
            raise
        finally:
            del self._inflight[key]
        flight.succeed(value)
        return value, True

    def spawn(self, key: Hashable, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``work`` for ``key`` in a task of its own, registered now
        (before the caller yields): callers of :meth:`run` from here on
        share its outcome (a cancelled task cancels theirs). The caller must
        not already run work for ``key``."""
        assert key not in self._inflight, key
        flight: _Flight[T] = _Flight()
        self._inflight[key] = flight
        task = asyncio.ensure_future(work)
        task.add_done_callback(functools.partial(self._settle, key, flight))
        return task

    def _settle(self, key: Hashable, flight: _Flight[T], task: asyncio.Task[T]) -> None:
        if self._inflight.get(key) is flight:
            del self._inflight[key]
        if task.cancelled():
            flight.cancel()
        elif (exc := task.exception()) is not None:  # retrieved here, joined or not
            flight.fail(exc)
        else:
            flight.succeed(task.result())


class _Flight(Generic[T]):
    """One run of the work for a key. Its future, which the callers that
    join it wait on, is made when the first of them joins: most runs (a
    cold epoch's misses, each of its own object) have none, and a future
    made, called back and settled for nobody cost a miss a few calls."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: asyncio.Future[T] | None = None

    def shared(self) -> asyncio.Future[T]:
        if self.future is None:
            self.future = asyncio.get_running_loop().create_future()
            self.future.add_done_callback(_consume)
        return self.future

    # The run's outcome, for those who joined (nothing when nobody did).

    def succeed(self, value: T) -> None:
        if self.future is not None:
            self.future.set_result(value)

    def fail(self, exc: BaseException) -> None:
        if self.future is not None:
            self.future.set_exception(exc)

    def cancel(self) -> None:
        if self.future is not None:
            self.future.cancel()


def _consume(future: asyncio.Future[T]) -> None:
    # A failure nobody else waited for must not log "exception never retrieved".
    if not future.cancelled():
        future.exception()
