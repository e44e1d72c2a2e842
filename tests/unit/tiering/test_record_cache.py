"""The record cache never serves a record older than the last acknowledged write,
and a hot read answered on the event loop falls back to the pool when it must."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from tiering.capacity import LocalDirStore
from tiering.hot.tier import HotTier
from tiering.index.db import Index
from tiering.index.keys import nkey
from tiering.index.record_cache import RecordCache
from tiering.meta import BucketInfo, Chunk, MountedObject, ObjectMeta
from tiering.model.conditions import WriteConditions
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node
from tiering.reads.plan import Read
from tiering.settings import TierSettings


def _meta(key: str, etag: str, bucket: str = "bkt") -> ObjectMeta:
    return ObjectMeta(bucket, key, 1, etag, 1_700_000_000_000, 0, chunks=(Chunk(1, "f" + etag),))


@pytest.fixture
def index(tmp_path: Path):  # type: ignore[no-untyped-def]
    idx = Index(tmp_path / "index", cached_records=100)
    idx.create_bucket(BucketInfo("bkt", 1))
    yield idx
    idx.close()


def test_a_write_replaces_or_removes_the_cached_record(index: Index) -> None:
    index.put_object(_meta("k", "a" * 32))
    assert index.get_object("bkt", "k").etag == "a" * 32  # type: ignore[union-attr]
    assert index.cached_object("bkt", "k").etag == "a" * 32  # type: ignore[union-attr]
    index.put_object(_meta("k", "b" * 32))
    assert index.cached_object("bkt", "k") is None  # dropped by the write ...
    assert index.get_object("bkt", "k").etag == "b" * 32  # type: ignore[union-attr]  # ... and read anew
    index.delete_object("bkt", "k")
    assert index.cached_object("bkt", "k") is None and index.get_object("bkt", "k") is None
    index.get_object("bkt", "k")
    index.put_object(_meta("k", "c" * 32), conditions=WriteConditions(if_none_match=True))
    assert index.get_object("bkt", "k").etag == "c" * 32  # type: ignore[union-attr]


def test_a_mounted_record_put_is_kept_decoded_and_a_delete_drops_it(index: Index) -> None:
    first = MountedObject(key="k", size=1, etag="a", last_modified_ms=1, validated_ms=1)
    index.put_mounted("m", first)
    assert index.cached_mounted("m", "k") == first  # without a database read ...
    index.records.drop([nkey("m", "k")])
    assert index.get_mounted("m", "k") == first  # ... and in the database
    second = replace(first, etag="b")
    index.put_mounted("m", second)
    assert index.cached_mounted("m", "k") == second and index.get_mounted("m", "k") == second
    index.records.drop([nkey("m", "k")])
    assert index.get_mounted("m", "k") == second
    index.delete_mounted("m", "k")
    assert index.cached_mounted("m", "k") is None and index.get_mounted("m", "k") is None


def test_a_renewal_keeps_its_records_decoded_and_a_later_put_replaces_them(index: Index) -> None:
    objs = [MountedObject(key=f"k{i}", size=1, etag="a", last_modified_ms=1, validated_ms=1) for i in range(3)]
    for obj in objs:
        index.put_mounted("m", obj)
    renewed = [replace(obj, validated_ms=2) for obj in objs]
    index.put_mounted("m", *renewed)
    for obj in renewed:  # in memory without a database read, and in the database
        assert index.cached_mounted("m", obj.key) == obj
    index.records.drop(nkey("m", obj.key) for obj in objs)  # read back from the database
    assert [index.get_mounted("m", obj.key) for obj in objs] == renewed
    index.put_mounted("m", *renewed[:1])
    index.put_mounted("m", replace(objs[0], etag="b"))  # a fetch of a new version after the renewal
    assert index.cached_mounted("m", "k0").etag == "b"  # type: ignore[union-attr]
    index.records.drop([nkey("m", "k0")])
    assert index.get_mounted("m", "k0").etag == "b"  # type: ignore[union-attr]


def test_a_write_through_of_a_full_cache_stays_bounded() -> None:
    cache = RecordCache(2)
    wrote = []
    cache.write_through(lambda _: wrote.append(1), {b"Na": 1, b"Nb": 2, b"Nc": 3})
    assert wrote == [1] and len(cache) == 2 and cache.get(b"Nc") == 3 and cache.get(b"Na") is None
    off = RecordCache(0)
    off.write_through(lambda _: wrote.append(2), {b"Na": 1})
    assert wrote == [1, 2] and len(off) == 0


def test_a_record_read_before_a_write_is_not_kept_after_it() -> None:
    cache = RecordCache(10)
    seen = cache.commits  # a reader starts: reads the database ...
    cache.drop([b"Obkt\x00k"])  # ... a write of the key commits meanwhile ...
    cache.keep(b"Obkt\x00k", "old", seen)  # ... and the reader's stale record is refused
    assert cache.get(b"Obkt\x00k") is None
    cache.keep(b"Obkt\x00k", "new", cache.commits)
    assert cache.get(b"Obkt\x00k") == "new"


def test_the_cache_is_bounded_oldest_out_first() -> None:
    cache = RecordCache(3)
    for i in range(5):
        cache.keep(bytes([79, i]), i, cache.commits)
    assert len(cache) == 3 and cache.get(bytes([79, 0])) is None and cache.get(bytes([79, 4])) == 4
    off = RecordCache(0)
    off.keep(b"Ok", 1, off.commits)
    assert off.get(b"Ok") is None


def test_readers_racing_writers_never_see_an_acknowledged_write_undone(index: Index) -> None:
    """Readers fill the cache as fast as they can while a writer commits new
    versions; after each commit returns, every read sees it or a later one."""
    stop = threading.Event()
    errors: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            index.get_object("bkt", "k")

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for t in readers:
        t.start()
    try:
        for version in range(1, 200):
            etag = f"{version:032x}"
            index.put_object(_meta("k", etag))
            for _ in range(3):
                got = index.get_object("bkt", "k")
                if got is None or int(got.etag, 16) < version:
                    errors.append(f"after writing {version}: {got.etag if got else None}")
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert errors == []


def test_a_flush_moves_the_cached_record_to_its_extent(tmp_path: Path) -> None:
    async def main() -> None:
        node = Node(tmp_path / "data", TierSettings(flush_delay=3600.0), LocalDirStore(tmp_path / "capacity"))
        await node.start()
        try:
            await node.objects.create_bucket("bkt")
            await node.objects.put("bkt", "k", _one(b"x" * 1000), NewObject(), Integrity(expected_size=1000))
            await node.objects.read(Read("bkt", "k"))
            assert node.index.cached_object("bkt", "k").chunks[0].file_id is not None  # type: ignore[union-attr]
            await node.tiers.flush()
            assert node.index.cached_object("bkt", "k") is None  # the flush's commit dropped it
            plan = await node.objects.read(Read("bkt", "k"))
            assert plan.body == b"x" * 1000
            assert node.index.cached_object("bkt", "k").chunks[0].extent is not None  # type: ignore[union-attr]
        finally:
            await node.close()

    asyncio.run(main())


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_a_read_the_page_cache_cannot_serve_at_once_goes_through_the_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RWF_NOWAIT failing (EAGAIN: the bytes are on disk only) sends the read
    to the pool path, which answers the same bytes."""

    def would_block(*args: object) -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    async def main() -> None:
        node = Node(tmp_path / "data", TierSettings(flush_delay=3600.0), LocalDirStore(tmp_path / "capacity"))
        await node.start()
        try:
            await node.objects.create_bucket("bkt")
            data = os.urandom(5000)
            await node.objects.put("bkt", "k", _one(data), NewObject(), Integrity(expected_size=len(data)))
            await node.objects.read(Read("bkt", "k"))  # the record is cached now
            now = node.objects._managed.plan_now(Read("bkt", "k"))  # type: ignore[attr-defined]
            assert now is not None and now.body == data and now.tally.hot == len(data)
            monkeypatch.setattr(os, "preadv", would_block)
            assert node.objects._managed.plan_now(Read("bkt", "k")) is None  # type: ignore[attr-defined]
            plan = await node.objects.read(Read("bkt", "k"))
            assert plan.body == data and plan.tally.hot == len(data)
        finally:
            await node.close()

    asyncio.run(main())


