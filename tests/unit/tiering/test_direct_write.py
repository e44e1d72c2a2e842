"""Cache files of large arrived pieces written by direct I/O
(``tiering.files.write_new_file``): the bytes are the same whichever way
they went, and only a large, page-aligned buffer goes direct."""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest

from tiering import files
from tiering.files import DIRECT_ALIGN, DIRECT_MIN, write_new_file

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def _direct_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(files._direct, "works", files._O_DIRECT != 0)


def _arrived(size: int) -> mmap.mmap:
    """An arriving extent's buffer (anonymous memory, page-aligned), filled."""
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf[:] = os.urandom(size)
    return buf


def _direct_flag(fd: int) -> bool:
    with open(f"/proc/self/fdinfo/{fd}") as info:
        flags = next(line for line in info if line.startswith("flags:"))
    return bool(int(flags.split()[1], 8) & files._O_DIRECT)


def _direct_supported(path: Path) -> bool:
    if not files._O_DIRECT:
        return False
    try:
        os.close(os.open(path / "probe", os.O_WRONLY | os.O_CREAT | files._O_DIRECT, 0o600))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("size", [8 * MiB, 8 * MiB + 100, DIRECT_MIN + DIRECT_ALIGN - 1])
def test_a_large_arrived_piece_goes_direct_and_reads_back_whole(tmp_path: Path, size: int) -> None:
    if not _direct_supported(tmp_path):
        pytest.skip("this filesystem takes no direct I/O")
    data = _arrived(size)
    opened: list[bool] = []
    real_pwrite = os.pwrite

    def pwrite(fd: int, view: memoryview, offset: int) -> int:
        opened.append(_direct_flag(fd))
        return real_pwrite(fd, view, offset)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(files.os, "pwrite", pwrite)
        assert write_new_file(tmp_path / "piece", data)
    assert opened[0] is True  # the aligned body went direct
    assert opened[-1] is (size % DIRECT_ALIGN == 0)  # a partial last block through the page cache
    assert (tmp_path / "piece").read_bytes() == bytes(data)


def test_bytes_and_small_buffers_take_the_page_cache(tmp_path: Path) -> None:
    big = os.urandom(4 * MiB)  # bytes: read-only, its address not asked
    assert not write_new_file(tmp_path / "bytes", big)
    assert (tmp_path / "bytes").read_bytes() == big
    small = _arrived(DIRECT_MIN // 2)
    assert not write_new_file(tmp_path / "small", small)
    assert (tmp_path / "small").read_bytes() == bytes(small)
    unaligned = memoryview(_arrived(4 * MiB))[1:]  # writable, but not at a page's start
    assert not write_new_file(tmp_path / "unaligned", unaligned)
    assert (tmp_path / "unaligned").read_bytes() == bytes(unaligned)


def test_a_filesystem_that_refuses_direct_io_gets_the_page_cache_from_then_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_open = os.open
    refused = []

    def no_direct(path: str | Path, flags: int, mode: int = 0o777) -> int:
        if flags & files._O_DIRECT:
            refused.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(files.os, "open", no_direct)
    data = _arrived(4 * MiB)
    assert not write_new_file(tmp_path / "a", data)
    assert not write_new_file(tmp_path / "b", data)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes() == bytes(data)
    assert len(refused) == (1 if files._O_DIRECT else 0)  # asked once, never again
