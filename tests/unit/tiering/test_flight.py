"""Single flight (tiering/reads/flight.py): callers of one key share one
run of the work, its result or its exception, and a run nobody joined
leaves nothing behind."""

from __future__ import annotations

import asyncio

import pytest

from tiering.reads.flight import SingleFlight


def test_callers_of_one_key_share_one_run() -> None:
    async def scenario() -> tuple[list[tuple[str, bool]], int]:
        flight: SingleFlight[str] = SingleFlight()
        runs = 0
        release = asyncio.Event()

        async def work() -> str:
            nonlocal runs
            runs += 1
            await release.wait()
            return "bytes"

        first = asyncio.ensure_future(flight.run("k", work))
        await asyncio.sleep(0)
        joined = [asyncio.ensure_future(flight.run("k", work)) for _ in range(3)]
        await asyncio.sleep(0)
        assert "k" in flight
        release.set()
        results = [await first, *[await j for j in joined]]
        assert "k" not in flight
        return results, runs

    results, runs = asyncio.run(scenario())
    assert runs == 1
    assert results == [("bytes", True)] + [("bytes", False)] * 3


def test_a_failure_reaches_every_caller_and_the_next_call_runs_again() -> None:
    async def scenario() -> list[str]:
        flight: SingleFlight[str] = SingleFlight()
        seen = []
        gate = asyncio.Event()

        async def failing() -> str:
            await gate.wait()
            raise ConnectionResetError("the store closed the connection")

        callers = [asyncio.ensure_future(flight.run("k", failing)) for _ in range(2)]
        await asyncio.sleep(0)
        gate.set()
        for caller in callers:
            with pytest.raises(ConnectionResetError):
                await caller
            seen.append("raised")

        async def fine() -> str:
            return "again"

        seen.append((await flight.run("k", fine))[0])
        return seen

    assert asyncio.run(scenario()) == ["raised", "raised", "again"]


def test_a_failure_nobody_joined_is_not_reported_as_unretrieved() -> None:
    def scenario() -> list[dict]:
        loop = asyncio.new_event_loop()
        reported: list[dict] = []
        loop.set_exception_handler(lambda _, context: reported.append(context))

        async def run() -> None:
            flight: SingleFlight[str] = SingleFlight()

            async def failing() -> str:
                raise TimeoutError("the store sent nothing")

            with pytest.raises(TimeoutError):
                await flight.run("k", failing)

        loop.run_until_complete(run())
        loop.close()
        import gc

        gc.collect()
        return reported

    assert scenario() == []


def test_a_joiner_cancelled_leaves_the_run_to_the_others() -> None:
    async def scenario() -> tuple[str, bool]:
        flight: SingleFlight[str] = SingleFlight()
        release = asyncio.Event()

        async def work() -> str:
            await release.wait()
            return "bytes"

        first = asyncio.ensure_future(flight.run("k", work))
        await asyncio.sleep(0)
        joiner = asyncio.ensure_future(flight.run("k", work))
        await asyncio.sleep(0)
        joiner.cancel()
        await asyncio.sleep(0)
        release.set()
        assert joiner.cancelled()
        return await first

    assert asyncio.run(scenario()) == ("bytes", True)


def test_a_spawned_run_is_shared_with_callers_of_run() -> None:
    async def scenario() -> tuple[str, tuple[str, bool]]:
        flight: SingleFlight[str] = SingleFlight()
        release = asyncio.Event()

        async def work() -> str:
            await release.wait()
            return "warmed"

        async def never() -> str:
            raise AssertionError("a caller of run() ran the work again")

        task = flight.spawn("k", work())
        joined = asyncio.ensure_future(flight.run("k", never))
        await asyncio.sleep(0)
        release.set()
        return await task, await joined

    assert asyncio.run(scenario()) == ("warmed", ("warmed", False))
