"""Descriptors of hot-tier files kept open between reads, as nginx's
``open_file_cache`` keeps them: a hot read of a small object is then one
``preadv``, not an ``open`` (a path walk), a ``preadv`` and a ``close``.
Measured on the app alone: 44 -> 38.5 us of CPU per hot 64 KiB GET.

Why a kept descriptor always reads the right bytes: a hot-tier file never
changes under its path. Staged files are written once under a new name;
cache files are written under a temporary name and renamed into place, and
a cache name stands for one extent of an immutable segment (or one piece of
one mounted object version, its ETag in the name). A name whose file is
dropped (torn by a crash) and fetched again gets a new file with the same
bytes; a descriptor still on the old one reads short, and is dropped then.
Whether an extent is still cached (not evicted) is asked of the hot tier's
queue after each read, as before.

One thread owns the descriptors: the event loop's (:meth:`bind`). A read
there uses and keeps them; a read from any other thread opens and closes
its own file, as before. Only the owner closes a kept descriptor, so one is
never closed under a read and reused by another open. When the hot tier
unlinks a file from another thread (an eviction, a flush, a delete), it
says so (:meth:`forget`); the owner closes the descriptor in the loop's
next turn, so the file's disk space is given back then, not when the
descriptor would have aged out.

A read that outlasts the loop's turn (a hot batch's members, read run by
run while the tar is sent) holds the descriptors it needs (:meth:`hold`,
:meth:`release`): a held descriptor forgotten, or pushed out by newer
ones, is closed at its last release, not before. A hold is two dict
operations where the duplicate it replaced cost a ``dup``, an ``ioctl``
and a ``close`` (13 % of a hot batch's time in the app alone).
"""

from __future__ import annotations

import asyncio
import os
import resource
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import NamedTuple

# At most this many kept, and at most a quarter of the process's descriptor
# limit: connections and the database need the rest.
MAX_KEPT = 4096


