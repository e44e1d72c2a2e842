"""Small helpers shared by the integration tests."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path


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
