"""Rounds that change segments, shielded from their caller's cancellation.

A compaction of one segment, or a flush round of ``flush_all``, is not cut
short when its caller is cancelled (an operator cancels a job, the drain
before a lease is let go times out): the caller stops waiting, between
rounds, and the round finishes. ``asyncio.shield`` runs such a round in a
task of its own, which outlives the cancelled caller; each round takes the
layout lock itself and releases it itself.

Those tasks are kept here, so that ``Tiers.stop`` can end them too. Left
alone, one that was waiting for the lock ran once ``stop`` let it go, with
the index and the capacity store closing; one past ``stop``'s grace went on
holding the lock, ``stop`` released it on its behalf, and the round's own
release then raised ``RuntimeError('Lock is not acquired.')`` (seen at a
shutdown under a network partition).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Rounds:
    """The shielded rounds of a node's flusher and compactor still running."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    async def shielded(self, work: Coroutine[Any, Any, T]) -> T:
        """``work``'s result; if the caller is cancelled, ``work`` goes on
        (until it ends or ``cancel`` ends it)."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def cancel(self) -> None:
        """Cancel the rounds still running or waiting for the lock, and wait
        until they have ended (each releases the lock if it holds it). Their
        errors are theirs: a caller that was cancelled no longer wants them."""
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
