"""Fills written behind the answers (tiering/hot/fills.py): by the writer
thread in batches (one ``fill_many`` a batch), their bytes held until
written, a failing disk logged as False, and the pool's threads once the
writer falls behind."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence

import pytest

from tiering.hot import fills as fills_module
from tiering.hot.fills import LARGE, WRITER_BACKLOG, Fills


class Target:
    """A hot tier's stand-in: the fill of a name does what ``does`` holds
    for it (True by default); ``ran_in`` says which thread ran each,
    ``batches`` what each ``fill_many`` was given."""

    def __init__(self) -> None:
        self.does: dict[str, Callable[[], bool]] = {}
        self.ran_in: list[str] = []
        self.batches: list[list[str]] = []

    def fill(self, name: str, data: bytes, pin: bool = False) -> bool:
        self.ran_in.append(threading.current_thread().name)
        return self.does.get(name, lambda: True)()

    def fill_many(self, fills: Sequence[tuple[str, bytes, bool]]) -> list[bool | BaseException]:
        self.batches.append([name for name, _, _ in fills])
        outcomes: list[bool | BaseException] = []
        for name, data, pin in fills:
            try:
                outcomes.append(self.fill(name, data, pin))
            except Exception as exc:  # noqa: BLE001  each its own, as HotTier.fill_many
                outcomes.append(exc)
        return outcomes


def held(release: threading.Event, ran: list[str] | None = None) -> Callable[[], bool]:
    """A fill that waits for ``release`` (noting that it started in ``ran``)."""

    def fill() -> bool:
        if ran is not None:
            ran.append("started")
        release.wait(10)
        return True

    return fill


def written(fills: Fills, name: str) -> asyncio.Future[bool]:
    future = fills.task(name)
    assert future is not None
    return future


def test_a_fill_is_written_by_the_writer_thread_its_bytes_held_until_then() -> None:
    async def go() -> None:
        target = Target()
        fills = Fills(target)
        release = threading.Event()
        target.does["piece"] = held(release)
        fills.write("piece", b"bytes")
        assert fills.held("piece") == b"bytes" and "piece" in fills
        future = written(fills, "piece")
        await asyncio.sleep(0.05)
        assert not future.done()
        release.set()
        assert await future is True
        assert fills.held("piece") is None and fills.task("piece") is None and fills.bytes == 0
        assert target.ran_in == ["tierstore-fills"]
        await fills.drain()

    asyncio.run(go())


def test_a_failing_disk_costs_the_cache_not_the_read(caplog: pytest.LogCaptureFixture) -> None:
    """A full disk: False and a warning. Any other error goes to whoever
    waits for the fill, or is logged when nobody does."""

    async def go() -> list[object]:
        target = Target()
        fills = Fills(target)

        def full() -> bool:
            raise OSError(28, "No space left on device")

        def broken() -> bool:
            raise ValueError("a bug")

        target.does.update(a=full, b=broken, c=broken)
        for name in "abc":
            fills.write(name, b"x")
        results = await asyncio.gather(written(fills, "a"), written(fills, "b"), return_exceptions=True)
        await fills.drain()
        return results

    with caplog.at_level(logging.WARNING, logger="tierstore.fills"):
        full_result, broken_result = asyncio.run(go())
    assert full_result is False
    assert isinstance(broken_result, ValueError)
    assert "could not cache a" in caplog.text
    assert "cache fill of c failed" in caplog.text and "could not cache b" not in caplog.text


def test_fills_past_the_writers_backlog_of_bytes_go_to_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer takes fills while their bytes fit its backlog; those past
    it go to the pool's threads. One larger than the whole backlog still
    goes to the writer when it has nothing else queued."""
    monkeypatch.setattr(fills_module, "WRITER_BACKLOG", 4)

    async def go() -> tuple[list[str], list[str]]:
        target = Target()
        fills = Fills(target)
        release = threading.Event()
        for i in range(4):  # 2 + 2 fit, the two after do not
            target.does[f"p{i}"] = held(release)
            fills.write(f"p{i}", b"xx")
        futures = [written(fills, f"p{i}") for i in range(4)]
        await asyncio.sleep(0.1)  # the two past the backlog run at once, beside the writer's first
        running = sorted(target.ran_in)
        release.set()
        assert await asyncio.gather(*futures) == [True] * 4
        await fills.drain()
        alone = Target()
        fills = Fills(alone)
        fills.write("big", b"x" * 10)  # 10 bytes past a backlog of 4
        assert await written(fills, "big") is True
        await fills.drain()
        return running, alone.ran_in

    running, alone = asyncio.run(go())
    assert running.count("tierstore-fills") == 1  # the writer: one at a time
    assert sum(name.startswith("tierstore-io") for name in running) == 2
    assert alone == ["tierstore-fills"]
    assert WRITER_BACKLOG >= 64 * 64 * 1024  # the default lets a busy node's misses batch


