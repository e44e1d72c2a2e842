"""Descriptors kept open for hot reads on the event loop (tiering/hot/open_files.py):
kept by the loop's thread only, bounded, closed when the hot tier unlinks
their file (from any thread), and never trusted over a file that reads
short. No network."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from tiering.hot.open_files import OpenFiles, TornFile, open_sized
from tiering.hot.tier import HotTier
from tiering.model.digests import Digests


def _open_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _bound(size: int) -> OpenFiles:
    """Descriptors kept by the running loop's thread (called on the loop)."""
    files = OpenFiles(size)
    files.bind(asyncio.get_running_loop())
    return files


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_the_owner_keeps_a_descriptor_and_closes_it_when_told(tmp_path: Path) -> None:
    async def main() -> None:
        files = _bound(8)
        path = _write(tmp_path / "a", b"0123456789")
        assert files.read(path, 10, exact=True) == b"0123456789"
        assert len(files) == 1
        os.unlink(path)  # a kept descriptor still reads the file it opened
        assert files.read(path, 10, exact=True) == b"0123456789"
        files.forget(path)  # on the owner's thread: closed at once
        assert len(files) == 0
        assert files.read(path, 10, exact=True) is None  # gone for good

    asyncio.run(main())


def test_other_threads_open_their_own_and_keep_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        files = _bound(8)
        path = _write(tmp_path / "a", b"abc")
        assert await asyncio.to_thread(files.read, path, 3, True) == b"abc"
        assert len(files) == 0

    asyncio.run(main())


def test_unbound_reads_keep_nothing(tmp_path: Path) -> None:
    files = OpenFiles(8)
    path = _write(tmp_path / "a", b"abc")
    before = _open_count()
    assert files.read(path, 3, exact=True) == b"abc"
    assert len(files) == 0 and _open_count() == before


def test_at_most_size_are_kept_the_oldest_closed_first(tmp_path: Path) -> None:
    async def main() -> None:
        files = _bound(2)
        paths = [_write(tmp_path / name, name.encode()) for name in "abc"]
        before = _open_count()
        for path in paths:
            assert files.read(path, 1, exact=True) is not None
        assert len(files) == 2 and _open_count() == before + 2
        os.unlink(paths[0])  # the oldest was closed: nothing holds it any more
        assert files.read(paths[0], 1, exact=True) is None
        assert files.read(paths[2], 1, exact=True) == b"c"
        files.close()
        assert len(files) == 0 and _open_count() == before

    asyncio.run(main())


def test_a_file_that_reads_short_is_opened_again(tmp_path: Path) -> None:
    async def main() -> None:
        files = _bound(8)
        path = _write(tmp_path / "a", b"0123456789")
        assert files.read(path, 10, exact=True) is not None
        os.truncate(path, 5)  # torn in place
        assert files.read(path, 10, exact=True) is None
        assert len(files) == 0
        os.unlink(path)
        _write(tmp_path / "a", b"0123456789")  # fetched again: a new file
        assert files.read(path, 10, exact=True) == b"0123456789"

    asyncio.run(main())


def test_a_held_descriptor_outlives_forget_until_its_last_release(tmp_path: Path) -> None:
    async def main() -> None:
        files = _bound(8)
        path = _write(tmp_path / "a", b"abc")
        before = _open_count()
        fd = files.hold(path)
        assert files.hold(path) == fd  # the kept one, held twice
        files.forget(path)  # unlinked meanwhile: no longer kept, still held
        assert len(files) == 0
        assert os.pread(fd, 3, 0) == b"abc"
        files.release(fd)
        assert os.pread(fd, 3, 0) == b"abc"  # one hold left
        files.release(fd)
        assert _open_count() == before  # closed at the last release

    asyncio.run(main())


def test_a_held_descriptor_pushed_out_or_closed_waits_for_its_release(tmp_path: Path) -> None:
    async def main() -> None:
        files = _bound(1)
        a, b = _write(tmp_path / "a", b"a"), _write(tmp_path / "b", b"b")
        before = _open_count()
        fd = files.hold(a)
        assert files.read(b, 1, exact=True) == b"b"  # keeps b in a's place
        assert len(files) == 1
        assert os.pread(fd, 1, 0) == b"a"
        files.release(fd)
        assert _open_count() == before + 1  # b's, kept
        fd = files.hold(b)
        files.close()  # the loop has stopped: kept ones closed, a held one at its release
        assert len(files) == 0 and os.pread(fd, 1, 0) == b"b"
        files.release(fd)
        assert _open_count() == before

    asyncio.run(main())


