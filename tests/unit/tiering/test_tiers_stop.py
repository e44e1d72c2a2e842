"""Background loops end on their first cancellation, even one that arrives
in the step their wake-up event is set.

Python 3.11's ``asyncio.wait_for`` drops a cancellation when the awaited
event completes in the same step: a flusher waiting like that went on to
run a round during shutdown, and waited for the layout lock ``stop`` held,
so a clean shutdown hung until killed. The loops wait with
``asyncio.timeout`` instead.

Rounds that change segments (a compaction's segment, a flush of
``flush_all``) are shielded from their caller's cancellation, so they run
in tasks of their own: they end with ``stop`` too, and only the one that
took the layout lock releases it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.unit.tiering.test_epochs import _epochs
from tests.unit.tiering.test_objects import body, new_service
from tiering.maintenance import compact as compact_module
from tiering.maintenance import fsck
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node


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


class _Stuck:
    """Work done under the layout lock that waits for a store that does
    not answer (a partition) until the test answers for it."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.answer = asyncio.Event()
        self.task: asyncio.Task[object] | None = None

    async def __call__(self, *args: object, **kwargs: object) -> None:
        self.task = asyncio.current_task()
        self.entered.set()
        await self.answer.wait()


def _one_segment_to_compact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compact_module, "candidates", lambda segments, threshold: [SimpleNamespace(name="s", size=1)])


async def _stop_past_the_grace(svc: Node, stuck: _Stuck) -> None:
    """``stop`` while ``stuck`` holds the layout lock (no grace: its wait
    for the lock times out at once); then the store answers. The round
    must have ended with ``stop``, released the lock itself, and not with
    ``RuntimeError('Lock is not acquired.')``."""
    await asyncio.wait_for(stuck.entered.wait(), 20)
    task = stuck.task
    assert task is not None
    await svc.tiers.stop(grace=0)
    ended_with_stop = task.done()
    stuck.answer.set()
    await asyncio.wait([task], timeout=20)
    assert task.done()
    assert task.cancelled() or task.exception() is None, repr(task.exception())
    assert not svc.tiers._layout.locked(), "the lock is left held"
    assert ended_with_stop, "the round ran on past stop"
    await svc.close()


def test_a_compaction_round_past_the_grace_ends_with_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shutdown while the periodic pass rewrites a segment on a store that
    does not answer. ``stop`` gives up waiting for the lock and cancels the
    compactor, whose round runs shielded: it used to run on, ``stop``
    released the lock it held, and its own release later raised
    ``RuntimeError('Lock is not acquired.')``."""
    root = tmp_path / "data"

    async def go() -> None:
        svc = new_service(root, compact_interval=0.01)
        stuck = _Stuck()
        monkeypatch.setattr(svc.tiers.compactor, "_compact_locked", stuck)
        _one_segment_to_compact(monkeypatch)
        await svc.start()
        await _stop_past_the_grace(svc, stuck)

    asyncio.run(go())
    assert fsck.check(root) == []


def test_a_flush_round_past_the_grace_ends_with_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for a round of ``flush_all`` whose caller was cancelled (a
    job's cancel, or the timeout of the drain before a lease is let go)."""
    root = tmp_path / "data"

    async def go() -> None:
        svc = new_service(root)
        stuck = _Stuck()
        monkeypatch.setattr(svc.tiers.flusher, "_flush_bucket", stuck)
        await svc.start()
        await svc.objects.create_bucket("bkt")
        await svc.objects.put("bkt", "k", body(b"data"), NewObject(), Integrity(expected_size=4))
        caller = asyncio.create_task(svc.tiers.flush())
        await asyncio.wait_for(stuck.entered.wait(), 20)
        caller.cancel()
        await _stop_past_the_grace(svc, stuck)

    asyncio.run(go())


def test_a_compaction_round_waiting_for_the_lock_at_stop_never_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush round holds the layout lock (the test holds it in its place)
    and ``stop`` waits for it; an operator's pass then queues a round behind
    ``stop``, and is cancelled (as the jobs are before the tiers stop).
    ``stop`` takes the lock, and the round, shielded from that
    cancellation, must not compact once ``stop`` lets the lock go: the
    index and the store are being closed."""
    root = tmp_path / "data"

    async def go() -> None:
        svc = new_service(root)  # no periodic pass within the test
        compactor = svc.tiers.compactor
        ran: list[str] = []

        async def compact_locked(name: str, report: object) -> None:
            ran.append(name)

        queued = asyncio.Event()
        compact_one = compactor._compact_one

        async def queue(name: str, report: compact_module.CompactionReport) -> None:
            queued.set()  # the round asks for the lock in this same step
            await compact_one(name, report)

        monkeypatch.setattr(compactor, "_compact_locked", compact_locked)
        monkeypatch.setattr(compactor, "_compact_one", queue)
        _one_segment_to_compact(monkeypatch)
        await svc.start()
        layout = svc.tiers._layout
        await layout.acquire()
        stopping = asyncio.create_task(svc.tiers.stop())
        await asyncio.sleep(0)  # stop waits for the lock
        operator = asyncio.create_task(svc.tiers.compact())
        await asyncio.wait_for(queued.wait(), 20)
        operator.cancel()
        layout.release()
        await asyncio.wait_for(stopping, 20)
        for _ in range(10):  # a round let through would start within a step or two
            await asyncio.sleep(0)
        assert ran == []
        assert not layout.locked()
        await svc.close()

    asyncio.run(go())
    assert fsck.check(root) == []


def test_stop_releases_the_layout_lock_only_if_it_took_it(tmp_path: Path) -> None:
    """A holder that ``stop`` neither waits for past its grace nor cancels
    (the test, in the place of any caller that is not a round) keeps the
    lock: ``stop`` must not release it, or the holder's own release raises."""
    root = tmp_path / "data"

    async def go() -> None:
        svc = new_service(root)
        await svc.start()
        layout = svc.tiers._layout
        await layout.acquire()
        await svc.tiers.stop(grace=0)
        assert layout.locked(), "stop released a lock it did not take"
        layout.release()
        await svc.close()

    asyncio.run(go())
