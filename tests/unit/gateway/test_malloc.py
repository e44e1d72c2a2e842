"""gateway.listener.tune_malloc: applied on glibc, left alone when the
environment already tunes malloc."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CALL = "from gateway.listener import tune_malloc; print(tune_malloc())"


def tuned(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", CALL], env={**clean, **env},
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_applied_on_glibc() -> None:
    assert tuned() == "True"


@pytest.mark.parametrize("name", ["MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_"])
def test_the_environment_wins(name: str) -> None:
    assert tuned(**{name: "4"}) == "False"
