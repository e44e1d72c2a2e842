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
   ``TRIM_EVERY`` seconds). Between ``RELAX_AT`` and ``SHED_AT``, malloc
   is trimmed too once a burst of buffers ends (they reached half their
   share of the budget since the last sample and hold a quarter of it
   now), rather than at the next timed trim: the pages freed buffers leave
   inside the arenas go back while nothing new has filled them yet (a
   trim walks every arena, the other threads' included). Below
   ``RELAX_AT`` the bounds double back,
   one step a sample, so a spike's end does not refill them all at once.
2. At ``REFUSE_AT``, new S3 requests that would allocate (any method but
   HEAD and DELETE) get 503 SlowDown with Retry-After, as a full disk's
   refusals do (gateway/app.py), which SDKs retry with backoff; below
   ``RESUME_AT`` they are taken again, and also once RSS stops falling
   while refusing (``STILL_SAMPLES``): refusing cannot shrink the
   process below what it holds at rest. The admin API, ``/health`` and
   ``/metrics`` always answer: the operator must see why.

RSS is read from ``/proc/self/statm`` (two integers, about 10 us) on the
event loop every 0.5 s, not per request: a request asks one attribute.

Refusing by RSS comes late: requests admitted before it keep allocating.
So the buffers requests will hold are also admitted by bytes
(``tiering/admission.py``), from a share of the budget fixed at start
(:func:`buffer_budget`): a request with a body reserves what its body's
blocks hold before a byte is read (:meth:`MemoryBudget.admit`), and
answers 503 SlowDown at once when that does not fit; the tiering layer
reserves what cold reads, batch runs, large bodies streamed to the store
and segment builds hold, as it allocates them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from gateway.config.allocator import allocator
from gateway.s3.errors import S3Error
from gateway.s3.headers import decimal
from gateway.serving.process import trim_malloc
from tiering import pool
from tiering.admission import ADMISSION, BODY_HELD, Admission
from tiering.memo import CACHES, MIN_SQUEEZE, Caches

log = logging.getLogger("tierstore.memory")

SAMPLE_EVERY = 0.5  # seconds between two samples of RSS
TRIM_EVERY = 2.0  # seconds between two malloc trims while shedding
SHED_AT = 0.85  # fractions of the budget
RELAX_AT = 0.70
REFUSE_AT = 0.95
RESUME_AT = 0.90
# Samples (5 s) of refusing in which RSS, between RESUME_AT and REFUSE_AT,
# no longer falls, after which S3 requests are taken again: what is left
# is the process at rest, which refusing does not shrink.
STILL_SAMPLES = 10
# Methods that never refused: HEAD answers no body, DELETE frees.
UNREFUSED = frozenset({"HEAD", "DELETE"})
# The least the buffers get, whatever the budget leaves them: four bodies.
BUFFERS_FLOOR = 4 * BODY_HELD
_BODY_METHODS = frozenset({"PUT", "POST"})
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


def buffer_budget(limit: int, rss: int, caches: int) -> int:
    """The bytes requests' buffers may hold at once (0: no limit, without
    a budget): what is left of the budget's shedding mark (``SHED_AT``)
    once the process as it started (``rss``: modules, index, servers) and
    the caches' bounds (``caches``) are counted, at least
    ``BUFFERS_FLOOR``. Below the shedding mark, not the budget: malloc's
    slack and what is not reserved (small requests' scopes and answers,
    hot reads' headers) need the rest."""
    if not limit:
        return 0
    return max(BUFFERS_FLOOR, int(limit * SHED_AT) - rss - caches)


def lowest_budget(rss: int, caches: int) -> int:
    """The smallest budget whose shedding mark holds the process as it
    started (``rss``), its caches' bounds and the buffers' floor: under
    it, the process is at its refusal mark as soon as it serves."""
    return int((rss + caches + BUFFERS_FLOOR) / SHED_AT)


def body_bytes(headers: dict[str, str]) -> int:
    """The bytes a request's body will hold while it is read: its length
    (the decoded length of an aws-chunked body), at most ``BODY_HELD``;
    ``BODY_HELD`` when no length is given (chunked transfer), and for a
    copy (CopyObject, UploadPartCopy), whose source's bytes are written
    as a body's are."""
    if "x-amz-copy-source" in headers:
        return BODY_HELD
    length = headers.get("x-amz-decoded-content-length") or headers.get("content-length")
    if length is None:
        return BODY_HELD if "transfer-encoding" in headers else 0
    number = decimal(length.strip())  # not int(): thousands of digits, or "²", raise
    return 0 if number is None else min(number, BODY_HELD)


class MemoryBudget:
    """RSS against ``limit`` bytes (0: no budget; RSS is still sampled for
    the status), and what this process sheds and refuses near it."""

    def __init__(self, limit: int, caches: Caches = CACHES, admission: Admission = ADMISSION) -> None:
        self.limit = limit
        self.caches = caches
        self.admission = admission
        self.started_rss = 0  # RSS when the budget started, before any traffic
        self.allocator = allocator()  # glibc's malloc, or jemalloc (TIERSTORE_MALLOC)
        self.rss = self.file = self.peak = 0
        self.refusing = False
        self.sheds = 0  # samples that shrank the caches
        self.trims = 0
        self.refused = 0  # S3 requests answered 503 SlowDown for memory
        self._trimmed = 0.0
        self._low = 0  # the lowest RSS since refusing began
        self._still = 0  # samples since it last fell
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.sample()
        self.started_rss = self.rss
        self.admission.configure(buffer_budget(self.limit, self.rss, self.caches.total()))
        if self.limit and self.limit < (lowest := lowest_budget(self.rss, self.caches.total())):
            log.warning("the memory budget (%d MiB) leaves too little above this process as it starts (%d MiB) "
                        "and its caches (%d MiB): expect most S3 requests refused 503 SlowDown; the lowest "
                        "sensible budget here is about %d MiB (docs/configuration.md#memory)",
                        self.limit >> 20, self.rss >> 20, self.caches.total() >> 20, -(-lowest >> 20))
        self._task = asyncio.create_task(self._run(), name="tierstore memory budget")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.caches.squeezed < 1:
            self.caches.squeeze(1.0)
        self.admission.configure(0)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY)
            try:
                await self.sample()
            except Exception:  # a bug here must not stop the sampling for good
                log.exception("sampling memory failed")

    async def sample(self) -> None:
        """Read RSS, then shed, relax, refuse or resume as it says."""
        # On the loop: /proc is no disk (about 10 us), and the pool's queue
        # is longest under load, when shedding must be on time.
        self.rss, self.file = resident()
        self.peak = max(self.peak, self.rss)
        if not self.limit:
            return
        used = self.rss / self.limit
        if used >= SHED_AT:
            await self._shed()
        elif used < RELAX_AT and self.caches.squeezed < 1:
            self.caches.squeeze(self.caches.squeezed * 2)
        elif used >= RELAX_AT and self._burst_ended():
            await self._trim()
        self.admission.high = self.admission.held
        if used >= REFUSE_AT and not self.refusing:
            log.warning("RSS %d MiB is %.0f%% of the memory budget: refusing new S3 requests (503 SlowDown)",
                        self.rss >> 20, used * 100)
            self.refusing = True
            self._low, self._still = self.rss, 0
        elif used < RESUME_AT and self.refusing:
            log.warning("RSS %d MiB is back under %.0f%% of the memory budget: taking S3 requests again",
                        self.rss >> 20, RESUME_AT * 100)
            self.refusing = False
        elif self.refusing and used < REFUSE_AT and self._at_rest():
            log.warning("RSS %d MiB no longer falls while refusing (%.0f%% of the memory budget): "
                        "taking S3 requests again", self.rss >> 20, used * 100)
            self.refusing = False

    def _at_rest(self) -> bool:
        """RSS has not fallen (by 1 MiB) for ``STILL_SAMPLES`` samples of
        refusing. Under the hostile soak with a budget of half its peak
        (160 MiB), a gateway refusing everything settled at 145-146 MiB,
        above the 144 MiB mark where it would resume, and stayed there:
        the requests in flight had ended, and what remained (the process,
        its caches at their floor, malloc's slack) was not the requests'.
        Refusing on would only fail every client; taken again, new work is
        still bounded by the admission by bytes and refused at
        ``REFUSE_AT``."""
        if self.rss < self._low - (1 << 20):
            self._low, self._still = self.rss, 0
            return False
        self._still += 1
        return self._still >= STILL_SAMPLES

    async def _shed(self) -> None:
        self.sheds += 1
        squeezed = max(MIN_SQUEEZE, self.caches.squeezed / 2)
        await pool.run(self.caches.squeeze, squeezed)  # drops entries under the caches' locks
        await self._trim()

    def _burst_ended(self) -> bool:
        """Buffers reached half their share since the last sample and hold
        at most a quarter of it now."""
        admission = self.admission
        return bool(admission.limit) and admission.high * 2 >= admission.limit >= admission.held * 4

    async def _trim(self) -> None:
        """``malloc_trim``, at most every ``TRIM_EVERY`` seconds."""
        if time.monotonic() - self._trimmed >= TRIM_EVERY:
            self._trimmed = time.monotonic()
            self.trims += 1
            await pool.run(trim_malloc)

    def check(self, method: str) -> None:
        """503 SlowDown for a new S3 request of ``method`` while refusing."""
        if self.refusing and method not in UNREFUSED:
            self.refused += 1
            raise S3Error("SlowDown", "The gateway is at its memory budget; retry shortly")

    def admit(self, method: str, headers: dict[str, str]) -> int:
        """Reserve what a new request's body will hold (:func:`body_bytes`)
        before a byte of it is read; the bytes reserved, for
        :meth:`release` once the handler is done; 503 SlowDown when they
        do not fit now. A request without a body reserves nothing."""
        if method not in _BODY_METHODS:
            return 0
        size = body_bytes(headers)
        if size and not self.admission.take_now(size):
            self.refused += 1
            raise S3Error("SlowDown", "The gateway is at its memory budget for request bodies; retry shortly")
        return size

    def release(self, size: int) -> None:
        if size:
            self.admission.give(size)

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
            "started_rss": self.started_rss,
            "allocator": self.allocator,
            "buffers": self.admission.stats(),
            "caches": self.caches.stats(),
        }
