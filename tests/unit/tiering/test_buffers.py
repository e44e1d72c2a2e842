"""Piece buffers used again: never while anything refers to them (a slice,
a list, another thread's hold), always once nothing does; their lenders
told then, and what is kept bounded in number and in time."""

from __future__ import annotations

import asyncio
import mmap
import threading

from tiering.admission import Admission
from tiering.reads import buffers
from tiering.reads.buffers import Buffers

MiB = 1024 * 1024


def test_a_buffer_is_handed_out_again_only_once_nothing_refers_to_it() -> None:
    async def main() -> None:
        pool = Buffers()
        first = pool.take(MiB)
        first[:5] = b"first"
        view = memoryview(first)[100:200]  # a reader's slice, the buffer itself dropped
        del first
        second = pool.take(MiB)
        assert pool.made == 2 and pool.reused == 0
        assert view.obj is not second  # the sliced one stays with its reader
        del second
        third = pool.take(MiB)
        assert pool.reused == 1  # the second, which nothing held
        view.release()
        del view
        fourth = pool.take(MiB)
        assert pool.reused == 2 and pool.made == 2
        assert fourth[:5] == b"first"  # the first buffer again, as it was left
        assert third is not fourth
        assert pool.take(2 * MiB) is not None and pool.made == 3  # another size: a new one

    asyncio.run(main())


def test_lenders_hear_once_the_last_holder_lets_go_on_any_thread() -> None:
    async def main() -> None:
        pool = Buffers()
        buffer = pool.take(MiB)
        told: list[str] = []
        assert pool.when_free(buffer, lambda: told.append("free"))
        assert not pool.when_free(mmap.mmap(-1, 4096), lambda: None)  # not one of the pool's
        holder = [memoryview(buffer)[:10]]
        del buffer
        await asyncio.sleep(3 * buffers.LOOK_EVERY)
        assert told == [] and pool.lent == 1  # a slice still held
        thread = threading.Thread(target=holder.clear)  # the last holder: the fills' writer, say
        thread.start()
        thread.join()
        await asyncio.sleep(3 * buffers.LOOK_EVERY)
        assert told == ["free"] and pool.lent == 0 and pool.free == 1
        kept = pool.take(MiB)
        pool.look()
        del kept
        pool.look()
        assert pool.when_free(pool._free[MiB][0], lambda: told.append("at once"))  # taken back already
        assert told == ["free", "at once"]

    asyncio.run(main())


def test_at_most_keep_free_buffers_are_kept_and_none_after_a_quiet_while() -> None:
    async def main() -> None:
        pool = Buffers(keep=2, quiet=0.05)
        taken = [pool.take(MiB) for _ in range(5)]
        taken.clear()
        pool.look()
        assert pool.free == 2 and pool.lent == 0
        await asyncio.sleep(0.15)
        assert pool.free == 0

    asyncio.run(main())


def test_admission_lends_a_pieces_bytes_while_its_buffer_is_used_not_while_it_is_kept() -> None:
    async def main() -> None:
        admission = Admission(32 * MiB)
        buffer = buffers.BUFFERS.take(8 * MiB)
        await admission.lend(buffer, 8 * MiB, when_free=buffers.BUFFERS.when_free)
        assert admission.held == 8 * MiB
        sent = memoryview(buffer)[: MiB]  # a slice a transport still holds
        del buffer
        await asyncio.sleep(3 * buffers.LOOK_EVERY)
        assert admission.held == 8 * MiB
        del sent
        await asyncio.sleep(3 * buffers.LOOK_EVERY)
        assert admission.held == 0  # given back, though the pool keeps the buffer for the next piece

    asyncio.run(main())
