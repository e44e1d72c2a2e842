"""The local-directory capacity store: the embedded default, and the
reference backend for the contract tests."""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import stat
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from tiering import pool
from tiering.capacity.store import (
    TMP_PREFIX,
    CapacityStats,
    CapacityUpload,
    Into,
    Listed,
    check_name,
    check_prefix,
    check_range,
    pour,
)
from tiering.errors import CapacityConflict, CapacityError, CapacityNotFound
from tiering.files import sync_dir, write_all


class LocalDirStore:
    """Objects as files under ``root``; ``root/<name>``.

    Writes go to a temp file in the target directory, are fsynced, renamed
    over the final name and the directory is fsynced: after ``put`` or
    ``complete`` returns the object survives a crash, and a reader never sees
    a partial file. A crash mid-write leaves only a temp file, which ``list``
    skips (and a new write never reuses).

    A file system cannot hold both ``a`` and ``a/b``: writing a name below
    another object's name (or vice versa) raises ``CapacityError`` here, where
    S3 would accept it. Segment names never nest that way.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.abspath(root))
        self.stats = CapacityStats()

    def describe(self) -> str:
        return self.root.as_uri()

    def path_of(self, name: str) -> Path:
        return self.root / check_name(name)

    async def start(self) -> None:
        try:
            await pool.run(_make_dirs, self.root)
        except OSError as exc:
            raise CapacityError(
                f"capacity store {self.describe()}: cannot create it: {exc}"
            ) from exc

    async def close(self) -> None:
        return None

    async def abort_incomplete(self) -> int:
        removed = await pool.run(_remove_temps, self.root)
        self.stats.deletes += removed
        return removed

    async def put(self, name: str, data: bytes | memoryview) -> None:
        path = self.path_of(name)
        self.stats.puts += 1
        with self._errors("put", name):
            await pool.run(self._put_sync, path, data)
        self.stats.bytes_written += len(data)

    def upload(self, name: str) -> CapacityUpload:
        return _LocalUpload(self, name, self.path_of(name))

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        path = self.path_of(name)
        check_range(start, end)
        if start == end:
            return b""
        self.stats.gets += 1
        with self._errors("get", name):
            data = await pool.run(_read_range, path, start, end)
        self.stats.bytes_read += len(data)
        return data

    async def get_range_into(self, name: str, start: int, end: int, into: Into) -> None:
        """In one piece: a local read is one pool call, with nothing to wait
        for between its bytes."""
        pour(into, await self.get_range(name, start, end))

    async def get_tail(self, name: str, length: int) -> tuple[bytes, int]:
        path = self.path_of(name)
        if length < 0:
            raise ValueError(f"tail length must be >= 0, got {length}")
        self.stats.gets += 1
        with self._errors("get", name):
            data, total = await pool.run(_read_tail, path, length)
        self.stats.bytes_read += len(data)
        return data, total

    async def size(self, name: str) -> int:
        path = self.path_of(name)
        self.stats.heads += 1
        with self._errors("head", name):
            return await pool.run(_file_size, path)

    async def delete(self, name: str) -> None:
        path = self.path_of(name)
        self.stats.deletes += 1
        with self._errors("delete", name):
            await pool.run(_remove_file, path)

    async def read_versioned(self, name: str) -> tuple[bytes, str]:
        path = self.path_of(name)
        self.stats.gets += 1
        with self._errors("get", name):
            data = await pool.run(path.read_bytes)
        self.stats.bytes_read += len(data)
        return data, _tag(data)

    async def read_if_changed(self, name: str, tag: str) -> tuple[bytes, str] | None:
        path = self.path_of(name)
        self.stats.gets += 1
        with self._errors("get", name):
            data = await pool.run(path.read_bytes)
        found = _tag(data)
        if found == tag:
            return None  # counted as S3's 304 would be: a request, no body
        self.stats.bytes_read += len(data)
        return data, found

    async def put_conditional(self, name: str, data: bytes, expect: str | None) -> str:
        path = self.path_of(name)
        self.stats.puts += 1
        with self._errors("put", name):
            await pool.run(self._swap_sync, path, data, expect)
        self.stats.bytes_written += len(data)
        return _tag(data)

    async def delete_conditional(self, name: str, expect: str) -> None:
        path = self.path_of(name)
        self.stats.deletes += 1
        with self._errors("delete", name):
            await pool.run(self._swap_sync, path, None, expect, missing_ok=True)

    def _swap_sync(self, path: Path, data: bytes | None, expect: str | None, missing_ok: bool = False) -> None:
        """Compare and swap (``data`` None: remove) under an exclusive flock
        on the store's root directory, which every process using this store
        takes for it. ``missing_ok``: a missing file is no conflict."""
        if data is not None:
            _make_dirs(path.parent)
        lock = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = _tag(path.read_bytes())
            except (FileNotFoundError, NotADirectoryError):
                current = None
            if current is None and missing_ok:
                return
            if current != expect:
                verb = "write" if data is not None else "delete"
                raise CapacityConflict(
                    f"capacity store {self.describe()}: conditional {verb} of {path.name}: "
                    f"{'it exists' if expect is None else 'it changed' if current else 'it is gone'}",
                    name=str(path), expected=expect, found=current,
                )
            if data is None:
                _remove_file(path)
            else:
                self._put_sync(path, data)
        finally:
            os.close(lock)  # and with it the flock

    def _put_sync(self, path: Path, data: bytes | memoryview) -> None:
        _make_dirs(path.parent)
        fd, tmp = _open_temp(path.parent)
        try:
            write_all(fd, data)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        _publish(tmp, path)

    def _errors(self, op: str, name: str) -> _Translate:
        return _Translate(self, op, name)

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[tuple[str, int]]:
        check_prefix(prefix)
        self.stats.lists += 1
        with self._errors("list", prefix):
            entries = await pool.run(_list_sync, self.root, prefix)
        for entry in entries:
            if entry[0] > after:
                yield entry


    async def list_entries(self, prefix: str = "") -> AsyncIterator[Listed]:
        check_prefix(prefix)
        self.stats.lists += 1
        with self._errors("list", prefix):
            entries = await pool.run(_list_entries_sync, self.root, prefix)
        for entry in entries:
            yield entry


class _Translate:
    """Maps OSError from a blocking call to the capacity error family."""

    __slots__ = ("name", "op", "store")

    def __init__(self, store: LocalDirStore, op: str, name: str) -> None:
        self.store, self.op, self.name = store, op, name

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        where = f"capacity store {self.store.describe()}: {self.op} {self.name}"
        # A name whose parent is a file (NotADirectory) or that is itself a
        # directory is as absent as a missing file: S3 would say NoSuchKey.
        missing = (FileNotFoundError, NotADirectoryError, IsADirectoryError)
        if isinstance(exc, missing) and self.op not in ("put", "upload"):
            raise CapacityNotFound(f"{where}: no such object", name=self.name) from exc
        if isinstance(exc, _ShortFile):
            size, start, end = exc.args
            raise CapacityError(
                f"{where}: object is {size} bytes, asked for [{start}, {end})",
                name=self.name,
                size=size,
            ) from exc
        if isinstance(exc, OSError):
            raise CapacityError(f"{where} failed: {exc}", name=self.name, op=self.op) from exc


class _ShortFile(Exception):
    """A file ends before the range asked for: (size, start, end)."""


class _LocalUpload:
    """Appends to a temp file next to the final name; ``complete`` renames it."""

    def __init__(self, store: LocalDirStore, name: str, path: Path) -> None:
        self._store = store
        self._name = name
        self._path = path
        self._fd: int | None = None
        self._tmp: Path | None = None
        self._size = 0
        self._state = "open"
        # A cancelled await leaves its pool call running: abort must not
        # close the descriptor under a write still in flight.
        self._lock = threading.Lock()

    async def write(self, data: bytes | memoryview) -> None:
        self._check_open()
        if not data:
            return
        with self._store._errors("upload", self._name):
            await pool.run(self._write_sync, data)
        self._size += len(data)
        self._store.stats.bytes_written += len(data)

    async def complete(self) -> int:
        self._check_open()
        self._store.stats.puts += 1
        with self._store._errors("upload", self._name):
            await pool.run(self._complete_sync)
        self._state = "complete"
        return self._size

    async def abort(self) -> None:
        if self._state != "open":
            return
        self._state = "aborted"
        await pool.run(self._abort_sync)

    def _check_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"upload of {self._name!r} is already {self._state}")

    def _open_sync(self) -> int:
        if self._fd is None:
            _make_dirs(self._path.parent)
            self._fd, self._tmp = _open_temp(self._path.parent)
        return self._fd

    def _write_sync(self, data: bytes | memoryview) -> None:
        with self._lock:
            if self._state == "aborted":
                return  # a write whose await was cancelled, running after abort
            write_all(self._open_sync(), data)

    def _complete_sync(self) -> None:
        with self._lock:
            fd = self._open_sync()
            assert self._tmp is not None
            os.fsync(fd)
            os.close(fd)
            self._fd = None
            _publish(self._tmp, self._path)
            self._tmp = None

    def _abort_sync(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self._tmp is not None:
                _unlink_quietly(self._tmp)
                self._tmp = None


# Blocking helpers: run only through tiering.pool.


def _make_dirs(path: Path) -> None:
    """mkdir -p ``path``, fsyncing the parent of every directory it creates
    so a new directory entry is as durable as the file put in it."""
    missing: list[Path] = []
    current = path
    while not current.is_dir() and current.parent != current:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue
        sync_dir(directory.parent)


def _open_temp(directory: Path) -> tuple[int, Path]:
    while True:
        tmp = directory / f"{TMP_PREFIX}{secrets.token_hex(8)}"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), tmp
        except FileExistsError:
            continue


def _remove_temps(root: Path) -> int:
    """Delete temp files a crash left mid-write anywhere under ``root``."""
    removed = 0
    for directory, _, files in os.walk(root):
        for name in files:
            if name.startswith(TMP_PREFIX):
                _unlink_quietly(Path(directory) / name)
                removed += 1
    return removed


def _publish(tmp: Path, path: Path) -> None:
    """Rename a fsynced temp file over ``path`` and make the rename durable."""
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    sync_dir(path.parent)


def _tag(data: bytes) -> str:
    """A local object's version tag: its MD5 in quotes, as S3's single-PUT ETag."""
    return f'"{hashlib.md5(data).hexdigest()}"'


def _read_range(path: Path, start: int, end: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        offset = start
        while offset < end:
            chunk = os.pread(fd, end - offset, offset)
            if not chunk:
                raise _ShortFile(os.fstat(fd).st_size, start, end)
            parts.append(chunk)
            offset += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd)


def _read_tail(path: Path, length: int) -> tuple[bytes, int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        total = os.fstat(fd).st_size
    finally:
        os.close(fd)
    start = max(0, total - length)
    return (_read_range(path, start, total) if start < total else b""), total


def _file_size(path: Path) -> int:
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise IsADirectoryError(f"{path} is not a file")
    return st.st_size


def _remove_file(path: Path) -> None:
    try:
        os.unlink(path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return  # deleting a missing object succeeds; a directory is no object
    sync_dir(path.parent)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _list_sync(root: Path, prefix: str) -> list[tuple[str, int]]:
    # Start at the deepest directory the prefix names, not at the root:
    # listing "segments/" must not walk everything else.
    base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
    start = root / base if base else root
    found = [
        (name, size)
        for name, size in _walk(start, base + "/" if base else "")
        if name.startswith(prefix)
    ]
    found.sort()
    return found


def _list_entries_sync(root: Path, prefix: str) -> list[Listed]:
    """Each file under ``prefix`` with its tag (its MD5, as ``_tag``) and mtime."""
    found = []
    for name, _ in _list_sync(root, prefix):
        path = root / name
        try:
            with open(path, "rb") as file:
                data = file.read()
                modified = os.fstat(file.fileno()).st_mtime
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            continue  # removed since the walk
        found.append(Listed(name, len(data), _tag(data), modified))
    return found


def _walk(directory: Path, name_prefix: str) -> Iterator[tuple[str, int]]:
    """``(name, size)`` of every regular file below ``directory``, temp files
    and symlinks excluded; files that vanish mid-walk are skipped."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if entry.name.startswith(TMP_PREFIX):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from _walk(Path(entry.path), f"{name_prefix}{entry.name}/")
            elif entry.is_file(follow_symlinks=False):
                yield f"{name_prefix}{entry.name}", entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
