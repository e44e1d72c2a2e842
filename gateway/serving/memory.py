"""The process's memory budget: its RSS sampled in the background, the
caches shrunk and malloc trimmed near the budget, new work refused with
503 SlowDown over it.

Why a budget of its own: a container's memory limit is enforced by the
kernel's OOM killer, which ends the process with every request in flight
and the un-flushed writes' acknowledgements with it. The gateway sheds
first, while it still can choose what to give up:

1. At ``SHED_AT`` of the budget, every sample (``SAMPLE_EVERY`` seconds)
   halves the bounds of every cache (``tiering.memo.CACHES``, down to
   ``MIN_SQUEEZE`` of their configured bounds) and hands malloc's free
   pages back (:func:`gateway.serving.process.trim_malloc`, at most every
   ``TRIM_EVERY`` seconds). Below ``RELAX_AT`` the bounds double back,
   one step a sample, so a spike's end does not refill them all at once.
2. At ``REFUSE_AT``, new S3 requests that would allocate (any method but
   HEAD and DELETE) get 503 SlowDown with Retry-After, as a full disk's
   refusals do (gateway/app.py), which SDKs retry with backoff; below
   ``RESUME_AT`` they are taken again. The admin API, ``/health`` and
   ``/metrics`` always answer: the operator must see why.

RSS is read from ``/proc/self/statm`` (two integers, about 10 us) in the
I/O pool, not per request: a request asks one attribute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from gateway.s3.errors import S3Error
from gateway.serving.process import trim_malloc
from tiering import pool
from tiering.memo import CACHES, MIN_SQUEEZE, Caches

log = logging.getLogger("tierstore.memory")

SAMPLE_EVERY = 0.5  # seconds between two samples of RSS
TRIM_EVERY = 2.0  # seconds between two malloc trims while shedding
SHED_AT = 0.85  # fractions of the budget
RELAX_AT = 0.70
REFUSE_AT = 0.95
RESUME_AT = 0.90
# Methods that never refused: HEAD answers no body, DELETE frees.
UNREFUSED = frozenset({"HEAD", "DELETE"})
_PAGE = os.sysconf("SC_PAGE_SIZE")
STATM = Path("/proc/self/statm")


def resident(statm: Path = STATM) -> tuple[int, int]:
    """(RSS, its file-backed share) of this process in bytes; (0, 0) where
    /proc cannot be read."""
    try:
        fields = statm.read_text().split()
        return int(fields[1]) * _PAGE, int(fields[2]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0, 0


class MemoryBudget:
    """RSS against ``limit`` bytes (0: no budget; RSS is still sampled for
    the status), and what this process sheds and refuses near it."""

    def __init__(self, limit: int, caches: Caches = CACHES) -> None:
        self.limit = limit
        self.caches = caches
        self.rss = self.file = self.peak = 0
        self.refusing = False
        self.sheds = 0  # samples that shrank the caches
        self.trims = 0
        self.refused = 0  # S3 requests answered 503 SlowDown for memory
        self._trimmed = 0.0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.sample()
        self._task = asyncio.create_task(self._run(), name="tierstore memory budget")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.caches.squeezed < 1:
            self.caches.squeeze(1.0)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY)
            try:
                await self.sample()
            except Exception:  # a bug here must not stop the sampling for good
                log.exception("sampling memory failed")

    async def sample(self) -> None:
        """Read RSS, then shed, relax, refuse or resume as it says."""
        self.rss, self.file = await pool.run(resident)
        self.peak = max(self.peak, self.rss)
        if not self.limit:
            return
        used = self.rss / self.limit
        if used >= SHED_AT:
            await self._shed()
        elif used < RELAX_AT and self.caches.squeezed < 1:
            self.caches.squeeze(self.caches.squeezed * 2)
        if used >= REFUSE_AT and not self.refusing:
            log.warning("RSS %d MiB is %.0f%% of the memory budget: refusing new S3 requests (503 SlowDown)",
                        self.rss >> 20, used * 100)
            self.refusing = True
        elif used < RESUME_AT and self.refusing:
            log.warning("RSS %d MiB is back under %.0f%% of the memory budget: taking S3 requests again",
                        self.rss >> 20, RESUME_AT * 100)
            self.refusing = False

    async def _shed(self) -> None:
        self.sheds += 1
        squeezed = max(MIN_SQUEEZE, self.caches.squeezed / 2)
        await pool.run(self.caches.squeeze, squeezed)  # drops entries under the caches' locks
        if time.monotonic() - self._trimmed >= TRIM_EVERY:
            self._trimmed = time.monotonic()
            self.trims += 1
            await pool.run(trim_malloc)

    def check(self, method: str) -> None:
        """503 SlowDown for a new S3 request of ``method`` while refusing."""
        if self.refusing and method not in UNREFUSED:
            self.refused += 1
            raise S3Error("SlowDown", "The gateway is at its memory budget; retry shortly")

    def stats(self) -> dict[str, object]:
        """The ``memory`` part of ``GET /stats``."""
        limit = self.limit
        return {
            "rss": self.rss,
            "rss_anon": self.rss - self.file,
            "peak_rss": self.peak,
            "limit": limit or None,
            "shed_at": int(limit * SHED_AT) if limit else None,
            "refuse_at": int(limit * REFUSE_AT) if limit else None,
            "squeeze": self.caches.squeezed,
            "refusing": self.refusing,
            "sheds": self.sheds,
            "trims": self.trims,
            "refused": self.refused,
            "caches": self.caches.stats(),
        }
