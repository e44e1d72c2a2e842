"""A gateway process, tuned before it serves: its event loop, malloc, gc
and descriptor limit.

Every gateway process (the writer, each read worker) runs its servers with
:func:`run_loop`, which applies the tuning below first. Each setting says
why, with what was measured.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import resource
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.config.allocator import allocator
from tiering import pool


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on a fresh event loop (uvloop when installed), with
    glibc's malloc tuned first (:func:`tune_malloc`) and trimmed meanwhile,
    unless the process runs on jemalloc (``gateway/config/allocator.py``)."""
    glibc = allocator() == "glibc"
    if glibc:  # jemalloc gives pages back by itself (JEMALLOC_CONF)
        tune_malloc()
    raise_descriptor_limit()
    tune_gc()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(_trimming(main) if glibc else main)


async def _trimming(main: Coroutine[Any, Any, None]) -> None:
    """``main``, with free memory inside malloc's arenas handed back every
    ``MALLOC_TRIM_EVERY`` seconds meanwhile (:func:`trim_malloc`)."""
    trimmer = asyncio.ensure_future(_trim_every(MALLOC_TRIM_EVERY))
    try:
        await main
    finally:
        trimmer.cancel()


async def _trim_every(seconds: float) -> None:
    """Trim the arenas every ``seconds`` in the I/O pool; stop where malloc is not glibc's."""
    while True:
        await asyncio.sleep(seconds)
        if await pool.run(trim_malloc) < 0:
            return


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MALLOC_ARENAS = 2
MALLOC_MMAP_THRESHOLD = 1024 * 1024
MALLOC_TRIM_THRESHOLD = 16 * 1024 * 1024


# Seconds between two trims of malloc's arenas (trim_malloc). Every 15 s,
# under the hostile soak, once its caches and RocksDB's memory table no
# longer grew, the main heap (the event loop's arena) still rose from
# 46-54 MiB resident in the first two minutes to 65-69 MiB after six,
# while malloc's bytes in use stayed at 50-55 MiB; trimmed every 3 s it
# was 31-52 MiB after six (docs/reliability.md).
MALLOC_TRIM_EVERY = 3.0


def trim_malloc() -> int:
    """Hand free pages inside malloc's arenas back to the system
    (``malloc_trim(0)``); 1 if it released any, -1 without glibc.

    The top of an arena is trimmed as it frees (:func:`tune_malloc`), but
    free space between live chunks is not: under a mix of many request
    sizes (the soak's hostile mix) the arenas' free bytes grew with RSS,
    about +20 MiB a minute of holes left by freed request buffers
    (docs/reliability.md). A trim ``madvise``s them away; it holds each
    arena's lock while it walks it (a few milliseconds at most here), so
    it runs in the I/O pool, every ``MALLOC_TRIM_EVERY`` seconds, whether
    or not :func:`tune_malloc` applied its settings."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return -1
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return int(trim(0))


def tune_malloc() -> bool:
    """Make glibc's malloc give large buffers back to the system when freed.

    By default glibc keeps one arena per thread that allocated, and raises
    its mmap threshold (up to 32 MiB) each time a large mmapped block is
    freed. Segment builds and part uploads allocate buffers of several MiB
    on many pool threads, so after a while those buffers come from arenas
    and, freed, stay in the process: RSS climbs towards its peak and stays
    there (the soak benchmark measured +30 MiB a minute over 5 minutes).
    With two arenas and a fixed 1 MiB threshold, every buffer of 1 MiB or
    more is its own mapping, returned when freed; small objects are not
    affected. A fixed threshold also fixes the trim threshold at 128 KiB:
    each freed buffer just under 1 MiB (a batch's send buffers) at the top
    of the heap was handed back and faulted in again on the next, 210 page
    faults a buffer and 15 % of the gateway's cycles in a hot batch; up to
    16 MiB free at the top of each arena is now kept, and a trim leaves
    16 MiB there (glibc's top pad: 128 KiB by default). With the trim
    threshold alone (8 MiB), four batches at once still grew the heap
    past it, were trimmed back to 128 KiB and faulted the next buffers in
    again: 140 to 575 page faults a batch of 64 objects in half the runs
    (0.075 against 0.055 ms of CPU an object); with the top pad, at most
    86 in a run's first epoch and none after it, in four runs. Left alone
    when MALLOC_ARENA_MAX or MALLOC_MMAP_THRESHOLD_ is set (glibc has
    applied it), and a no-op without glibc. True if applied."""
    if "MALLOC_ARENA_MAX" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS)
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, MALLOC_ARENAS) and mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD)
                and mallopt(_M_TOP_PAD, MALLOC_TRIM_THRESHOLD))


# Allocations of tracked objects between two collections of the youngest
# generation (CPython's default: 700).
GC_YOUNG = 20_000


def tune_gc() -> None:
    """Collect the youngest generation every GC_YOUNG allocations rather
    than every 700. A request allocates hundreds of short-lived containers
    (its scope, headers, dataclasses, tuples) that reference counting frees
    anyway; collected every 700, the survivors of requests in flight were
    traversed again and again: 3.5 % of a gateway's cycles under hot
    batches (``perf``). Cycles still get collected, later; the older
    generations keep their thresholds."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, older, oldest)


# Descriptors a gateway process asks for (at most its hard limit allows).
DESCRIPTORS = 65536


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit on open descriptors towards its hard
    limit (at most DESCRIPTORS), as nginx's ``worker_rlimit_nofile`` and Go's
    runtime do: the usual soft default of 1,024 is too few for a server's
    connections, its database files and the descriptors hot reads keep
    open (tiering/open_files.py). The soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, DESCRIPTORS)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):  # not allowed here: keep what we have
            return soft
        return wanted
    return soft


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
