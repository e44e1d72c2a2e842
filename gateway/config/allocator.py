"""The allocator a gateway process runs on: glibc's malloc (the default,
tuned by ``gateway/serving/process.py``) or jemalloc, chosen before the
process starts (``TIERSTORE_MALLOC``). Here, not with the tuning, because
``serve`` must choose before it loads the server: choosing jemalloc runs
the command again with the library preloaded."""

from __future__ import annotations

import os
import sys

# The allocator a gateway process may run on instead of glibc's malloc
# (TIERSTORE_MALLOC=jemalloc), and the settings it then runs with: two
# arenas as glibc's, freed pages given back after a second by jemalloc's
# own thread rather than by trims.
MALLOC_ENV = "TIERSTORE_MALLOC"
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:2"
_JEMALLOC_PATHS = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
                   "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2", "/usr/local/lib/libjemalloc.so.2")


def use_jemalloc(environ: dict[str, str] | None = None) -> str | None:
    """With ``TIERSTORE_MALLOC=jemalloc``, run this command again with
    jemalloc preloaded (``execve``: the same process, arguments and
    environment, plus ``LD_PRELOAD`` and, unless set, ``MALLOC_CONF``);
    call it before any thread starts. Returns only when nothing is to be
    done: None, or why jemalloc was asked for and not used (logged by the
    caller; the gateway runs on glibc's malloc then).

    Why: under the hostile soak for 30 minutes, on glibc's malloc the
    process ended 25 % above its size at 2 minutes (holes between live
    blocks that neither a trim nor the mmap threshold hands back), on
    jemalloc 4 % under it, for the same CPU
    (docs/benchmarks/memory-and-soak.md). ValueError for another
    name than glibc or jemalloc."""
    env = os.environ if environ is None else environ
    wanted = env.get(MALLOC_ENV, "glibc").strip().lower()
    if wanted in ("", "glibc"):
        return None
    if wanted != "jemalloc":
        raise ValueError(f"{MALLOC_ENV}={wanted!r}: the allocators are glibc (the default) and jemalloc")
    if "jemalloc" in env.get("LD_PRELOAD", ""):
        return None  # preloaded: this is the process after the execve, or the operator did it
    library = next((path for path in _JEMALLOC_PATHS if os.path.exists(path)), None)
    if library is None:
        return "jemalloc was asked for and is not installed (libjemalloc2): glibc's malloc it is"
    preload = env.get("LD_PRELOAD", "")
    new = {**env, "LD_PRELOAD": f"{library} {preload}".strip()}
    new.setdefault("MALLOC_CONF", JEMALLOC_CONF)
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], new)  # does not return


def allocator() -> str:
    """The allocator this process runs on: "jemalloc" or "glibc"."""
    try:
        with open("/proc/self/maps") as maps:
            return "jemalloc" if any("libjemalloc" in line for line in maps) else "glibc"
    except OSError:
        return "glibc"
