"""A full disk, below the HTTP edge: the index's room (its reserve, the room
ahead of its log, refusals before the log, reopening after a write the disk
failed, opening read-only) and the hot tier's free-space floor (eviction,
refused reservations, skipped fills, the answer's 503 or 507).

Free space is faked (the module's ``disk_space``) where the point is the
arithmetic; the index's own failures need the real thing, a small tmpfs
(skipped where mounting is not permitted)."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import smallfs
from tiering.capacity import LocalDirStore
from tiering.errors import InsufficientStorage, SlowDown
from tiering.hot.tier import HotTier
from tiering.index import room as room_module
from tiering.index.db import Index
from tiering.index.room import MARGIN, IndexRoom
from tiering.meta import BucketInfo, MountedObject
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node
from tiering.settings import TierSettings

MiB = 1024 * 1024


class FakeDisk:
    """statvfs for the code under test: ``free`` bytes free of 1 GiB."""

    def __init__(self, free: int) -> None:
        self.free = free

    def __call__(self, path: object) -> tuple[int, int]:
        return self.free, 1024 * MiB


# -- the index's room -----------------------------------------------------------


def _index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free: int, reserve: int = 0) -> tuple[Index, FakeDisk]:
    disk = FakeDisk(free)
    monkeypatch.setattr(room_module, "disk_space", disk)
    room = IndexRoom(tmp_path / "index", reserve)
    index = Index(tmp_path / "index", room=room)
    room.log_ahead = lambda: 0  # type: ignore[method-assign]  # no room allocated ahead of the log
    return index, disk


def test_a_write_without_room_is_refused_before_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index, disk = _index(tmp_path, monkeypatch, free=1 << 30)
    index.create_bucket(BucketInfo("kept", 1))
    disk.free = 100 * 1024
    with pytest.raises(InsufficientStorage) as refused:  # nothing the hot tier could free
        index.create_bucket(BucketInfo("b1", 1))
    assert refused.value.cause == "index"
    index.room.can_free = lambda: True
    with pytest.raises(SlowDown):  # a flush or an eviction will make room
        index.create_bucket(BucketInfo("b1", 1))
    assert index.room.refusals == 2
    assert index.writable and index.get_bucket("kept") is not None  # reads go on
    disk.free = 1 << 30
    assert index.create_bucket(BucketInfo("b1", 1))
    index.close()
    assert [b.name for b in Index(tmp_path / "index").list_buckets()] == ["b1", "kept"]


def test_the_reserve_goes_before_a_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index, disk = _index(tmp_path, monkeypatch, free=1 << 30, reserve=8 * MiB)
    assert index.room.restore(floor=0) and index.room.held
    assert (tmp_path / "index" / room_module.RESERVE_NAME).stat().st_blocks * 512 >= 8 * MiB
    disk.free = MARGIN - 1  # short of the margin: the reserve is released, the write goes on
    assert index.create_bucket(BucketInfo("b", 1))
    assert not index.room.held and index.room.releases == 1
    assert not (tmp_path / "index" / room_module.RESERVE_NAME).exists()
    assert not index.room.restore(floor=MARGIN)  # no room for it above the floor yet
    disk.free = 1 << 30
    assert index.room.restore(floor=MARGIN) and index.room.held
    index.close()


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Path]:
    with smallfs.tmpfs(tmp_path / "fs", 32 * MiB) as root:
        yield root


def test_a_log_with_room_ahead_writes_on_a_full_disk(small: Path) -> None:
    room = IndexRoom(small / "index", 4 * MiB)
    index = Index(small / "index", room=room)
    assert room.restore(floor=0)
    smallfs.fill(small)
    assert room.free() == 0 and room.log_ahead() >= MiB
    for i in range(1000):  # a flush's commits, tombstones: they make room
        index.create_bucket(BucketInfo(f"b{i:04d}", 1))
    assert room.held and room.refusals == 0
    index.close()  # the memory table cannot be written out: a warning, not an error
    smallfs.empty(small)
    assert len(Index(small / "index").list_buckets()) == 1000


def _no_fallocate(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.EOPNOTSUPP, "not here")


def test_a_write_the_disk_fails_reopens_the_index(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process took the room between the check and the append:
    RocksDB's log writer fails for good, so the index opens again (the
    reserve's room) and refuses that one write; nothing else is lost."""
    monkeypatch.setattr(room_module, "allocate_ahead", _no_fallocate)  # no room ahead of the log
    room = IndexRoom(small / "index", 4 * MiB)
    room.can_free = lambda: True
    index = Index(small / "index", room=room)
    assert room.restore(floor=0)
    index.create_bucket(BucketInfo("before", 1))
    smallfs.fill(small)
    room.before_write = lambda recent=False: None  # type: ignore[method-assign]  # the check passed: the race
    with pytest.raises(SlowDown):
        index.create_bucket(BucketInfo("x" * 6000, 1))  # past the log's last page
    assert not room.held and index.writable  # the reserve's room opened it again
    assert index.get_bucket("before") is not None
    assert index.create_bucket(BucketInfo("after", 1))
    index.close()
    smallfs.empty(small)
    assert [b.name for b in Index(small / "index").list_buckets()] == ["after", "before"]


