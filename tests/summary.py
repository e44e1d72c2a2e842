"""Lines a test module reports once it ends (how many inputs a fuzzer
tried), shown in pytest's summary whether or not xdist workers ran it.

A module calls :func:`report` from a module-scoped fixture; in one process
the line goes to the summary directly, in an xdist worker it travels to the
controller in ``workeroutput`` and ``tests/conftest.py`` prints it there.
"""

from __future__ import annotations

import pytest

KEY = "tierstore_summary_lines"
LINES = pytest.StashKey[list[str]]()


def report(config: pytest.Config, line: str) -> None:
    worker_output = getattr(config, "workeroutput", None)
    if worker_output is not None:  # an xdist worker: the controller prints it
        worker_output.setdefault(KEY, []).append(line)
    else:
        config.stash.setdefault(LINES, []).append(line)


def collect(config: pytest.Config, worker_output: dict) -> None:
    """On the controller: keep the lines a finished worker sent."""
    config.stash.setdefault(LINES, []).extend(worker_output.get(KEY, []))


def lines(config: pytest.Config) -> list[str]:
    return config.stash.get(LINES, [])