def test_read_now_refuses_missing_and_torn_files(tmp_path: Path) -> None:
    hot = HotTier(tmp_path / "hot", 1 << 30)
    assert hot.read_now([(None, "seg-0-10", 10)]) is None  # not cached
    assert hot.fill("seg-0-10", b"0123456789")
    assert hot.read_now([(None, "seg-0-10", 10)]) == b"0123456789"
    hot.cache_path("seg-0-10").write_bytes(b"01234")  # torn by a crash
    assert hot.read_now([(None, "seg-0-10", 10)]) is None


def test_a_held_record_is_served_at_once_and_written_unless_replaced_meanwhile(index: Index) -> None:
    """A cold read's record is held (served from memory) until the writer
    puts it; a write or delete of its key in between wins over the late put."""
    first = MountedObject(key="k", size=1, etag="a", last_modified_ms=1, validated_ms=1)
    index.hold_mounted("m", first)
    assert index.cached_mounted("m", "k") == first and index._db.get(nkey("m", "k")) is None
    index.put_mounted("m", first, held=True)
    index.records.drop([nkey("m", "k")])
    assert index.get_mounted("m", "k") == first  # in the database now

    second, third = replace(first, etag="b"), replace(first, etag="c")
    index.hold_mounted("m", second)
    index.delete_mounted("m", "k")  # the source lost it before the held write ran
    index.put_mounted("m", second, held=True)
    assert index.get_mounted("m", "k") is None

    index.hold_mounted("m", second)
    index.put_mounted("m", third)  # a newer description written meanwhile
    index.put_mounted("m", second, held=True)
    index.records.drop([nkey("m", "k")])
    assert index.get_mounted("m", "k") == third


def test_a_held_record_the_database_refuses_is_not_served_from_memory() -> None:
    cache = RecordCache(10)
    cache.hold(b"Nk", "held")
    assert cache.get(b"Nk") == "held"

    def refuse(records: dict[bytes, object]) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        cache.write_through(refuse, {b"Nk": "held"}, held=True)
    assert cache.get(b"Nk") is None
    cache.keep(b"Nk", "read back", cache.commits)
    assert cache.get(b"Nk") == "read back"  # no longer held: a reader may keep it again
