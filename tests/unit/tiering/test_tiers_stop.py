"""Stopping the tiers' background work ends even when a task does not take
its first cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.unit.tiering.test_objects import new_service
from tiering import fsck


def test_stop_ends_a_flusher_that_swallowed_its_cancellation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 3.11's ``asyncio.wait_for`` returns the inner result, dropping
    a cancellation, when the inner future completed in the same step; the
    flusher waits like that for its next round. Its next round then waits
    for the layout lock, which ``stop`` holds while it waits for the task:
    a clean shutdown hung there until killed."""
    root = tmp_path / "data"
    swallowed = asyncio.Event()

    async def go() -> None:
        svc = new_service(root)
        flusher = svc.tiers.flusher

        async def run() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed.set()  # what wait_for does in that race
            await flusher.flush_round()

        monkeypatch.setattr(flusher, "run", run)
        await svc.start()
        closing = asyncio.create_task(svc.close())
        done, _ = await asyncio.wait({closing}, timeout=20)
        if not done:
            closing.cancel()  # reaches the stuck flusher, so the close can end
            await asyncio.wait({closing})
            pytest.fail("the shutdown hung on a flusher waiting for the layout lock")
        closing.result()
        assert swallowed.is_set()

    asyncio.run(go())
    assert fsck.check(root) == []
