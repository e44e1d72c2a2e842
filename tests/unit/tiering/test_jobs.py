"""The job registry: results, failures, cancel, progress figures, trimming."""

from __future__ import annotations

import asyncio
import time

import pytest

from tiering.jobs import Job, JobFinished, Jobs, JobState


async def _finish(jobs: Jobs, job: Job) -> Job:
    await jobs.wait(job.id)
    return job


def test_a_job_reports_its_result_and_progress() -> None:
    async def work(job: Job) -> dict:
        job.expect(items=4, nbytes=400)
        for _ in range(4):
            job.advance(1, 100)
            await asyncio.sleep(0)
        return {"done": True}

    async def main() -> None:
        jobs = Jobs()
        job = await _finish(jobs, jobs.start("demo", {"x": 1}, work))
        assert job.state is JobState.SUCCEEDED and job.result == {"done": True}
        assert (job.items_done, job.bytes_done, job.fraction, job.eta) == (4, 400, 1.0, 0.0)
        assert job.started is not None and job.finished is not None and job.params == {"x": 1}

    asyncio.run(main())


def test_a_failing_job_keeps_its_message_and_a_cancelled_one_says_so() -> None:
    gate = asyncio.Event()

    async def fail(job: Job) -> None:
        raise RuntimeError("capacity store said no")

    async def forever(job: Job) -> None:
        gate.set()
        await asyncio.sleep(3600)

    async def main() -> None:
        jobs = Jobs()
        failed = await _finish(jobs, jobs.start("fail", {}, fail))
        assert failed.state is JobState.FAILED and failed.errors == ["capacity store said no"]
        running = jobs.start("long", {}, forever)
        await gate.wait()
        assert (await jobs.wait(running.id, timeout=0.01)).state is JobState.RUNNING
        await jobs.cancel(running.id)
        assert running.state is JobState.CANCELLED and running.finished is not None
        with pytest.raises(JobFinished):
            await jobs.cancel(running.id)
        assert await jobs.cancel("no-such-job") is None
        assert jobs.count_by_state() == {"running": 0, "succeeded": 0, "failed": 1, "cancelled": 1}

    asyncio.run(main())


def test_after_stop_a_job_is_recorded_cancelled_and_never_runs() -> None:
    """At shutdown the admin API still answers while the index closes: a job
    started then must not touch it."""
    ran: list[str] = []

    async def work(job: Job) -> None:
        ran.append(job.id)

    async def main() -> None:
        jobs = Jobs()
        await jobs.stop()
        job = jobs.start("flush", {}, work)
        assert job.state is JobState.CANCELLED and job.done and job.finished is not None
        assert job.errors == ["the gateway is stopping"]
        assert (await jobs.wait(job.id, timeout=1)) is job
        await asyncio.sleep(0)
        assert ran == [] and jobs.get(job.id) is job

    asyncio.run(main())


def test_eta_follows_the_rate_and_unknown_totals_give_none() -> None:
    job = Job("1", "demo", {})
    job.started = 100.0
    job.finished = None
    assert job.fraction is None and job.eta is None and job.rate is None
    job.expect(nbytes=1000)
    job.advance(nbytes=250)
    job.started = time.time() - 10  # 250 bytes in 10 s: 30 s to go
    assert job.fraction == 0.25
    assert job.eta == pytest.approx(30, rel=0.05)
    assert job.rate == pytest.approx(25, rel=0.05)


def test_errors_are_capped_and_finished_jobs_trimmed_oldest_first() -> None:
    async def noop(job: Job) -> None:
        for i in range(30):
            job.error(f"e{i}")

    async def main() -> None:
        jobs = Jobs(keep=3)
        started = [jobs.start("n", {}, noop) for _ in range(5)]
        for job in started:
            await jobs.wait(job.id)
        jobs.start("n", {}, noop)  # trimming happens as new jobs start
        kept = [job.id for job in jobs.list()]
        assert started[0].id not in kept and started[1].id not in kept
        assert kept[0] > kept[-1], "newest first"
        assert len(started[4].errors) == 20 and started[4].errors_dropped == 10

    asyncio.run(main())
