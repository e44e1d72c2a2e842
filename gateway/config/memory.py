"""The memory a gateway process may use: the machine's, its container's
limit (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``), and the
bounds of the caches derived from it (``tiering/memo.py`` has the kinds
and their shares)."""

from __future__ import annotations

import os
from pathlib import Path

from tiering.memo import default_bounds

CGROUP_V2 = Path("/sys/fs/cgroup/memory.max")
CGROUP_V1 = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")


def machine_memory() -> int:
    """The machine's physical memory in bytes (0 where it cannot be read)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def cgroup_limit(paths: tuple[Path, ...] = (CGROUP_V2, CGROUP_V1), machine: int | None = None) -> int:
    """The container's memory limit in bytes; 0 when there is none. A v2
    ``max``, or a v1 value at or above the machine's memory (v1 writes
    "no limit" as the largest page-aligned number), is none."""
    machine = machine_memory() if machine is None else machine
    for path in paths:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if not text.isdigit():
            return 0  # "max"
        limit = int(text)
        return 0 if machine and limit >= machine else limit
    return 0


def cache_memory(memory_limit: int) -> int:
    """What the caches' default bounds are shares of: the memory budget
    when there is one, else the machine's memory."""
    machine = machine_memory()
    if memory_limit:
        return min(memory_limit, machine) if machine else memory_limit
    return machine or 4 * 1024**3


def cache_bounds(given: dict[str, int], memory_limit: int) -> dict[str, int]:
    """Every kind's bound: the ones ``given``, the defaults for the rest."""
    return default_bounds(cache_memory(memory_limit)) | given
