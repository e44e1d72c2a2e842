"""Small real filesystems for full-disk tests: a tmpfs the test mounts
(and unmounts), and ballast that fills one the way another tenant of a
shared disk would.

Mounting needs root (CAP_SYS_ADMIN); where it is not permitted (a
container without the capability, an unprivileged user) the test is
skipped, saying why. tmpfs gives real ENOSPC from write(2), fsync and
RocksDB's appends, and counts fallocate'd blocks as used, as ext4 does.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

MiB = 1024 * 1024


@contextlib.contextmanager
def tmpfs(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``path`` (created if need be)
    for the block's duration; skips the test where mounting is refused."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root (CAP_SYS_ADMIN); this test runs as a user")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); "
                    "full-disk tests need CAP_SYS_ADMIN")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode != 0:
            # Still busy (a process of the test that has not exited yet):
            # detach it now, the kernel frees it when the last user goes.
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def take(path: Path, name: str = "ballast") -> int:
    """Another tenant writes a file as large as the free space it sees
    (a checkpoint that fills the disk), once: whatever is freed after it
    looked stays free. Bytes written (fewer when others wrote meanwhile)."""
    size = free(path)
    written = 0
    fd = os.open(path / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while written < size:
            try:
                written += os.write(fd, b"\0" * min(MiB, size - written))
            except OSError:
                break
    finally:
        os.close(fd)
    return written


def fill(path: Path, leave: int = 0, name: str = "ballast") -> int:
    """Write ballast into ``path`` (a file named ``name``, appended to)
    until at most ``leave`` bytes stay free, or the filesystem refuses;
    bytes written. A greedy tenant: while it writes it also takes what
    others free meanwhile. What it wrote stays."""
    written = 0
    fd = os.open(path / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for block in (MiB, 64 * 1024, 4096):
            chunk = b"\0" * block
            while free(path) - block >= leave:
                try:
                    written += os.write(fd, chunk)
                except OSError:
                    break
        if leave == 0:  # the last bytes of the last page
            with contextlib.suppress(OSError):
                while True:
                    written += os.write(fd, b"\0" * 512)
    finally:
        os.close(fd)
    return written


def empty(path: Path, name: str = "ballast") -> None:
    """The other tenant deletes its ballast."""
    (path / name).unlink(missing_ok=True)