def test_an_index_opens_on_a_full_disk(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No room ahead of the log either: its blocks would make room for an open too.
    monkeypatch.setattr(room_module, "allocate_ahead", _no_fallocate)
    index = Index(small / "index", room=IndexRoom(small / "index", 4 * MiB))
    index.room.restore(floor=0)
    for i in range(200):
        index.create_bucket(BucketInfo(f"b{i:03d}", 1))
    # Killed, not closed: the next open replays the log, which needs room.
    del index
    smallfs.fill(small)
    with_reserve = Index(small / "index", room=IndexRoom(small / "index", 4 * MiB))
    assert with_reserve.writable and len(with_reserve.list_buckets()) == 200
    with_reserve.close()
    smallfs.fill(small, name="more")  # the reserve's room, gone too
    bare = Index(small / "index")
    assert not bare.writable and len(bare.list_buckets()) == 200  # read-only: reads go on
    with pytest.raises(InsufficientStorage):
        bare.create_bucket(BucketInfo("new", 1))
    smallfs.empty(small, "more")
    smallfs.empty(small)
    assert bare.reopen() and bare.create_bucket(BucketInfo("new", 1))
    bare.close()


# -- the hot tier's floor -------------------------------------------------------


@pytest.fixture
def tight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[HotTier, list[int]]:
    """A hot tier with a budget far over a 100 MiB disk and a 20 MiB floor;
    free space is what the tier's files and ``other[0]`` leave."""
    other = [0]
    hot = HotTier(tmp_path / "hot", budget=1024 * MiB, floor=20 * MiB)
    monkeypatch.setattr("tiering.hot.space.disk_space",
                        lambda path: (100 * MiB - hot.staged - hot.cached - other[0], 100 * MiB))
    return hot, other


def test_the_floor_evicts_clean_cache_before_the_budget_would(tight: tuple[HotTier, list[int]]) -> None:
    hot, _ = tight
    for i in range(100):
        assert hot.fill(f"x-{i}", b"c" * MiB)
    free = hot.disk.free()
    assert hot.evicted > 0 and hot.cached <= 80 * MiB  # 1 GiB's watermarks never came near
    assert free >= 20 * MiB  # never below the floor


def test_writes_are_taken_above_the_floor_only(tight: tuple[HotTier, list[int]]) -> None:
    hot, other = tight
    other[0] = 70 * MiB  # another tenant: 10 MiB above the floor left
    assert hot.reserve(8 * MiB)
    assert not hot.reserve(4 * MiB)  # promised bytes count before they are written
    assert hot.shortage(4 * MiB) == "floor"
    hot.release(8 * MiB)
    refused = hot.disk.refuse("floor", hot.can_free())
    assert isinstance(refused, InsufficientStorage)  # nothing of the gateway's to free
    assert hot.fill("c", b"c" * MiB) and hot.can_free()  # 9 MiB left above the floor
    assert isinstance(hot.disk.refuse("floor", hot.can_free()), SlowDown)
    assert hot.disk.refusals["floor"] == 2


def test_a_fill_without_room_is_skipped(tight: tuple[HotTier, list[int]]) -> None:
    hot, other = tight
    other[0] = 79 * MiB
    assert hot.fill("pinned", b"p" * MiB, pin=True)  # unevictable
    assert not hot.fill("next", b"n" * MiB)
    assert hot.disk.fills_skipped == 1 and not hot.is_cached("next")
    assert not any((hot.cache_root).rglob("next*"))


def test_a_small_put_evicts_for_the_floor_or_gets_507(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = [0]
    node = Node(tmp_path / "data", TierSettings(flush_delay=3600.0, hot_size=1 << 30, free_floor=20 * MiB),
                LocalDirStore(tmp_path / "capacity"))
    hot = node.hot
    monkeypatch.setattr("tiering.hot.space.disk_space",
                        lambda path: (100 * MiB - hot.staged - hot.cached - other[0], 100 * MiB))
    loop = asyncio.new_event_loop()

    async def put(key: str, size: int) -> None:
        async def body():
            yield b"x" * size
        await node.objects.put("bkt", key, body(), NewObject(), Integrity(expected_size=size))

    try:
        loop.run_until_complete(node.start())
        loop.run_until_complete(node.objects.create_bucket("bkt"))
        for i in range(8):
            assert hot.fill(f"c{i}", b"c" * 5 * MiB)
        other[0] = 40 * MiB  # the cache alone keeps free space under the floor
        loop.run_until_complete(put("evicts", MiB))  # taken: clean cache made room
        assert hot.disk.free() >= 20 * MiB and hot.evicted > 0
        loop.run_until_complete(node.tiers.flush())
        hot.evict(0)
        other[0] = 100 * MiB  # then nothing but other data
        with pytest.raises(InsufficientStorage):
            loop.run_until_complete(put("refused", MiB))
        assert hot.disk.refusals["floor"] == 1
    finally:
        loop.run_until_complete(node.close())
        loop.close()


def test_a_staged_write_the_disk_refuses_is_a_refusal(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC from a staged file's write (another process took the room
    after the reservation): no 500 but a refusal counted as "disk" (503
    while the tier can make room, else 507), and nothing left behind."""

    def full(fd: int, data: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    async def put(key: str) -> None:
        async def body():
            yield b"x" * 1000
        await node.objects.put("bkt", key, body(), NewObject(), Integrity(expected_size=1000))

    monkeypatch.setattr("tiering.hot.staged.write_all", full)
    with pytest.raises(InsufficientStorage):  # nothing of the gateway's to free
        node.run(put("a"))
    assert node.hot.fill("cached", b"c" * 1000)
    with pytest.raises(SlowDown):  # clean cache the keeper can evict
        node.run(put("b"))
    assert node.hot.disk.refusals["disk"] == 2
    assert node.hot.staged == 0 and node.hot.reserved == 0
    assert not [p for p in node.hot.root.glob("??/*")]


def test_the_keeper_evicts_for_the_floor_and_makes_the_reserve_again(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Between writes: another tenant fills the disk, the keeper evicts clean
    cache back to the floor and its slack, and makes the index's reserve
    again (which outranks cache) once it was given to the index."""
    other = [0]
    node = Node(tmp_path / "data", TierSettings(flush_delay=3600.0, hot_size=1 << 30, free_floor=20 * MiB,
                                                index_reserve=4 * MiB), LocalDirStore(tmp_path / "capacity"))
    hot, room = node.hot, node.index.room

    def space(path: object) -> tuple[int, int]:
        return 100 * MiB - hot.staged - hot.cached - (room.size if room.held else 0) - other[0], 100 * MiB

    monkeypatch.setattr("tiering.hot.space.disk_space", space)
    monkeypatch.setattr(room_module, "disk_space", space)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(node.start())
        loop.run_until_complete(node.tiers.space.keep())
        assert room.held  # made at the first pass: there was room
        for i in range(10):
            assert hot.fill(f"c{i}", b"c" * 5 * MiB)
        other[0] = 40 * MiB  # free: 100 - 50 - 4 - 40 = 6 MiB
        loop.run_until_complete(node.tiers.space.keep())
        assert hot.disk.free() >= 25 * MiB  # the floor and a quarter
        room.release()
        other[0] += hot.disk.free() - 21 * MiB  # just over the floor: no room for the reserve
        loop.run_until_complete(node.tiers.space.keep())
        assert room.held and hot.disk.free() >= 20 * MiB  # cache made its room
        status = node.tiers.space.status()
        assert status.reserve_held and status.floor == 20 * MiB and status.warning
    finally:
        loop.run_until_complete(node.close())
        loop.close()


class CountingDisk(FakeDisk):
    def __init__(self, free: int) -> None:
        super().__init__(free)
        self.readings = 0

    def __call__(self, path: object) -> tuple[int, int]:
        self.readings += 1
        return super().__call__(path)


def test_records_written_behind_reads_take_a_recent_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mounted object's record, written behind the read that learnt it,
    is checked against a free-space reading up to RECENT old (no statvfs
    of its own) while that reading found twice the margin; any other
    write, and one behind a read once the reading is old or low, reads
    the disk again."""
    disk = CountingDisk(1 << 30)
    monkeypatch.setattr(room_module, "disk_space", disk)
    clock = [1000.0]
    monkeypatch.setattr(room_module.time, "monotonic", lambda: clock[0])
    room = IndexRoom(tmp_path / "index", 0)
    index = Index(tmp_path / "index", room=room)
    room.log_ahead = lambda: 0  # type: ignore[method-assign]
    index.create_bucket(BucketInfo("b", 1))  # a synced write: a reading of its own
    before = disk.readings
    for i in range(5):
        index.put_mounted("m", MountedObject(key=f"k{i}", size=1, etag="a", last_modified_ms=1, validated_ms=1))
    assert disk.readings == before  # answered by the bucket's reading
    clock[0] += 2 * room_module.RECENT
    index.put_mounted("m", MountedObject(key="late", size=1, etag="a", last_modified_ms=1, validated_ms=1))
    assert disk.readings == before + 1  # the reading was too old
    disk.free = 2 * MARGIN - 1
    index.create_bucket(BucketInfo("c", 1))
    low = disk.readings
    index.put_mounted("m", MountedObject(key="low", size=1, etag="a", last_modified_ms=1, validated_ms=1))
    assert disk.readings == low + 1  # under twice the margin: read again
    disk.free = 100 * 1024
    index.put_mounted("m", MountedObject(key="full", size=1, etag="a", last_modified_ms=1, validated_ms=1))
    assert index.get_mounted("m", "full") is None  # refused, as before (a record is only lost to the cache)
    index.close()
