"""Background jobs: long operator actions with progress, rate, ETA and cancel.

A job is one coroutine (flush, compact, evict, pin, ...) run as a task. It
reports progress through its :class:`Job` (items and bytes done, and the
totals when known); the registry keeps running jobs and the most recent
finished ones, in memory: a job does not survive a restart, the work it did
does (each step it takes is itself durable).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tiering.errors import InsufficientStorage, SlowDown

log = logging.getLogger("tierstore.jobs")

KEEP_FINISHED = 100  # finished jobs kept for GET /jobs
MAX_ERRORS = 20  # per job; later errors are counted, not kept


class JobState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobFinished(Exception):
    """Cancel asked of a job that has already ended."""


@dataclass(slots=True)
class Job:
    """One job's identity, state and progress (mutated by the work itself)."""

    id: str
    kind: str
    params: dict[str, Any]
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    state: JobState = JobState.RUNNING
    items_done: int = 0
    items_total: int | None = None
    bytes_done: int = 0
    bytes_total: int | None = None
    errors: list[str] = field(default_factory=list)
    errors_dropped: int = 0
    result: dict[str, Any] | None = None

    # -- called by the work --------------------------------------------------

    def expect(self, items: int | None = None, nbytes: int | None = None) -> None:
        """Set (or raise) the totals once the work knows them."""
        if items is not None:
            self.items_total = items
        if nbytes is not None:
            self.bytes_total = nbytes

    def advance(self, items: int = 0, nbytes: int = 0) -> None:
        self.items_done += items
        self.bytes_done += nbytes

    def error(self, message: str) -> None:
        """Record a non-fatal error (the job goes on)."""
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(message)
        else:
            self.errors_dropped += 1

    # -- derived -------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.state is not JobState.RUNNING

    @property
    def fraction(self) -> float | None:
        """Progress 0..1 from bytes when their total is known, else items."""
        if self.state is JobState.SUCCEEDED:
            return 1.0
        if self.bytes_total:
            return min(self.bytes_done / self.bytes_total, 1.0)
        if self.items_total:
            return min(self.items_done / self.items_total, 1.0)
        if self.items_total == 0 or self.bytes_total == 0:
            return 1.0 if self.done else 0.0
        return None

    @property
    def elapsed(self) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or time.time()) - self.started

    @property
    def rate(self) -> float | None:
        """Bytes per second over the job's life so far."""
        elapsed = self.elapsed
        return self.bytes_done / elapsed if elapsed > 0 and self.bytes_done else None

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far, when a total is known."""
        if self.done:
            return 0.0
        fraction = self.fraction
        if not fraction or self.started is None:
            return None
        return self.elapsed * (1 - fraction) / fraction


Work = Callable[[Job], Awaitable[Mapping[str, Any] | None]]


class Jobs:
    """The node's jobs: start, look up, cancel; running and recent ones."""

    def __init__(self, keep: int = KEEP_FINISHED) -> None:
        self._keep = keep
        self._jobs: OrderedDict[str, Job] = OrderedDict()  # oldest first
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._numbers = itertools.count(1)
        self._stopped = False

    def start(self, kind: str, params: Mapping[str, Any], work: Work) -> Job:
        """Run ``work(job)`` in the background; its return value is the result.

        Once :meth:`stop` ran (the node is shutting down) a job is recorded
        as cancelled and its work never starts: the index and the capacity
        store it would use are being closed."""
        # A counter keeps ids ordered; the random tail keeps them unguessable
        # across restarts (an old id never names a new job).
        job = Job(f"{next(self._numbers):04d}-{secrets.token_hex(3)}", kind, dict(params))
        self._jobs[job.id] = job
        if self._stopped:
            job.error("the gateway is stopping")
            job.state, job.finished = JobState.CANCELLED, job.created
        else:
            task = asyncio.create_task(self._run(job, work), name=f"tierstore job {job.id}")
            self._tasks[job.id] = task
        self._trim()
        return job

    async def _run(self, job: Job, work: Work) -> None:
        job.started = time.time()
        try:
            result = await work(job)
        except asyncio.CancelledError:
            job.state = JobState.CANCELLED
        except Exception as exc:
            # A full disk's refusal is said in one line; anything else with its traceback.
            refused = isinstance(exc, (SlowDown, InsufficientStorage))
            log.warning("job %s (%s) failed: %s", job.id, job.kind, exc, exc_info=None if refused else exc)
            job.error(getattr(exc, "message", None) or str(exc) or type(exc).__name__)
            job.state = JobState.FAILED
        else:
            job.result = dict(result) if result is not None else {}
            job.state = JobState.SUCCEEDED
        finally:
            job.finished = time.time()
            self._tasks.pop(job.id, None)

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def list(self) -> list[Job]:
        """Newest first."""
        return list(reversed(self._jobs.values()))

    def count_by_state(self) -> dict[str, int]:
        counts = {state.value: 0 for state in JobState}
        for job in self._jobs.values():
            counts[job.state.value] += 1
        return counts

    async def cancel(self, job_id: str) -> Job | None:
        """Cancel a running job and wait until it has stopped."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        task = self._tasks.get(job_id)
        if task is None:
            raise JobFinished(f"job {job_id} already ended ({job.state.value})")
        task.cancel()
        await asyncio.wait({task})
        return job

    async def wait(self, job_id: str, timeout: float | None = None) -> Job | None:
        """Wait for a job to end (or ``timeout``); the job either way."""
        job = self._jobs.get(job_id)
        task = self._tasks.get(job_id)
        if task is not None:
            await asyncio.wait({task}, timeout=timeout)
        return job

    async def stop(self) -> None:
        """Cancel every running job and start no more (at shutdown)."""
        self._stopped = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _trim(self) -> None:
        finished = [job_id for job_id, job in self._jobs.items() if job.done]
        for job_id in finished[: max(len(finished) - self._keep, 0)]:
            del self._jobs[job_id]
