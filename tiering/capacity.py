"""The capacity tier: immutable named objects (segments) in an object store.

``CapacityStore`` is the whole contract the rest of ``tiering`` relies on;
``open_capacity`` picks an implementation from a URL:

- ``file:///abs/dir``: ``LocalDirStore``, files under a directory (the
  embedded default, and the reference backend for the contract tests);
- ``s3://bucket[/prefix]``: ``tiering._s3.S3Store`` over aiobotocore (AWS S3,
  MinIO, Ceph RGW), imported only when asked for.

Every backend reports failures the same way: a missing name raises
``CapacityNotFound`` from every read method, anything else that cannot be
served raises ``CapacityError``, and a name that could escape the store's
root or prefix raises ``ValueError`` before any I/O.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import stat
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit

from tiering import _pool
from tiering._files import sync_dir, write_all
from tiering.errors import CapacityConflict, CapacityError, CapacityNotFound

# Temporary files of LocalDirStore start with this; no name component may, so
# a temp file is never mistaken for an object (and list can skip them).
TMP_PREFIX = ".tmp-"


@dataclass(slots=True)
class CapacityStats:
    """Request counters, for benchmarks and the admin API.

    One count per logical request; the extra attempts of a retried request
    are counted in ``retries`` only.
    """

    puts: int = 0  # single PUTs, multipart creates, part uploads and completes
    gets: int = 0
    heads: int = 0
    deletes: int = 0  # deletes and multipart aborts
    lists: int = 0  # pages (S3) or directory walks (local)
    bytes_written: int = 0
    bytes_read: int = 0
    retries: int = 0


class CapacityUpload(Protocol):
    """One object being written in pieces (a segment streamed as it is built).

    Calls are sequential: await each ``write`` before the next. Nothing is
    visible under the name until ``complete`` returns.
    """

    async def write(self, data: bytes | memoryview) -> None:
        """Append ``data``. Memory stays bounded: S3 waits for a free upload
        slot when ``concurrency`` parts are already in flight."""
        ...

    async def complete(self) -> int:
        """Make the object visible atomically; return its size."""
        ...

    async def abort(self) -> None:
        """Drop what was written. Idempotent; a no-op after ``complete``."""
        ...


class CapacityStore(Protocol):
    """Immutable named objects in the capacity tier (segments).

    Names are relative paths such as ``segments/00000000000000a1``; see
    ``check_name``. A missing name raises ``CapacityNotFound`` from
    ``get_range``, ``get_tail`` and ``size``; ``delete`` of a missing name
    succeeds.
    """

    stats: CapacityStats

    async def start(self) -> None:
        """Open clients and check the store is usable (S3: the bucket exists)."""
        ...

    async def close(self) -> None: ...

    async def put(self, name: str, data: bytes | memoryview) -> None:
        """Write a whole object atomically: readers see all of it or nothing."""
        ...

    def upload(self, name: str) -> CapacityUpload:
        """Start writing an object in pieces."""
        ...

    async def read_versioned(self, name: str) -> tuple[bytes, str]:
        """A small object whole, and its version tag (S3: the ETag)."""
        ...

    async def put_conditional(self, name: str, data: bytes, expect: str | None) -> str:
        """Write ``name`` only if it does not exist (``expect`` None) or its
        version tag is still ``expect``; return the new tag. Otherwise
        raise ``CapacityConflict``: compare-and-swap, for coordination
        through the store (S3 conditional writes)."""
        ...

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        """Exactly the bytes ``[start, end)``. An empty range returns ``b""``
        without a request (so without checking that the name exists); a range
        past the end of the object raises ``CapacityError``."""
        ...

    async def get_tail(self, name: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes (the whole object if it is smaller) and
        the object's total size: a segment footer in one request."""
        ...

    async def size(self, name: str) -> int: ...

    async def delete(self, name: str) -> None:
        """Remove the object; a missing name is not an error."""
        ...

    async def abort_incomplete(self) -> int:
        """Remove writes a crashed process started and never completed
        (temp files, multipart uploads) under this store's root or prefix;
        return how many. Called at start-up, when this node has none in
        flight: the store must have one writer."""
        ...

    def describe(self) -> str:
        """Where the store is, for logs and messages (never credentials)."""
        ...

    def list(self, prefix: str = "", after: str = "") -> AsyncIterator[tuple[str, int]]:
        """``(name, size)`` of every object whose name starts with ``prefix``
        (and, if given, sorts after the name ``after``), in ascending name
        order (code point order, which is S3's UTF-8 byte order), fetched
        lazily."""
        ...


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe relative object name, else raise ValueError.

    A name is one or more ``/``-separated components; none may be empty,
    ``.`` or ``..``, start with the temp-file prefix, or contain NUL or a
    backslash. Such a name can neither leave a directory root nor be spelled
    two ways (``a//b``, ``a/./b``), so local and S3 stores agree on it.
    """
    if not isinstance(name, str):
        raise TypeError(f"capacity object name must be a string, got {name!r}")
    if not name:
        raise ValueError("capacity object name must not be empty")
    if "\x00" in name or "\\" in name:
        raise ValueError(f"capacity object name {name!r} contains NUL or a backslash")
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(
                f"capacity object name {name!r} has an empty, '.' or '..' path component"
            )
        if part.startswith(TMP_PREFIX):
            raise ValueError(
                f"capacity object name {name!r} uses the reserved prefix {TMP_PREFIX!r}"
            )
    return name


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it may filter a listing, else raise ValueError.

    A prefix is matched as a string, so it cannot escape the store; it is
    only refused when no valid name could start with it."""
    if not isinstance(prefix, str):
        raise TypeError(f"capacity list prefix must be a string, got {prefix!r}")
    if "\x00" in prefix or "\\" in prefix or prefix.startswith("/"):
        raise ValueError(f"capacity list prefix {prefix!r} cannot match any object name")
    return prefix


def check_range(start: int, end: int) -> None:
    if start < 0 or end < start:
        raise ValueError(f"bad byte range [{start}, {end})")


def open_capacity(
    url: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    concurrency: int = 8,
    part_size: int = 8 * 1024 * 1024,
) -> CapacityStore:
    """The store named by ``url`` (not started yet).

    ``file:///abs/dir`` ignores the S3 settings; ``s3://bucket[/prefix]``
    uses them (``endpoint`` for MinIO/Ceph, credentials from the standard
    botocore chain when the keys are None)."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        # RFC 8089: file://host/path, percent-encoded; only the local host.
        path = unquote(parts.path)
        if (
            parts.netloc not in ("", "localhost")
            or not os.path.isabs(path)
            or parts.query
            or parts.fragment
        ):
            raise ValueError(f"capacity URL {url!r}: expected file:///absolute/dir")
        return LocalDirStore(path)
    if parts.scheme == "s3":
        if not parts.netloc or "@" in parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"capacity URL {url!r}: expected s3://bucket or s3://bucket/prefix")
        from tiering._s3 import S3Store

        return S3Store(
            parts.netloc,
            parts.path,
            endpoint=endpoint,
            region=region,
            access_key=access_key,
            secret_key=secret_key,
            concurrency=concurrency,
            part_size=part_size,
        )
    raise ValueError(f"capacity URL {url!r}: expected file:///dir or s3://bucket[/prefix]")


# --------------------------------------------------------------------------
# Local directory


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
            await _pool.run(_make_dirs, self.root)
        except OSError as exc:
            raise CapacityError(
                f"capacity store {self.describe()}: cannot create it: {exc}"
            ) from exc

    async def close(self) -> None:
        return None

    async def abort_incomplete(self) -> int:
        removed = await _pool.run(_remove_temps, self.root)
        self.stats.deletes += removed
        return removed

    async def put(self, name: str, data: bytes | memoryview) -> None:
        path = self.path_of(name)
        self.stats.puts += 1
        with self._errors("put", name):
            await _pool.run(self._put_sync, path, data)
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
            data = await _pool.run(_read_range, path, start, end)
        self.stats.bytes_read += len(data)
        return data

    async def get_tail(self, name: str, length: int) -> tuple[bytes, int]:
        path = self.path_of(name)
        if length < 0:
            raise ValueError(f"tail length must be >= 0, got {length}")
        self.stats.gets += 1
        with self._errors("get", name):
            data, total = await _pool.run(_read_tail, path, length)
        self.stats.bytes_read += len(data)
        return data, total

    async def size(self, name: str) -> int:
        path = self.path_of(name)
        self.stats.heads += 1
        with self._errors("head", name):
            return await _pool.run(_file_size, path)

    async def delete(self, name: str) -> None:
        path = self.path_of(name)
        self.stats.deletes += 1
        with self._errors("delete", name):
            await _pool.run(_remove_file, path)

    async def read_versioned(self, name: str) -> tuple[bytes, str]:
        path = self.path_of(name)
        self.stats.gets += 1
        with self._errors("get", name):
            data = await _pool.run(path.read_bytes)
        self.stats.bytes_read += len(data)
        return data, _tag(data)

    async def put_conditional(self, name: str, data: bytes, expect: str | None) -> str:
        path = self.path_of(name)
        self.stats.puts += 1
        with self._errors("put", name):
            await _pool.run(self._swap_sync, path, data, expect)
        self.stats.bytes_written += len(data)
        return _tag(data)

    def _swap_sync(self, path: Path, data: bytes, expect: str | None) -> None:
        """Compare and swap under an exclusive flock on the store's root
        directory, which every process using this store takes for it."""
        _make_dirs(path.parent)
        lock = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = _tag(path.read_bytes())
            except FileNotFoundError:
                current = None
            if current != expect:
                raise CapacityConflict(
                    f"capacity store {self.describe()}: conditional write of {path.name}: "
                    f"{'it exists' if expect is None else 'it changed' if current else 'it is gone'}",
                    name=str(path), expected=expect, found=current,
                )
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
            entries = await _pool.run(_list_sync, self.root, prefix)
        for entry in entries:
            if entry[0] > after:
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
            await _pool.run(self._write_sync, data)
        self._size += len(data)
        self._store.stats.bytes_written += len(data)

    async def complete(self) -> int:
        self._check_open()
        self._store.stats.puts += 1
        with self._store._errors("upload", self._name):
            await _pool.run(self._complete_sync)
        self._state = "complete"
        return self._size

    async def abort(self) -> None:
        if self._state != "open":
            return
        self._state = "aborted"
        await _pool.run(self._abort_sync)

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


# Blocking helpers: run only through tiering._pool.


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
