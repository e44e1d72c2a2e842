"""Parts of uploads to a mount wait in memory under one byte budget."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest

from tiering.admission import Admission
from tiering.errors import EntityTooLarge
from tiering.model.inputs import Integrity
from tiering.mounts.uploads import MountUploads


def test_a_part_waits_for_room_and_gets_it_when_another_leaves() -> None:
    async def main() -> None:
        memory = Admission(100)
        order: list[str] = []
        first_in = asyncio.Event()
        release_first = asyncio.Event()

        async def first() -> None:
            async with memory.hold(70, wait=math.inf):
                order.append("first in")
                first_in.set()
                await release_first.wait()
            order.append("first out")

        async def second() -> None:
            await first_in.wait()
            async with memory.hold(50, wait=math.inf):
                order.append("second in")
                assert memory.held == 50

        tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
        await first_in.wait()
        await asyncio.sleep(0.01)
        assert order == ["first in"] and memory.held == 70, "70 + 50 > 100: the second part waits"
        release_first.set()
        await asyncio.gather(*tasks)
        assert order == ["first in", "first out", "second in"] and memory.held == 0

    asyncio.run(main())


def test_a_cancelled_waiter_takes_no_room() -> None:
    async def main() -> None:
        memory = Admission(10)
        async with memory.hold(10, wait=math.inf):
            waiter = asyncio.create_task(memory.hold(5, wait=math.inf).__aenter__())
            await asyncio.sleep(0.01)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
        assert memory.held == 0

    asyncio.run(main())


class _WritableMounts:
    def writable(self, name: str) -> None:
        pass


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_a_part_larger_than_the_budget_is_refused_before_its_body_is_read() -> None:
    async def main() -> None:
        uploads = MountUploads(_WritableMounts(), memory=1000)  # type: ignore[arg-type]
        read = False

        async def body() -> AsyncIterator[bytes]:
            nonlocal read
            read = True
            yield b"x" * 1001

        with pytest.raises(EntityTooLarge):
            await uploads.upload_part("m", "k", "id", 1, body(), Integrity(expected_size=1001))
        assert not read
        # A body longer than it said is stopped at the budget, not buffered whole.
        with pytest.raises(EntityTooLarge):
            await uploads.upload_part("m", "k", "id", 1, _body(b"x" * 1001), Integrity())

    asyncio.run(main())
