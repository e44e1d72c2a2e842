"""Small blocking file helpers shared by the hot tier, the index and the
local capacity store (callers run them in the pool, except
:func:`disk_space`, a microsecond)."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence
from pathlib import Path

# CPython's constructor of a bytearray, which leaves its bytes as malloc
# gave them when it is given no source: bytearray(n) writes n zeros first.
_new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
_new_bytearray.restype = ctypes.py_object
_new_bytearray.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)


def unfilled(size: int) -> bytearray:
    """A bytearray of ``size`` bytes not set to anything: for a buffer that
    is written whole before any byte of it is used (a hot batch's run of
    members). What is in it is whatever the allocator left: every byte must
    be written before the buffer leaves the process. A run of about 1 MiB
    costs 11 us of memset as bytearray(n), zeros that only go to memory to
    be overwritten (16.8-16.9 -> 15.8-16.3 us an object for the app alone
    in a hot batch; for a single 64 KiB read, no difference)."""
    return _new_bytearray(None, size)  # type: ignore[no-any-return]


def write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until every byte is written (it may write less)."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


# Buffers one pwritev takes (the kernel refuses more than IOV_MAX).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024


def pwritev_all(fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int) -> None:
    """os.pwritev of ``buffers``, one after another, at ``offset``, until
    every byte is written (it may write less); one system call for them
    all where it can."""
    views = [memoryview(buffer).cast("B") for buffer in buffers if len(buffer)]
    first = 0  # of the views not wholly written yet
    while first < len(views):
        written = os.pwritev(fd, views[first:first + _IOV_MAX], offset)
        if not written:
            raise OSError(errno.EIO, "pwritev wrote nothing")
        offset += written
        while written and written >= len(views[first]):
            written -= len(views[first])
            first += 1
        if written:
            views[first] = views[first][written:]


def sync_dir(path: Path) -> None:
    """fsync a directory, so the entries created or renamed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_FALLOC_FL_KEEP_SIZE = 1  # linux/falloc.h


def allocate_ahead(fd: int, offset: int, length: int) -> None:
    """Give the file blocks for ``length`` bytes from ``offset`` without
    changing its size (fallocate(2) with FALLOC_FL_KEEP_SIZE): appends
    that land there need no new blocks from the filesystem. OSError as
    fallocate fails (EOPNOTSUPP where the filesystem cannot, ENOSPC)."""
    fallocate = _libc.fallocate
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong)
    if fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def disk_space(path: Path | str) -> tuple[int, int]:
    """(free, size) in bytes of the filesystem holding ``path``: free as an
    unprivileged process may use it (``f_bavail``: ext4's blocks reserved
    for root do not count), size as ``df`` shows it. One ``statvfs``,
    about 1.4 us: cheap enough for every write to ask."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def no_space(exc: BaseException) -> bool:
    """Whether ``exc`` is the filesystem saying it has no room left: ENOSPC,
    or EDQUOT (a quota counts as a full disk for whoever hits it)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
