"""The randomized crash loop (tests/crashloop.py), quick mode: a mixed
workload SIGKILLed (now and then stopped cleanly) at random moments, each
restart checked against the oracle of acknowledged writes; at the end every
object read back from the capacity store, fsck, and (local directory) a
rebuild from the capacity store alone checked too.

``TIERSTORE_CRASH_SEED`` picks the seed (default fixed, so CI is
repeatable) and ``TIERSTORE_CRASH_CYCLES`` the number of kills over a
local-directory capacity store; the variant over moto runs a few. A failure
names the seed and the command that replays it; the long mode is
``python -m tests.crashloop --cycles 200 --seed N``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.crashloop import LoopConfig, run

SEED = int(os.environ.get("TIERSTORE_CRASH_SEED", "20240611"))
CYCLES = int(os.environ.get("TIERSTORE_CRASH_CYCLES", "6"))


@pytest.mark.parametrize("capacity", ["local", "s3"])
def test_crash_loop(capacity: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Every kill leaves acknowledged writes whole and readable, deletes
    deleted, in-flight writes all there or not at all, acknowledged parts of
    open uploads completable; the listing agrees; the data directory passes
    fsck, nothing half-written is left, the log holds no Traceback or ERROR."""
    endpoint = request.getfixturevalue("moto_endpoint") if capacity == "s3" else ""
    cycles = CYCLES if capacity == "local" else max(1, (CYCLES + 2) // 3)
    print(f"crash loop seed {SEED} ({capacity}, {cycles} cycles): "
          f"replay with TIERSTORE_CRASH_SEED={SEED}")
    # The rebuild from the capacity store is checked once, over the local directory.
    config = LoopConfig(SEED, cycles, capacity, endpoint, rebuild=capacity == "local")
    summary = run(config, tmp_path)
    print(summary.render())
    assert summary.cycles == cycles and summary.kills + summary.moments["term"] == cycles
    assert sum(summary.in_flight.values()) > 0, "no kill cut an operation: nothing in flight tested"
    assert sum(summary.acknowledged.values()) > 0, summary.render()
