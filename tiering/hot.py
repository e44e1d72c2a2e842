"""The hot tier: object bytes in files on local NVMe.

Files are named by an opaque id, never by the object key, so no key can
reach outside the data directory. A file is written, fsynced (with its
directory) and only then referenced from the index; a crash before the index
commit leaves an unreferenced file that ``sweep`` removes at start-up.
Deleting follows the same order in reverse: index first, then the file.

Every method here blocks; the object service calls them through the pool.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from tiering.checksums import Hasher, new_hasher
from tiering.meta import Chunk

_FANOUT = 256  # subdirectories, so no directory holds millions of entries
_CLEAN = "clean-shutdown"  # marker file: written at close, removed at start


def new_file_id() -> str:
    """Time-ordered, collision-free id: 16 hex of ns clock + 8 random hex."""
    return f"{time.time_ns():016x}{secrets.token_hex(4)}"


class ChunkWriter:
    """Writes one new hot-tier file while hashing what it writes.

    Not thread-safe; one request drives it, one pool call at a time.
    """

    def __init__(self, tier: HotTier, checksum_algorithm: str | None, sha256: bool) -> None:
        self._tier = tier
        self.file_id = new_file_id()
        self.path = tier.path_of(self.file_id)
        self.size = 0
        self.md5 = hashlib.md5()
        self.checksum: Hasher | None = new_hasher(checksum_algorithm) if checksum_algorithm else None
        self.sha256 = hashlib.sha256() if sha256 else None
        self._fd: int | None = None

    def write(self, data: bytes | memoryview) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.md5.update(data)
        if self.checksum is not None:
            self.checksum.update(data)
        if self.sha256 is not None:
            self.sha256.update(data)
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self.size += len(data)
        self._tier.account(len(data))

    def finish(self) -> Chunk:
        """Make the file durable (data and directory entry) and close it."""
        if self._fd is None:
            self.write(b"")
        assert self._fd is not None
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = None
        self._tier.sync_dir(self.path.parent)
        return Chunk(self.file_id, self.size)

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._tier.remove([Chunk(self.file_id, self.size)])


class HotTier:
    """Object bytes under ``root`` within a byte budget."""

    def __init__(self, root: Path, budget: int) -> None:
        self.root = root
        self.budget = budget
        self._used = 0
        self._lock = threading.Lock()
        for i in range(_FANOUT):
            (root / f"{i:02x}").mkdir(parents=True, exist_ok=True)

    @property
    def used(self) -> int:
        return self._used

    def path_of(self, file_id: str) -> Path:
        # The last two hex digits are random, so files spread evenly.
        return self.root / file_id[-2:] / file_id

    def account(self, delta: int) -> None:
        with self._lock:
            self._used += delta

    def reserve(self, size: int) -> bool:
        """True if ``size`` more bytes fit in the budget right now."""
        return self._used + size <= self.budget

    def writer(self, checksum_algorithm: str | None = None, sha256: bool = False) -> ChunkWriter:
        return ChunkWriter(self, checksum_algorithm, sha256)

    def read(self, file_id: str, offset: int, length: int) -> bytes:
        fd = self.open(file_id)
        try:
            return _pread_all(fd, length, offset)
        finally:
            os.close(fd)

    def open(self, file_id: str) -> int:
        """A read-only descriptor; the caller closes it."""
        return os.open(self.path_of(file_id), os.O_RDONLY)

    @staticmethod
    def pread(fd: int, offset: int, length: int) -> bytes:
        return _pread_all(fd, length, offset)

    def remove(self, chunks: Iterable[Chunk]) -> None:
        for chunk in chunks:
            try:
                size = os.stat(self.path_of(chunk.file_id)).st_size
                os.unlink(self.path_of(chunk.file_id))
            except FileNotFoundError:
                continue
            self.account(-size)

    def mark_clean(self) -> None:
        """Record a clean shutdown: no write in flight, and the bytes in use.

        Called after the index is closed; ``resume_clean`` consumes it."""
        tmp = self.root / (_CLEAN + ".tmp")
        tmp.write_text(str(self._used))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.root / _CLEAN)
        self.sync_dir(self.root)

    def resume_clean(self) -> bool:
        """True if the last run shut down cleanly (no sweep needed). The
        marker is removed, durably, before serving: a crash from here on
        must lead to a sweep at the next start."""
        marker = self.root / _CLEAN
        try:
            used = int(marker.read_text())
        except (FileNotFoundError, ValueError):
            marker.unlink(missing_ok=True)
            return False
        marker.unlink()
        self.sync_dir(self.root)
        with self._lock:
            self._used = used
        return True

    @staticmethod
    def sync_dir(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def sweep(self, referenced: set[str]) -> tuple[int, int]:
        """Remove files no index record references (left by a crash between
        writing a file and committing it, or between an index delete and the
        unlink). Recount the bytes in use. Return (files removed, bytes kept)."""
        removed = 0
        used = 0
        for i in range(_FANOUT):
            with os.scandir(self.root / f"{i:02x}") as entries:
                for entry in entries:
                    if entry.name in referenced:
                        used += entry.stat().st_size
                    else:
                        os.unlink(entry.path)
                        removed += 1
        with self._lock:
            self._used = used
        return removed, used


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            raise OSError(f"hot-tier file shorter than its index record ({offset + got} < {offset + length})")
        parts.append(more)
        got += len(more)
    return b"".join(parts)