def test_drain_waits_for_every_fill_and_ends_the_writer() -> None:
    async def go() -> None:
        target = Target()
        fills = Fills(target)
        for i in range(30):
            fills.write(f"p{i}", b"x")
        writer = fills._writer._thread
        assert writer is not None and writer.is_alive()
        await fills.drain()
        assert fills.bytes == 0 and not any(f"p{i}" in fills for i in range(30))
        assert sorted(name for batch in target.batches for name in batch) == sorted(f"p{i}" for i in range(30))
        writer.join(5)
        assert not writer.is_alive()

    asyncio.run(go())


def test_gathered_calls_run_on_the_writer_thread_a_batch_in_one_call(caplog: pytest.LogCaptureFixture) -> None:
    """Items gathered while the writer is busy reach their call together,
    after the batch's fills; drain waits for them; an error is logged."""

    async def go() -> None:
        target = Target()
        fills = Fills(target)
        release = threading.Event()
        order: list[str] = []
        calls: list[tuple[str, str, tuple[int, ...]]] = []

        def record(head: str, *items: int) -> None:
            order.append("call")
            calls.append((threading.current_thread().name, head, items))

        def broken(head: str, *items: int) -> None:
            raise ValueError("a bug")

        target.does["first"] = held(release)
        target.does["second"] = lambda: order.append("second") is None
        fills.write("first", b"x")  # holds the writer busy
        await asyncio.sleep(0.05)
        fills.write("second", b"y")
        for item in range(5):
            fills.gather(record, "m", item)
        fills.gather(record, "n", 9)
        fills.gather(broken, "m", 1)
        assert calls == []
        release.set()
        await fills.drain()
        assert sorted(calls) == [("tierstore-fills", "m", (0, 1, 2, 3, 4)), ("tierstore-fills", "n", (9,))]
        assert order == ["second", "call", "call"]  # the batch's fill ran before its gathered calls

    with caplog.at_level(logging.WARNING, logger="tierstore.fills"):
        asyncio.run(go())
    assert "could not write 1 records" in caplog.text


def test_what_one_turn_of_the_loop_submits_reaches_the_writer_together() -> None:
    """Fills and gathered items submitted without yielding are posted to the
    idle writer as one list when the loop's turn ends: one wake-up, the
    fills in one ``fill_many`` and the gathered items in one call."""

    async def go() -> None:
        target = Target()
        fills = Fills(target)
        calls: list[tuple[int, ...]] = []

        def record(head: str, *items: int) -> None:
            calls.append(items)

        for i in range(5):
            fills.write(f"p{i}", b"x")
            fills.gather(record, "m", i)
            time.sleep(0.002)  # the GIL given up (as a hash or a system call does): the writer could run
        futures = [written(fills, f"p{i}") for i in range(5)]
        assert target.batches == [] and calls == []  # nothing posted before the turn ends
        assert await asyncio.gather(*futures) == [True] * 5
        await fills.drain()
        assert calls == [(0, 1, 2, 3, 4)] and target.batches == [[f"p{i}" for i in range(5)]]

    for _ in range(20):  # the writer idle and waiting each time: never one item at a time
        asyncio.run(go())


def test_room_waits_until_the_fills_behind_hold_at_most_the_bytes_asked() -> None:
    """A cold read asks for room before it fetches a large piece: it goes on
    once the writer has written all but ``most`` bytes of what it holds."""

    async def go() -> None:
        target = Target()
        fills = Fills(target)
        first, second = threading.Event(), threading.Event()
        piece = b"x" * LARGE
        target.does.update(p0=held(first), p1=held(second))
        fills.write("p0", piece)
        fills.write("p1", piece)
        one, two = written(fills, "p0"), written(fills, "p1")
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
        target = Target()
        fills = Fills(target)
        busy, release = threading.Event(), threading.Event()
        running: list[str] = []
        target.does.update(first=held(busy, running), small=held(release))
        fills.write("first", b"x" * LARGE)  # keeps the writer busy
        first = written(fills, "first")
        while not running:  # the writer took it alone
            await asyncio.sleep(0.001)
        fills.write("big", b"x" * LARGE)
        fills.write("small", b"y")
        large, small = written(fills, "big"), written(fills, "small")
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
        target = Target()
        fills = Fills(target)
        stuck = threading.Event()
        target.does["p0"] = held(stuck)
        fills.write("p0", b"x" * LARGE)
        with caplog.at_level(logging.WARNING, logger="tierstore.fills"):
            assert await asyncio.wait_for(fills.room(0, wait=0.05), 5) is False
        assert "behind" in caplog.text
        stuck.set()
        assert await fills.room(0) is True
        await fills.drain()

    asyncio.run(go())