def test_holds_keep_nothing_when_nothing_is_to_be_kept(tmp_path: Path) -> None:
    async def main() -> None:
        files = _bound(0)
        path = _write(tmp_path / "a", b"abc")
        before = _open_count()
        fd = files.hold(path)
        assert len(files) == 0 and os.pread(fd, 3, 0) == b"abc"
        files.release(fd)
        assert _open_count() == before

    asyncio.run(main())


def test_an_eviction_in_another_thread_closes_the_kept_descriptor(tmp_path: Path) -> None:
    """The evicted file's disk space comes back in the loop's next turn, not
    when its descriptor would have aged out; and the evicted extent is not
    served from the descriptor meanwhile."""

    async def main() -> None:
        hot = HotTier(tmp_path / "hot", budget=1 << 20)
        hot.open_files.bind(asyncio.get_running_loop())
        assert hot.fill("seg-1-0", b"x" * 1000)
        assert hot.read_now([(None, "seg-1-0", 1000)]) == b"x" * 1000
        assert len(hot.open_files) == 1
        evicted = threading.Event()

        def evict() -> None:
            assert hot.evict(0) == 1000
            evicted.set()

        await asyncio.to_thread(evict)
        assert evicted.is_set()
        assert hot.read_now([(None, "seg-1-0", 1000)]) is None  # no longer cached
        await asyncio.sleep(0)
        assert len(hot.open_files) == 0

    asyncio.run(main())


def test_a_staged_file_removed_or_flushed_is_let_go(tmp_path: Path) -> None:
    async def main() -> None:
        hot = HotTier(tmp_path / "hot", budget=1 << 20)
        hot.open_files.bind(asyncio.get_running_loop())
        for name in ("s1", "s2"):
            assert hot.reserve(100)
            writer = hot.writer(part_size=1 << 20, digests=Digests(), reserved=100)
            writer.write(b"y" * 100)
            (chunk,) = writer.finish()
            assert hot.read_now([(chunk.file_id, None, 100)]) == b"y" * 100
            if name == "s1":
                await asyncio.to_thread(hot.remove, [chunk])
            else:
                await asyncio.to_thread(hot.adopt, chunk.file_id, "seg-2-0")
            await asyncio.sleep(0)
            assert len(hot.open_files) == 0

    asyncio.run(main())


def test_a_kept_files_size_is_checked_once_read_or_held(tmp_path: Path) -> None:
    """A kept file does not change: its size, once a read or a hold's fstat
    showed it, is not looked at again until the file is let go; a file of
    another size is refused (TornFile) and nothing of it stays open."""

    async def main() -> None:
        files = _bound(8)
        a, b = _write(tmp_path / "a", b"0123456789"), _write(tmp_path / "b", b"abc")
        torn = _write(tmp_path / "torn", b"abc")
        before = _open_count()
        assert files.read(a, 10, exact=True) is not None  # shown by a read
        os.truncate(a, 4)  # not looked at again
        files.release(files.hold(a, 10))
        files.release(files.hold(b, 3))  # shown by the hold's fstat
        os.truncate(b, 1)
        files.release(files.hold(b, 3))
        with pytest.raises(TornFile):
            files.hold(torn, 99)
        assert len(files) == 2 and _open_count() == before + 2
        files.forget(a)  # let go: opened and checked anew
        with pytest.raises(TornFile):
            files.hold(a, 10)
        assert len(files) == 1 and _open_count() == before + 1
        unkept = _bound(0)
        with pytest.raises(TornFile):
            unkept.hold(torn, 99)
        assert _open_count() == before + 1

    asyncio.run(main())


def test_open_sized_opens_a_descriptor_of_ones_own_or_nothing(tmp_path: Path) -> None:
    path = _write(tmp_path / "a", b"abc")
    before = _open_count()
    fd = open_sized(path, 3)
    assert os.pread(fd, 3, 0) == b"abc"
    os.close(fd)
    os.close(open_sized(path))
    with pytest.raises(TornFile):
        open_sized(path, 4)
    assert _open_count() == before
