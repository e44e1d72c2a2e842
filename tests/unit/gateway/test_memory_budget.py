"""The memory budget's steps without a server: near the budget the caches
shrink, at it S3 work is refused, and both undo themselves as RSS falls."""

from __future__ import annotations

import asyncio

import pytest

from gateway.s3.errors import S3Error
from gateway.serving import memory
from gateway.serving.memory import MemoryBudget
from tiering.admission import Admission
from tiering.memo import MIN_SQUEEZE, Caches, Kept

MiB = 1024 * 1024


def test_shed_refuse_resume_relax(monkeypatch: pytest.MonkeyPatch) -> None:
    rss = [0]
    monkeypatch.setattr(memory, "resident", lambda: (rss[0], 0))
    trims: list[int] = []
    monkeypatch.setattr(memory, "trim_malloc", lambda: trims.append(1) or 1)
    caches = Caches()
    caches.configure({"records": 64 * MiB})
    kept: Kept[int, bytes] = Kept("records", registry=caches)
    budget = MemoryBudget(1000 * MiB, caches)

    async def at(mib: int) -> None:
        rss[0] = mib * MiB
        await budget.sample()

    async def run() -> None:
        await at(800)  # under the high-water mark: nothing
        assert caches.squeezed == 1 and not budget.refusing and budget.sheds == 0
        budget.check("GET")
        await at(900)  # above it: the caches halve, malloc is trimmed
        assert caches.squeezed == 0.5 and kept.bound == 32 * MiB and trims == [1]
        budget.check("PUT")  # not refusing yet
        for _ in range(10):
            await at(960)  # at the budget: refusing, the caches down to their floor
        assert budget.refusing and caches.squeezed == MIN_SQUEEZE
        for method in ("GET", "PUT", "POST"):
            with pytest.raises(S3Error) as refused:
                budget.check(method)
            assert refused.value.code == "SlowDown"
        budget.check("HEAD")
        budget.check("DELETE")
        assert budget.refused == 3
        await at(920)  # between resume and refuse: still refusing
        assert budget.refusing
        await at(600)  # well under: taken again, the caches grow back a step a sample
        assert not budget.refusing and caches.squeezed == 2 * MIN_SQUEEZE
        stats = budget.stats()
        assert stats["limit"] == 1000 * MiB and stats["peak_rss"] == 960 * MiB and stats["refused"] == 3
        await budget.stop()
        assert caches.squeezed == 1  # a stopped budget leaves the caches as configured

    asyncio.run(run())


def test_without_a_budget_rss_is_only_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "resident", lambda: (10_000 * MiB, MiB))
    caches = Caches()
    budget = MemoryBudget(0, caches)
    asyncio.run(budget.sample())
    budget.check("GET")
    assert budget.stats()["rss_anon"] == 9_999 * MiB and budget.stats()["limit"] is None
    assert caches.squeezed == 1


def test_resident_reads_this_process() -> None:
    rss, file = memory.resident()
    assert rss > 10 * MiB and 0 < file < rss


def test_a_burst_of_buffers_ending_above_the_relax_mark_trims_malloc(monkeypatch: pytest.MonkeyPatch) -> None:
    rss = [750 * MiB]
    monkeypatch.setattr(memory, "resident", lambda: (rss[0], 0))
    trims: list[int] = []
    monkeypatch.setattr(memory, "trim_malloc", lambda: trims.append(1) or 1)
    admission = Admission()
    budget = MemoryBudget(1000 * MiB, Caches(), admission)

    async def run() -> None:
        await budget.start()  # RSS 750 of 1000: the buffers get 850 - 750 MiB
        assert admission.limit == 100 * MiB
        assert admission.take_now(30 * MiB)
        await budget.sample()  # a few buffers: no burst
        assert trims == []
        assert admission.take_now(30 * MiB)
        await budget.sample()  # 60 MiB held, still held: not ended
        assert trims == []
        admission.give(60 * MiB)
        await budget.sample()  # reached 60 % of the share, back to 0: ended, trimmed
        assert trims == [1] and budget.trims == 1
        await budget.sample()  # nothing since: no second trim
        assert trims == [1]
        rss[0] = 600 * MiB  # under the relax mark, a burst needs no trim of its own
        assert admission.take_now(60 * MiB)
        admission.give(60 * MiB)
        budget._trimmed = 0.0  # past the trims' spacing
        await budget.sample()
        assert trims == [1]
        await budget.stop()
        assert admission.limit == 0

    asyncio.run(run())


