"""Staged files: how a body is written into the hot tier as the only copy of
acknowledged data, in pieces of at most a part size, fsynced with their
directories before any index record names them."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from tiering.files import write_all
from tiering.meta import Chunk
from tiering.model.digests import Digests


def new_file_id() -> str:
    """Time-ordered, collision-free id: 16 hex of ns clock + 8 random hex."""
    return f"{time.time_ns():016x}{secrets.token_hex(4)}"



class StagedRoom(Protocol):
    """What a staging writer asks of the hot tier (``HotTier``): room for
    the bytes it writes, the paths of new staged files, and their removal."""

    def grow_staged(self, size: int, reserved: int) -> None: ...

    def shrink_staged(self, size: int) -> None: ...

    def path_of(self, file_id: str) -> Path: ...

    def sync_dir(self, path: Path) -> None: ...

    def release(self, size: int) -> None: ...

    def remove(self, chunks: Iterable[Chunk]) -> None: ...


class StagingWriter:
    """Writes a body into new staged files of at most ``part_size`` bytes
    each, hashing what it writes. Not thread-safe: one request drives it,
    one pool call at a time."""

    def __init__(self, tier: StagedRoom, part_size: int, digests: Digests, reserved: int) -> None:
        self._tier = tier
        self._part_size = part_size
        self.digests = digests
        self._reserved = reserved  # bytes reserved up front, released as written
        self._chunks: list[Chunk] = []
        self._fd: int | None = None
        self._file_id = ""
        self._file_size = 0

    @property
    def size(self) -> int:
        return self.digests.size

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        self.digests.update(view)
        while view:
            if self._fd is None or self._file_size == self._part_size:
                self._next_file()
            room = self._part_size - self._file_size
            piece = view[:room]
            self._tier.grow_staged(len(piece), self._reserved)
            self._reserved = max(0, self._reserved - len(piece))
            try:
                write_all(self._fd, piece)  # type: ignore[arg-type]
            except BaseException:
                # A full disk, say: back to what was counted, so the file
                # and the tier's count agree when ``abort`` removes it.
                self._tier.shrink_staged(len(piece))
                os.ftruncate(self._fd, self._file_size)  # type: ignore[arg-type]
                raise
            self._file_size += len(piece)
            view = view[len(piece):]

    def _next_file(self) -> None:
        self._close_file()
        self._file_id = new_file_id()
        self._fd = os.open(self._tier.path_of(self._file_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._file_size = 0

    def _close_file(self) -> None:
        if self._fd is None:
            return
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = None
            # Even when the fsync failed (a full disk): ``abort`` removes it.
            self._chunks.append(Chunk(self._file_size, self._file_id))

    def finish(self) -> tuple[Chunk, ...]:
        """Make every file durable (data and directory entries)."""
        if self._fd is None and not self._chunks:
            self._next_file()  # an empty body is one empty piece
        self._close_file()
        for directory in {self._tier.path_of(c.file_id).parent for c in self._chunks}:  # type: ignore[arg-type]
            self._tier.sync_dir(directory)
        self._tier.release(self._reserved)
        self._reserved = 0
        return tuple(self._chunks)

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._chunks.append(Chunk(self._file_size, self._file_id))
        self._tier.remove(self._chunks)
        self._tier.release(self._reserved)
        self._reserved = 0
