"""How many processes serve S3: the cores this process may run on, and the
number of read workers ``workers = "auto"`` makes of them."""

from __future__ import annotations

import os
from pathlib import Path

MAX_WORKERS = 64  # S3 processes on one port: far above the cores a node has
# ``workers = "auto"`` (the default): one read worker per this many cores
# the process may run on (its affinity, or its cgroup's CPU quota when
# lower), at most AUTO_WORKERS_MAX; one process below two.
# A hot GET costs the same CPU in one process or spread over workers
# (docs/performance.md#read-workers), so workers only pay with cores the
# clients leave free; on a training node the trainer and its data-loading
# processes take most of them.
CORES_PER_WORKER = 8
AUTO_WORKERS_MAX = 8


def auto_workers(cores: int | None = None) -> int:
    """``workers = "auto"``: the processes serving S3 for ``cores`` (by
    default :func:`available_cores`), see CORES_PER_WORKER."""
    if cores is None:
        cores = available_cores()
    workers = min(AUTO_WORKERS_MAX, cores // CORES_PER_WORKER)
    return workers if workers >= 2 else 1


def available_cores(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may run on (its CPU affinity), fewer when its
    cgroup has a CPU quota (a container started with ``--cpus``)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota = quota_cores(cpu_max.read_text())
    except OSError:  # no cgroup v2 here
        return cores
    return min(cores, quota) if quota is not None else cores


def quota_cores(cpu_max: str) -> int | None:
    """The cores a cgroup v2 ``cpu.max`` ("QUOTA PERIOD", or "max PERIOD")
    allows, rounded up; None without a quota, or for what it cannot read."""
    fields = cpu_max.split()
    if len(fields) != 2 or not fields[0].isdigit() or not fields[1].isdigit() or int(fields[1]) == 0:
        return None
    return max(1, -(-int(fields[0]) // int(fields[1])))
