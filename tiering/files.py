"""Small blocking file helpers shared by the hot tier, the index and the
local capacity store (callers run them in the pool, except
:func:`disk_space`, a microsecond)."""

from __future__ import annotations

import ctypes
import errno
import os
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


# Direct I/O: the block size a buffer's address, a write's length and its
# offset must be multiples of (4 KiB covers the logical blocks of NVMe and
# of the usual filesystems), and the least a write must hold to go direct.
DIRECT_ALIGN = 4096
DIRECT_MIN = 1024 * 1024
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_direct = {"works": _O_DIRECT != 0}  # False once a filesystem refused it


def write_new_file(path: Path | str, data: bytes | bytearray | memoryview) -> bool:
    """Create (truncate) ``path`` holding ``data``; True when its bytes
    went to the disk by direct I/O (``O_DIRECT``), past the page cache.

    A cache fill of a large piece is written once and read later, if at
    all, by ``sendfile``: copying it into the page cache first was the
    largest single CPU cost of a cold large GET (38 % of the gateway's
    samples, about 0.7 ms a MiB on the fills' thread here), where the
    device takes it by DMA. So a buffer of at least DIRECT_MIN bytes at a
    page-aligned address (an arriving extent's anonymous memory) goes
    direct, all but its last partial block, which is written through the
    page cache after it. Any other buffer (``bytes``: its address is not
    aligned), and any filesystem that refuses direct I/O (EINVAL: then
    never again in this process), takes the page cache as before."""
    view = memoryview(data).cast("B")
    aligned = len(view) - len(view) % DIRECT_ALIGN
    direct = _direct["works"] and aligned >= DIRECT_MIN and _page_aligned(view)
    if direct:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_DIRECT, 0o600)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            _direct["works"] = direct = False
    if not direct:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            write_all(fd, view)
        finally:
            os.close(fd)
        return False
    try:
        done = _write_direct(fd, view[:aligned])
    finally:
        os.close(fd)
    if done < len(view):  # the tail (and whatever a short direct write left) through the page cache
        fd = os.open(path, os.O_WRONLY)
        try:
            while done < len(view):
                done += os.pwrite(fd, view[done:], done)
        finally:
            os.close(fd)
    return True


def _write_direct(fd: int, view: memoryview) -> int:
    """Bytes of ``view`` written from offset 0 by direct I/O; stops at a
    short write that leaves an unaligned offset (direct I/O cannot go on
    from there) or at a refusal of a filesystem that opened the file but
    will not write it so (EINVAL)."""
    done = 0
    while done < len(view):
        try:
            written = os.pwrite(fd, view[done:], done)
        except OSError as exc:
            if exc.errno != errno.EINVAL or done:
                raise
            _direct["works"] = False
            return 0
        done += written
        if written == 0 or done % DIRECT_ALIGN:
            break
    return done


def _page_aligned(view: memoryview) -> bool:
    """Whether a writable buffer starts at a multiple of DIRECT_ALIGN (a
    read-only one, ``bytes``, cannot be asked and is taken as not)."""
    if view.readonly:
        return False
    return ctypes.addressof(ctypes.c_char.from_buffer(view)) % DIRECT_ALIGN == 0


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
