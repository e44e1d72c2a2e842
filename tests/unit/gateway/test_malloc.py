"""gateway.serving.process.tune_malloc: applied on glibc, left alone when the
environment already tunes malloc; the arenas trimmed while a process serves."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import time

import pytest

from gateway.serving import process

CALL = "from gateway.serving.process import tune_malloc; print(tune_malloc())"


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


def test_gc_collects_the_young_generation_less_often() -> None:
    """gateway.serving.process.tune_gc: the youngest generation's threshold raised,
    the older ones' kept."""
    script = ("import gc, json; before = gc.get_threshold(); from gateway.serving.process import tune_gc, GC_YOUNG; "
              "tune_gc(); print(json.dumps([before, gc.get_threshold(), GC_YOUNG]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    before, after, young = json.loads(done.stdout)
    assert after == [young, before[1], before[2]] and young > before[0]


def test_the_arenas_are_trimmed_while_the_process_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_loop's main runs with a trim of malloc's arenas every MALLOC_TRIM_EVERY
    seconds, in a thread, stopped with it."""
    calls = []
    monkeypatch.setattr(process, "MALLOC_TRIM_EVERY", 0.01)
    monkeypatch.setattr(process, "trim_malloc", lambda: calls.append(1) or 1)
    asyncio.run(process._trimming(asyncio.sleep(0.2)))
    assert len(calls) >= 3
    done = len(calls)
    time.sleep(0.05)
    assert len(calls) == done  # stopped with main


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_a_trim_runs_on_glibc() -> None:
    assert process.trim_malloc() in (0, 1)
