"""Fills written behind the answers (tiering/hot/fills.py): by the writer
thread in batches, their bytes held until written, a failing disk logged as
False, and the pool's threads once the writer falls behind."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from tiering.hot import fills as fills_module
from tiering.hot.fills import LARGE, WRITER_BACKLOG, Fills


def held_fill(release: threading.Event, ran_in: list[str]):  # type: ignore[no-untyped-def]
    """A fill that says which thread ran it and waits for ``release``."""

    def fill() -> bool:
        ran_in.append(threading.current_thread().name)
        release.wait(10)
        return True

    return fill


def test_a_fill_is_written_by_the_writer_thread_its_bytes_held_until_then() -> None:
    async def go() -> None:
        fills = Fills()
        release, ran_in = threading.Event(), []
        fill = held_fill(release, ran_in)
        future = fills.write("piece", b"bytes", fill)
        assert fills.held("piece") == b"bytes" and "piece" in fills
        await asyncio.sleep(0.05)
        assert not future.done()
        release.set()
        assert await future is True
        await asyncio.sleep(0)
        assert fills.held("piece") is None and fills.task("piece") is None
        assert ran_in == ["tierstore-fills"]
        await fills.drain()

    asyncio.run(go())


def test_a_failing_disk_costs_the_cache_not_the_read(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> list[object]:
        fills = Fills()

        def full() -> bool:
            raise OSError(28, "No space left on device")

        def broken() -> bool:
            raise ValueError("a bug")

        results = await asyncio.gather(fills.write("a", b"x", full), fills.write("b", b"y", broken),
                                       return_exceptions=True)
        await fills.drain()
        return results

    with caplog.at_level(logging.WARNING, logger="tierstore.fills"):
        full_result, broken_result = asyncio.run(go())
    assert full_result is False
    assert isinstance(broken_result, ValueError)
    assert "could not cache a" in caplog.text


def test_fills_past_the_writers_backlog_of_bytes_go_to_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer takes fills while their bytes fit its backlog; those past
    it go to the pool's threads. One larger than the whole backlog still
    goes to the writer when it has nothing else queued."""
    monkeypatch.setattr(fills_module, "WRITER_BACKLOG", 4)

    async def go() -> tuple[list[str], list[str]]:
        fills = Fills()
        release, ran_in = threading.Event(), []
        fill = held_fill(release, ran_in)
        futures = [fills.write(f"p{i}", b"xx", fill) for i in range(4)]  # 2 + 2 fit, the two after do not
        await asyncio.sleep(0.1)  # the two past the backlog run at once, beside the writer's first
        running = sorted(ran_in)
        release.set()
        assert await asyncio.gather(*futures) == [True] * 4
        await fills.drain()
        alone: list[str] = []

        def big() -> bool:
            alone.append(threading.current_thread().name)
            return True

        fills = Fills()
        assert await fills.write("big", b"x" * 10, big) is True  # 10 bytes past a backlog of 4
        await fills.drain()
        return running, alone

    running, alone = asyncio.run(go())
    assert running.count("tierstore-fills") == 1  # the writer: one at a time
    assert sum(name.startswith("tierstore-io") for name in running) == 2
    assert alone == ["tierstore-fills"]
    assert WRITER_BACKLOG >= 64 * 64 * 1024  # the default lets a busy node's misses batch


def test_drain_waits_for_every_fill_and_ends_the_writer() -> None:
    async def go() -> None:
        fills = Fills()
        done = []
        futures = [fills.write(f"p{i}", b"x", lambda i=i: done.append(i) or True) for i in range(30)]
        writer = fills._writer._thread
        assert writer is not None and writer.is_alive()
        await fills.drain()
        assert all(f.done() for f in futures) and sorted(done) == list(range(30))
        writer.join(5)
        assert not writer.is_alive()

    asyncio.run(go())


