"""Arrivals' buffers taken again (tiering/reads/buffers.py): only once
nothing refers to them, within their bound, and let go when idle."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tiering.memo import CACHES, Caches
from tiering.reads import buffers as buffers_module
from tiering.reads.arrival import Arrival
from tiering.reads.buffers import BUFFERS, Buffers

MiB = 1024 * 1024


def _pool(bound: int = 32 * MiB) -> Buffers:
    registry = Caches()
    registry.configure({"buffers": bound})
    return Buffers(registry)


def test_a_buffer_nobody_refers_to_is_taken_again_for_its_size() -> None:
    pool = _pool()
    first = pool.take(8 * MiB)
    first_id = id(first)
    pool.give(first)
    del first
    assert pool.bytes == 8 * MiB and len(pool) == 1
    assert len(pool.take(4 * MiB)) == 4 * MiB  # another size: fresh memory
    again = pool.take(8 * MiB)
    assert id(again) == first_id and pool.reused == 1 and pool.bytes == 0


def test_a_buffer_still_referred_to_waits() -> None:
    pool = _pool()
    buf = pool.take(MiB)
    slice_of_it = memoryview(buf)[10:20]  # a reader's block, or a transport's write buffer
    pool.give(buf)
    buf_id = id(buf)
    del buf
    assert id(pool.take(MiB)) != buf_id and pool.reused == 0
    slice_of_it.release()
    del slice_of_it
    assert id(pool.take(MiB)) == buf_id and pool.reused == 1


def test_the_bound_and_the_idle_time_let_buffers_go(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(buffers_module.time, "monotonic", lambda: clock[0])
    pool = _pool(bound=3 * MiB)
    held = [pool.take(MiB) for _ in range(5)]  # five arrivals at once: fresh memory each
    for buf in held:
        pool.give(buf)
    assert pool.bytes == 3 * MiB and len(pool) == 3  # the oldest went past the bound
    pool.give(pool.take(4 * MiB))  # larger than the bound: not kept
    assert pool.bytes == 3 * MiB
    del held
    clock[0] += buffers_module.IDLE + 1
    pool.expire()
    assert pool.bytes == 0 and len(pool) == 0
    pool.give(pool.take(MiB))
    pool.fit(0)  # squeezed by the memory budget
    assert pool.bytes == 0


async def _arrive(size: int) -> int:
    arrival = Arrival(size, None)
    arrival.buffer()[:] = b"x" * size
    arrival.landed(size)
    assert arrival.checked and bytes(arrival.data) == b"x" * size
    return id(arrival.data)


def test_an_arrival_gives_its_buffer_back_when_it_is_gone() -> None:
    CACHES.configure({"buffers": 32 * MiB})
    BUFFERS.clear()
    try:
        first = asyncio.run(_arrive(2 * MiB))
        gc.collect()
        assert len(BUFFERS) == 1
        reused = BUFFERS.reused
        assert asyncio.run(_arrive(2 * MiB)) == first  # the second arrival wrote into the first's memory
        assert BUFFERS.reused == reused + 1
    finally:
        BUFFERS.clear()
