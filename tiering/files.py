"""Small blocking file helpers shared by the hot tier and the local
capacity store (callers run them in the pool)."""

from __future__ import annotations

import os
from pathlib import Path


def write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until every byte is written (it may write less)."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def sync_dir(path: Path) -> None:
    """fsync a directory, so the entries created or renamed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
