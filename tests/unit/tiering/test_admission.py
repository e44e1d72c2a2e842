"""The byte semaphore requests reserve their buffers from: within its
limit, first come first served, refusing new work while anyone waits, and
never losing bytes to a timeout or a cancellation."""

from __future__ import annotations

import asyncio
import mmap
import threading

import pytest

from tiering.admission import Admission
from tiering.errors import SlowDown

MiB = 1024 * 1024


def test_new_work_gets_bytes_while_they_fit_and_is_refused_after() -> None:
    admission = Admission(10 * MiB)
    assert admission.take_now(4 * MiB) and admission.take_now(4 * MiB)
    assert not admission.take_now(4 * MiB)
    assert (admission.held, admission.refused) == (8 * MiB, 1)
    admission.give(4 * MiB)
    assert admission.take_now(4 * MiB)
    assert admission.peak == 8 * MiB


def test_one_reservation_larger_than_the_limit_runs_alone() -> None:
    admission = Admission(10 * MiB)
    assert admission.take_now(64 * MiB)
    assert not admission.take_now(1)
    admission.give(64 * MiB)
    assert admission.held == 0 and admission.take_now(1)


def test_without_a_limit_everything_is_granted_and_counted() -> None:
    admission = Admission(0)
    assert all(admission.take_now(64 * MiB) for _ in range(100))
    assert admission.held == 100 * 64 * MiB and admission.refused == 0


def test_waiters_are_served_in_turn_and_new_work_cannot_jump_the_line() -> None:
    async def main() -> list[str]:
        admission = Admission(10 * MiB)
        assert admission.take_now(8 * MiB)
        order: list[str] = []

        async def waiter(name: str, size: int) -> None:
            assert await admission.take(size, wait=60)
            order.append(name)

        tasks = [asyncio.create_task(waiter("big", 6 * MiB)), asyncio.create_task(waiter("small", 1 * MiB))]
        await asyncio.sleep(0)
        assert admission.waiting == 2
        # 1 MiB would fit, but two wait before it: refused.
        assert not admission.take_now(1 * MiB)
        assert await admission.take(0, wait=60)  # nothing to reserve: no turn to wait
        admission.give(8 * MiB)
        await asyncio.gather(*tasks)
        assert admission.held == 7 * MiB and admission.waiting == 0
        return order

    assert asyncio.run(main()) == ["big", "small"]


def test_a_wait_that_runs_out_reserves_nothing_and_lets_the_next_in() -> None:
    async def main() -> None:
        admission = Admission(10 * MiB)
        assert admission.take_now(8 * MiB)
        assert not await admission.take(4 * MiB, wait=0.01)
        assert admission.held == 8 * MiB and admission.waiting == 0 and admission.refused == 1
        assert admission.take_now(2 * MiB)  # the line is empty again

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_no_bytes_behind() -> None:
    async def main() -> None:
        admission = Admission(10 * MiB)
        assert admission.take_now(8 * MiB)
        task = asyncio.create_task(admission.take(4 * MiB, wait=60))
        await asyncio.sleep(0)
        admission.give(8 * MiB)  # grants the waiter ...
        task.cancel()  # ... which is cancelled before it resumes
        with pytest.raises(asyncio.CancelledError):
            await task
        assert admission.held == 0 and admission.waiting == 0

    asyncio.run(main())


def test_hold_gives_back_and_refuses_with_slowdown() -> None:
    async def main() -> None:
        admission = Admission(10 * MiB)
        async with admission.hold(6 * MiB):
            assert admission.held == 6 * MiB
            with pytest.raises(SlowDown):
                async with admission.hold(6 * MiB, wait=0.01):
                    pass
        assert admission.held == 0

        with pytest.raises(RuntimeError):
            async with admission.hold(6 * MiB):
                raise RuntimeError("the work failed")
        assert admission.held == 0

    asyncio.run(main())


def test_work_that_makes_room_takes_its_bytes_after_its_wait() -> None:
    async def main() -> None:
        admission = Admission(10 * MiB)
        assert admission.take_now(8 * MiB)
        await admission.force(64 * MiB, wait=0.01)
        assert admission.held == 72 * MiB and admission.forced == 1 and admission.refused == 0
        assert not admission.take_now(1)

    asyncio.run(main())


def test_a_larger_limit_lets_waiters_in() -> None:
    async def main() -> None:
        admission = Admission(10 * MiB)
        assert admission.take_now(8 * MiB)
        task = asyncio.create_task(admission.take(8 * MiB, wait=60))
        await asyncio.sleep(0)
        admission.configure(20 * MiB)
        assert await task and admission.held == 16 * MiB

    asyncio.run(main())


def test_over_the_limit_alone_leaves_out_what_the_asker_holds() -> None:
    async def main() -> None:
        admission = Admission(16 * MiB)
        assert admission.take_now(4 * MiB)  # a request's body, reserved at the edge
        # Its stream to the store needs 32 MiB more: granted alone, its own 4 MiB aside.
        assert await admission.take(32 * MiB, wait=0.01, mine=4 * MiB)
        admission.give(32 * MiB)
        assert admission.take_now(4 * MiB)  # another request's body
        assert not await admission.take(32 * MiB, wait=0.01, mine=4 * MiB)

    asyncio.run(main())


def test_a_lent_buffer_is_forced_after_its_wait_and_given_back_when_freed_on_any_thread() -> None:
    async def main() -> None:
        admission = Admission(16 * MiB)
        buffer = mmap.mmap(-1, 8 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        await admission.lend(buffer, 8 * MiB)
        assert admission.held == 8 * MiB
        await asyncio.sleep(0)
        assert admission.held == 8 * MiB  # held as long as the buffer lives
        holder = [buffer]
        del buffer
        thread = threading.Thread(target=holder.clear)  # the last holder: a cache fill's writer, say
        thread.start()
        thread.join()
        await asyncio.sleep(0)
        assert admission.held == 0
        assert admission.take_now(8 * MiB) and admission.take_now(8 * MiB)
        # A read under way is not cut short: after its wait it takes its bytes over the limit.
        late = mmap.mmap(-1, 4096)
        await admission.lend(late, 4096, wait=0.01)
        assert admission.held == 16 * MiB + 4096 and admission.forced == 1 and admission.refused == 0
        assert not admission.take_now(4096)  # new work is refused meanwhile
        del late
        await asyncio.sleep(0)
        assert admission.held == 16 * MiB

    asyncio.run(main())


def test_a_read_under_way_takes_its_bytes_after_its_wait_and_gives_them_back() -> None:
    async def main() -> None:
        admission = Admission(8 * MiB)
        assert admission.take_now(8 * MiB)
        async with admission.hold(2 * MiB, wait=0.01, force=True):
            assert admission.held == 10 * MiB and admission.forced == 1
        assert admission.held == 8 * MiB and admission.refused == 0
        admission.give(8 * MiB)
        async with admission.hold(2 * MiB, force=True):  # room: in turn, not forced
            assert admission.held == 2 * MiB and admission.forced == 1
        assert admission.held == 0

    asyncio.run(main())
