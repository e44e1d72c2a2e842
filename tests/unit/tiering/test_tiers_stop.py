"""Background loops end on their first cancellation, even one that arrives
in the step their wake-up event is set.

Python 3.11's ``asyncio.wait_for`` drops a cancellation when the awaited
event completes in the same step: a flusher waiting like that went on to
run a round during shutdown, and waited for the layout lock ``stop`` held,
so a clean shutdown hung until killed. The loops wait with
``asyncio.timeout`` instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.unit.tiering.test_epochs import _epochs
from tests.unit.tiering.test_objects import new_service
from tiering.maintenance import fsck


async def _cancel_as_woken(task: asyncio.Task[None], wake: asyncio.Event) -> None:
    """Set ``wake`` and cancel ``task`` in one step; the task must end cancelled."""
    await asyncio.sleep(0.05)  # the loop is waiting for its event
    wake.set()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert done, "the loop did not end on its cancellation"
    assert task.cancelled()


def _counting(calls: list[int]) -> Callable[..., Awaitable[bool]]:
    async def round_(**_: object) -> bool:
        calls.append(1)
        return False

    return round_


def test_flusher_woken_and_cancelled_in_one_step_runs_no_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"
    rounds: list[int] = []

    async def go() -> None:
        svc = new_service(root)
        flusher = svc.tiers.flusher
        monkeypatch.setattr(flusher, "flush_round", _counting(rounds))
        await svc.start()
        task = next(t for t in svc.tiers._tasks if t.get_name() == "tierstore flusher")
        await _cancel_as_woken(task, flusher._wake)
        await asyncio.wait_for(svc.close(), 20)

    asyncio.run(go())
    assert rounds == []
    assert fsck.check(root) == []


def test_prefetcher_woken_and_cancelled_in_one_step_runs_no_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rounds: list[int] = []

    async def go() -> None:
        epochs = _epochs()
        monkeypatch.setattr(epochs, "_round", _counting(rounds))
        task = asyncio.create_task(epochs._run())
        await _cancel_as_woken(task, epochs._wake)

    asyncio.run(go())
    assert rounds == []
