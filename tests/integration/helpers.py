"""Small helpers shared by the integration tests."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def counting_proxy(moto_endpoint: str) -> Iterator[Any]:
    """A request-counting proxy in front of moto (benchmarks/delay_proxy.py):
    ``operations``, ``paths`` and ``requests_to`` say what went through it."""
    added = str(BENCHMARKS) not in sys.path
    if added:
        sys.path.insert(0, str(BENCHMARKS))
    try:
        from delay_proxy import DelayProxy

        proxy = DelayProxy(int(moto_endpoint.rsplit(":", 1)[1])).start()
    finally:
        if added:
            sys.path.remove(str(BENCHMARKS))
    try:
        yield proxy
    finally:
        proxy.stop()


def sha256_file(path: Path, block: int = 8 * 1024 * 1024) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def random_file(path: Path, size: int, block: int = 8 * 1024 * 1024) -> str:
    """Write ``size`` random bytes to ``path`` in blocks; return their sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            data = os.urandom(min(block, left))
            digest.update(data)
            f.write(data)
            left -= len(data)
    return digest.hexdigest()


def tree_digest(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root``."""
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def wait_until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait for a state the gateway reaches on its own (not a speed check)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)
