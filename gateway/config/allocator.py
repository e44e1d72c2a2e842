"""The allocator a gateway process runs on: jemalloc where the system has
it (the default), else glibc's malloc (tuned by
``gateway/serving/process.py``), chosen before the process starts
(``TIERSTORE_MALLOC``: auto, jemalloc or glibc). Here, not with the tuning,
because ``serve`` must choose before it loads the server: running on
jemalloc runs the command again with the library preloaded."""

from __future__ import annotations

import os
import sys

# The allocator a gateway process runs on where it is installed, instead
# of glibc's malloc, and the settings it then runs with: two arenas as
# glibc's, freed pages given back after a second by jemalloc's own thread
# rather than by trims.
MALLOC_ENV = "TIERSTORE_MALLOC"
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:2"
_JEMALLOC_PATHS = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
                   "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2", "/usr/local/lib/libjemalloc.so.2")


def use_jemalloc(environ: dict[str, str] | None = None) -> str | None:
    """Run this command again with jemalloc preloaded (``execve``: the
    same process, arguments and environment, plus ``LD_PRELOAD`` and,
    unless set, ``MALLOC_CONF``) where ``TIERSTORE_MALLOC`` (``auto``, the
    default, or ``jemalloc``) lets it and the library is installed; call
    it before any thread starts. Returns only when nothing is to be done:
    None, or why jemalloc was asked for by name and not used (logged by
    the caller; the gateway runs on glibc's malloc then).

    Why the default: under the hostile soak for 30 minutes, on glibc's
    malloc the process ended 25 % above its size at 2 minutes (holes
    between live blocks that neither a trim nor the mmap threshold hands
    back), on jemalloc 4 % under it, for the same CPU and the same hot GET
    (docs/benchmarks/memory-and-soak.md). ValueError for another name."""
    env = os.environ if environ is None else environ
    wanted = env.get(MALLOC_ENV, "auto").strip().lower() or "auto"
    if wanted == "glibc":
        return None
    if wanted not in ("auto", "jemalloc"):
        raise ValueError(f"{MALLOC_ENV}={wanted!r}: the allocators are auto (the default: jemalloc where it is "
                         "installed), jemalloc and glibc")
    if "jemalloc" in env.get("LD_PRELOAD", ""):
        return None  # preloaded: this is the process after the execve, or the operator did it
    library = jemalloc_library()
    if library is None:
        if wanted == "auto":
            return None
        return "jemalloc was asked for and is not installed (libjemalloc2): glibc's malloc it is"
    preload = env.get("LD_PRELOAD", "")
    new = {**env, "LD_PRELOAD": f"{library} {preload}".strip()}
    new.setdefault("MALLOC_CONF", JEMALLOC_CONF)
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], new)  # does not return


def jemalloc_library() -> str | None:
    """Where this system's jemalloc is (Debian's ``libjemalloc2`` and the
    like); None where it is not installed."""
    return next((path for path in _JEMALLOC_PATHS if os.path.exists(path)), None)


def allocator() -> str:
    """The allocator this process runs on: "jemalloc" or "glibc"."""
    try:
        with open("/proc/self/maps") as maps:
            return "jemalloc" if any("libjemalloc" in line for line in maps) else "glibc"
    except OSError:
        return "glibc"