def capacity() -> int:
    """Descriptors to keep: MAX_KEPT, or a quarter of RLIMIT_NOFILE's soft limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_KEPT if soft == resource.RLIM_INFINITY else max(0, min(MAX_KEPT, soft // 4))


class OpenFiles:
    """Up to ``size`` read-only descriptors by path; the oldest opened is
    closed first."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._fds: dict[str, int] = {}
        self._sizes: dict[str, int] = {}  # a kept file's size, once a read or a hold's fstat showed it
        self._owner: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Forgotten by other threads, closed by the owner: (path, the bytes
        # of an unlinked file whose room comes back only then).
        self._gone: deque[tuple[str, int]] = deque()
        self._drain_due = False
        self._held: dict[int, int] = {}  # descriptor -> holds not yet released
        self._doomed: set[int] = set()  # held descriptors to close at their last release

    def __len__(self) -> int:
        return len(self._fds)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make ``loop``'s thread (the caller's) the owner."""
        self._owner = threading.get_ident()
        self._loop = loop

    def read(self, path: str, size: int, exact: bool, offset: int = 0) -> bytearray | None:
        """``size`` bytes from ``offset`` of the file at ``path`` if the page
        cache holds them (``RWF_NOWAIT``), else None; None too when the file
        is gone or, ``exact``, is not ``size`` bytes long (read for one byte
        more). :func:`tiering.hot.open_files.read_file_now`, with the descriptor kept."""
        if threading.get_ident() != self._owner or not self._size:
            return read_file_now(path, size, exact, offset)
        if self._gone:
            self._drain()
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                return None
            self._keep(path, fd)
        try:
            data = _pread_now(fd, size, exact, offset)
        except OSError:
            data = None
        if data is None:
            # Not all in memory (the pool path reads it), torn, or no
            # RWF_NOWAIT here: opened again next time, in case it was replaced.
            self._close(path)
        elif exact:
            self._sizes[path] = size
        return data

    def hold(self, path: str, size: int | None = None) -> int:
        """On the owner's thread: the kept descriptor of the file at
        ``path`` (opened and kept if it is not yet), open until
        :meth:`release` even if the file is forgotten meanwhile. With
        ``size``, the file must be that long (:func:`open_sized`), checked
        once per kept descriptor: a kept file does not change. Raises
        OSError as ``os.open`` does, TornFile for another size (the file
        is let go)."""
        if self._gone:
            self._drain()
        fd = self._fds.get(path)
        if fd is None:
            fd = os.open(path, os.O_RDONLY)
            if self._size:
                self._keep(path, fd)
            else:  # nothing is kept: closed at its release
                self._doomed.add(fd)
        if size is not None and self._sizes.get(path) != size:
            if os.fstat(fd).st_size != size:
                if fd in self._doomed:  # not kept, not held: ours alone
                    self._doomed.discard(fd)
                    os.close(fd)
                else:
                    self._close(path)
                raise TornFile(path)
            if path in self._fds:
                self._sizes[path] = size
        self._held[fd] = self._held.get(fd, 0) + 1
        return fd

    def release(self, fd: int) -> None:
        """On the owner's thread: one :meth:`hold` of ``fd`` is over."""
        left = self._held[fd] - 1
        if left:
            self._held[fd] = left
            return
        del self._held[fd]
        if fd in self._doomed:
            self._doomed.discard(fd)
            os.close(fd)

    def forget(self, path: str, size: int = 0) -> None:
        """The file at ``path`` was unlinked (``size`` bytes, which come back
        to the filesystem with its last descriptor) or renamed, or found
        torn: close its descriptor (now on the owner's thread, else in the
        owner loop's next turn)."""
        if threading.get_ident() == self._owner:
            self._close(path)
            return
        if self._loop is None:
            return  # never bound: nothing is kept
        # A membership test from another thread may be a moment stale: at
        # worst a few bytes are counted as coming back twice, or not at all.
        self._gone.append((path, size if path in self._fds else 0))
        if not self._drain_due:
            self._drain_due = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nothing reads any more
                pass

    def closing(self) -> int:
        """Bytes of unlinked files whose kept descriptors the owner has yet
        to close: free on the filesystem in a moment (tiering/hot/space.py)."""
        return sum(size for _, size in list(self._gone))

    def close(self) -> None:
        """Close every kept descriptor (the owner's loop has stopped
        reading); a held one at its release."""
        self._gone.clear()
        for path in list(self._fds):
            self._close(path)

    def _keep(self, path: str, fd: int) -> None:
        if len(self._fds) >= self._size:
            self._close(next(iter(self._fds)))  # the oldest
        self._fds[path] = fd

    def _close(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            self._sizes.pop(path, None)
            if fd in self._held:
                self._doomed.add(fd)
            else:
                os.close(fd)

    def _drain(self) -> None:
        self._drain_due = False
        gone = self._gone
        while gone:
            self._close(gone.popleft()[0])


class TornFile(OSError):
    """A hot-tier file of another size than its record says (torn by a
    crash): read as a GET reads it, which drops it."""


def open_sized(path: str, size: int | None = None) -> int:
    """A descriptor of the caller's own on the file at ``path``, which must
    be ``size`` bytes long if given (else TornFile, nothing left open)."""
    fd = os.open(path, os.O_RDONLY)
    if size is not None and os.fstat(fd).st_size != size:
        os.close(fd)
        raise TornFile(path)
    return fd


def read_file_now(path: str, size: int, exact: bool, offset: int = 0) -> bytearray | None:
    """``size`` bytes from ``offset`` of the file at ``path`` if the page cache
    holds them (``RWF_NOWAIT``: fails rather than wait for the disk, so this
    may run on the event loop), else None; None too when the file is gone,
    or, ``exact``, is not ``size`` bytes long (read for one byte more: one
    of another size, torn or replaced, reads short or long, with no fstat)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _pread_now(fd, size, exact, offset)
    except OSError:  # EOPNOTSUPP: no RWF_NOWAIT here
        return None
    finally:
        os.close(fd)


def _pread_now(fd: int, size: int, exact: bool, offset: int = 0) -> bytearray | None:
    """``size`` bytes from ``offset`` of ``fd``'s file, read with ``RWF_NOWAIT``
    (``exact``: one byte more, which must not come); None when they are not
    all in memory or the size is off."""
    data = bytearray(size + 1 if exact else size)
    if size or exact:
        try:
            if os.preadv(fd, (data,), offset, os.RWF_NOWAIT) != size:
                return None  # short, long, or partly in memory
        except BlockingIOError:  # not in memory
            return None
    del data[size:]
    return data


class Opened(NamedTuple):
    """A descriptor of the caller's own on a hot-tier file, and where a
    piece's bytes start in it (0 but in a log: ``tiering.hot.logs``)."""

    fd: int
    offset: int


def close_unused(task: asyncio.Task[object]) -> None:
    """Done-callback of a read-ahead the response no longer needs: close the
    descriptor it opened, if it opened one."""
    if not task.cancelled() and task.exception() is None and isinstance(task.result(), Opened):
        os.close(task.result().fd)  # type: ignore[attr-defined]


def read_files_now(
    files: Iterable[tuple[str, int, bool, int]],
    read_file: Callable[[str, int, bool, int], bytearray | None] = read_file_now,
) -> bytes | bytearray | None:
    """The bytes of ``files``, each (path, size, exact, offset) as
    ``read_file`` (:func:`read_file_now`, or ``OpenFiles.read``) reads it,
    in order, if the page cache holds them all; else None."""
    read = []
    for path, size, exact, offset in files:
        data = read_file(path, size, exact, offset)
        if data is None:
            return None
        read.append(data)
    return read[0] if len(read) == 1 else b"".join(read)