def test_the_buffers_share_leaves_room_for_the_process_and_its_caches() -> None:
    assert memory.buffer_budget(0, 100 * MiB, 10 * MiB) == 0  # no budget: no limit
    assert memory.buffer_budget(200 * MiB, 110 * MiB, 8 * MiB) == int(200 * MiB * 0.85) - 118 * MiB
    assert memory.buffer_budget(120 * MiB, 110 * MiB, 8 * MiB) == memory.BUFFERS_FLOOR


def test_a_body_reserves_its_blocks_not_its_length() -> None:
    assert memory.body_bytes({"content-length": "100"}) == 100
    assert memory.body_bytes({"content-length": str(1 << 30)}) == memory.BODY_HELD
    assert memory.body_bytes({"content-length": "1000", "x-amz-decoded-content-length": "900"}) == 900
    assert memory.body_bytes({"transfer-encoding": "chunked"}) == memory.BODY_HELD
    assert memory.body_bytes({"content-length": "junk"}) == 0
    assert memory.body_bytes({}) == 0
    assert memory.body_bytes({"content-length": "0", "x-amz-copy-source": "/b/k"}) == memory.BODY_HELD


def test_refusing_ends_once_rss_no_longer_falls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process whose rest is above the resume mark is not left refusing
    for good: once RSS has stopped falling for STILL_SAMPLES samples under
    the refusal mark, S3 requests are taken again."""
    rss = [0]
    monkeypatch.setattr(memory, "resident", lambda: (rss[0], 0))
    monkeypatch.setattr(memory, "trim_malloc", lambda: 1)
    budget = MemoryBudget(1000 * MiB, Caches(), Admission())

    async def at(mib: float) -> None:
        rss[0] = int(mib * MiB)
        await budget.sample()

    async def run() -> None:
        await at(970)
        assert budget.refusing
        for mib in (940, 930, 920):  # falling: the requests in flight end
            await at(mib)
            assert budget.refusing
        for i in range(memory.STILL_SAMPLES):  # at rest above the resume mark (900)
            assert budget.refusing, i
            await at(920 - i % 2 * 0.5)
        assert not budget.refusing
        await at(955)  # at the refusal mark again: refusing
        assert budget.refusing

    asyncio.run(run())


def test_a_budget_below_the_process_as_it_starts_is_warned_of(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(memory, "resident", lambda: (125 * MiB, 38 * MiB))
    caches = Caches()
    caches.configure({"records": 6 * MiB})

    async def started(limit: int) -> None:
        budget = MemoryBudget(limit, caches, Admission())
        await budget.start()
        await budget.stop()

    assert memory.lowest_budget(125 * MiB, 6 * MiB) == int((125 + 6 + 16) * MiB / 0.85)  # 172.9 MiB
    with caplog.at_level("WARNING", logger="tierstore.memory"):
        asyncio.run(started(176 * MiB))
        assert not caplog.records
        asyncio.run(started(160 * MiB))
    [warning] = caplog.records
    assert "(160 MiB)" in warning.message and "(125 MiB)" in warning.message and "about 173 MiB" in warning.message


def test_a_body_length_of_thousands_of_digits_or_other_digits_reserves_without_a_crash() -> None:
    assert memory.body_bytes({"x-amz-decoded-content-length": "7" * 5000}) == memory.BODY_HELD
    assert memory.body_bytes({"content-length": "\u00b2"}) == 0  # str.isdigit() says yes, int() raises
    assert memory.body_bytes({"content-length": " 1024 "}) == 1024