def test_gathered_calls_run_on_the_writer_thread_a_batch_in_one_call(caplog: pytest.LogCaptureFixture) -> None:
    """Items gathered while the writer is busy reach their call together,
    after the batch's fills; drain waits for them; an error is logged."""

    async def go() -> None:
        fills = Fills()
        release, ran_in = threading.Event(), []
        calls: list[tuple[str, str, tuple[int, ...]]] = []

        def record(head: str, *items: int) -> None:
            calls.append((threading.current_thread().name, head, items))

        def broken(head: str, *items: int) -> None:
            raise ValueError("a bug")

        fills.write("first", b"x", held_fill(release, ran_in))  # holds the writer busy
        await asyncio.sleep(0.05)
        fills.write("second", b"y", lambda: ran_in.append("second") is None)
        for item in range(5):
            fills.gather(record, "m", item)
        fills.gather(record, "n", 9)
        fills.gather(broken, "m", 1)
        assert calls == []
        release.set()
        await fills.drain()
        assert sorted(calls) == [("tierstore-fills", "m", (0, 1, 2, 3, 4)), ("tierstore-fills", "n", (9,))]
        assert ran_in[-1] == "second"  # the batch's fill ran before its gathered calls

    with caplog.at_level(logging.WARNING, logger="tierstore.fills"):
        asyncio.run(go())
    assert "could not write 1 records" in caplog.text


def test_what_one_turn_of_the_loop_submits_reaches_the_writer_together() -> None:
    """Fills and gathered items submitted without yielding are posted to the
    idle writer as one list when the loop's turn ends: one wake-up, and the
    gathered items in one call."""

    async def go() -> None:
        fills = Fills()
        calls: list[tuple[int, ...]] = []
        ran: list[str] = []
        futures = []

        def record(head: str, *items: int) -> None:
            calls.append(items)

        for i in range(5):
            futures.append(fills.write(f"p{i}", b"x", lambda i=i: ran.append(f"p{i}") is None))
            fills.gather(record, "m", i)
            time.sleep(0.002)  # the GIL given up (as a hash or a system call does): the writer could run
        assert ran == [] and calls == []  # nothing posted before the turn ends
        assert await asyncio.gather(*futures) == [True] * 5
        await fills.drain()
        assert calls == [(0, 1, 2, 3, 4)] and ran == [f"p{i}" for i in range(5)]

    for _ in range(20):  # the writer idle and waiting each time: never one item at a time
        asyncio.run(go())


def test_room_waits_until_the_fills_behind_hold_at_most_the_bytes_asked() -> None:
    """A cold read asks for room before it fetches a large piece: it goes on
    once the writer has written all but ``most`` bytes of what it holds."""

    async def go() -> None:
        fills = Fills()
        first, second = threading.Event(), threading.Event()
        piece = b"x" * LARGE
        one = fills.write("p0", piece, held_fill(first, []))
        two = fills.write("p1", piece, held_fill(second, []))
        assert fills.bytes == 2 * LARGE
        await fills.room(2 * LARGE)  # at most two behind: at once
        room = asyncio.ensure_future(fills.room(LARGE))
        await asyncio.sleep(0.05)
        assert not room.done()
        first.set()
        await asyncio.wait_for(room, 5)  # one written: room
        assert await one is True and not two.done() and fills.bytes == LARGE
        second.set()
        await fills.drain()
        assert fills.bytes == 0

    asyncio.run(go())


def test_a_large_fill_is_settled_when_written_not_with_its_batch() -> None:
    """A large fill's bytes are let go as soon as it is written, while a
    fill after it in the same batch still runs."""

    async def go() -> None:
        fills = Fills()
        busy, release = threading.Event(), threading.Event()
        running: list[str] = []
        first = fills.write("first", b"x" * LARGE, held_fill(busy, running))  # keeps the writer busy
        while not running:  # the writer took it alone
            await asyncio.sleep(0.001)
        large = fills.write("big", b"x" * LARGE, lambda: True)
        small = fills.write("small", b"y", held_fill(release, []))
        await asyncio.sleep(0.05)  # both posted while the writer is busy: its next batch
        busy.set()
        assert await asyncio.wait_for(first, 5) is True
        assert await asyncio.wait_for(large, 5) is True
        assert fills.held("big") is None and fills.bytes == 1
        assert not small.done()
        release.set()
        await fills.drain()

    asyncio.run(go())


def test_room_goes_on_after_its_wait_when_the_writer_is_stuck(caplog: pytest.LogCaptureFixture) -> None:
    """A writer that hangs (a disk that does not answer) holds a read up
    for ``wait`` seconds, not for ever: it goes on, and says so."""

    async def go() -> None:
        fills = Fills()
        stuck = threading.Event()
        fills.write("p0", b"x" * LARGE, held_fill(stuck, []))
        with caplog.at_level(logging.WARNING, logger="tierstore.fills"):
            assert await asyncio.wait_for(fills.room(0, wait=0.05), 5) is False
        assert "behind" in caplog.text
        stuck.set()
        assert await fills.room(0) is True
        await fills.drain()

    asyncio.run(go())
