"""A hot batch of a managed bucket (tiering/batch/reads.py): looked up and opened
on the event loop when the record cache holds every record, through the
pool otherwise; the same members and bytes either way."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tiering import pool
from tiering.batch import hot as batch_hot
from tiering.batch.hot import HotBatch
from tiering.errors import NoSuchKey
from tiering.index.keys import okey
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node
from tiering.reads.plan import ReadTally

KEYS = [f"k{i}" for i in range(5)]


def _data(key: str) -> bytes:
    return key.encode() * 1000


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


@pytest.fixture
def filled(node: Node) -> Node:
    """``node`` (tests/unit/tiering/conftest.py) with KEYS in ``bkt``."""
    for key in KEYS:
        data = _data(key)
        node.run(node.objects.put("bkt", key, _body(data), NewObject(), Integrity(expected_size=len(data))))  # type: ignore[attr-defined]
    return node


@pytest.fixture
def pool_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the functions handed to the pool."""
    calls: list[str] = []
    original = pool.run

    def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(fn, "__name__", repr(fn)))
        return original(fn, *args, **kwargs)

    monkeypatch.setattr(pool, "run", counted)
    return calls


def _read(node: Node, keys: list[str]) -> tuple[list[tuple[str, bytes | str]], ReadTally]:
    """Each member's key and bytes (or error code), read as the gateway does."""
    tally = ReadTally()

    async def read() -> list[tuple[str, bytes | str]]:
        batch = await node.objects.batch("bkt", keys, False, tally)
        assert isinstance(batch, HotBatch)
        views = [None if m.error is not None else memoryview(bytearray(m.meta.size))  # type: ignore[union-attr]
                 for m in batch.members]
        try:
            await batch.read(0, views)
        finally:
            batch.close()
        return [(m.key, type(m.error).__name__ if m.error is not None else bytes(v))  # type: ignore[arg-type]
                for m, v in zip(batch.members, views, strict=True)]

    return node.run(read()), tally  # type: ignore[attr-defined]


def test_hot_batch_of_cached_records_needs_no_pool_call(filled: Node, pool_calls: list[str]) -> None:
    node = filled
    keys = [KEYS[3], KEYS[0], KEYS[3], KEYS[1]]
    _read(node, keys)  # the records are now in the record cache
    pool_calls.clear()
    members, tally = _read(node, keys)
    assert members == [(k, _data(k)) for k in keys]
    assert tally.hot == sum(len(_data(k)) for k in keys)
    assert pool_calls == []


def test_hot_batch_with_a_record_not_cached_takes_the_pool(filled: Node, pool_calls: list[str]) -> None:
    node = filled
    _read(node, KEYS[:2])
    pool_calls.clear()
    members, _ = _read(node, [KEYS[0], "missing", KEYS[1]])
    assert members == [(KEYS[0], _data(KEYS[0])), ("missing", NoSuchKey.__name__), (KEYS[1], _data(KEYS[1]))]
    assert pool_calls == ["_lookup_open_sync"]
    node.objects._index.records.drop([okey("bkt", k) for k in KEYS])  # type: ignore[attr-defined]
    pool_calls.clear()
    members, _ = _read(node, KEYS[:2])
    assert members == [(k, _data(k)) for k in KEYS[:2]]
    assert pool_calls == ["_lookup_open_sync"]


def _open_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_hot_batch_holds_kept_descriptors_through_an_eviction(filled: Node) -> None:
    """Read on the loop, a hot batch holds the kept descriptors: a file
    evicted between its lookup and its read still reads its bytes, and is
    closed once read; nothing stays held."""
    node = filled
    hot = node.objects._batches._hot  # type: ignore[attr-defined]
    _read(node, KEYS)  # records cached: the next batch is read on the loop
    _read(node, KEYS)  # descriptors kept
    kept = len(hot.open_files)
    assert kept == len(KEYS)
    before = _open_count()

    async def read_after_forget() -> list[bytes]:
        batch = await node.objects.batch("bkt", KEYS, False, ReadTally())
        assert isinstance(batch, HotBatch)
        for path in list(hot.open_files._fds):  # as an eviction's unlink tells it
            hot.open_files.forget(path)
        assert len(hot.open_files) == 0
        views = [memoryview(bytearray(m.meta.size)) for m in batch.members]  # type: ignore[union-attr]
        try:
            await batch.read(0, views)
        finally:
            batch.close()
        return [bytes(v) for v in views]

    assert node.run(read_after_forget()) == [_data(k) for k in KEYS]  # type: ignore[attr-defined]
    assert _open_count() == before - kept  # the forgotten ones closed at their release
    assert _read(node, KEYS)[0] == [(k, _data(k)) for k in KEYS]  # kept again
    assert _open_count() == before


def test_hot_batch_read_by_the_pool_or_closed_unread_releases_its_holds(
        filled: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    node = filled
    _read(node, KEYS)
    _read(node, KEYS)
    before = _open_count()
    monkeypatch.setattr(batch_hot, "_read_now", lambda pieces, view: False)  # not in the page cache
    assert _read(node, KEYS)[0] == [(k, _data(k)) for k in KEYS]
    assert _open_count() == before

    async def unread() -> None:
        batch = await node.objects.batch("bkt", KEYS, False, ReadTally())
        assert isinstance(batch, HotBatch)
        batch.close()

    node.run(unread())  # type: ignore[attr-defined]
    hot = node.objects._batches._hot  # type: ignore[attr-defined]
    assert hot.open_files._held == {}
    assert _open_count() == before


@pytest.mark.own_files
def test_a_torn_cached_file_is_no_hot_batch_and_reads_right(filled: Node) -> None:
    """A cached extent's file of another size (torn by a crash) is refused
    by the hot batch's size check, in the pool and on the loop: the batch
    is streamed, and its member read as a GET reads it, which drops the
    torn file, fetches the extent again and caches it whole (behind the
    answer: waited for, so nothing here depends on when the fill runs)."""
    node = filled
    node.run(node.tiers.flush())  # type: ignore[attr-defined]
    hot = node.objects._batches._hot  # type: ignore[attr-defined]
    reader = node.objects._batches._reader  # type: ignore[attr-defined]
    index = node.objects._index  # type: ignore[attr-defined]

    def extent(key: str) -> Any:
        (chunk,) = index.get_object("bkt", key).chunks
        return chunk.extent

    def tear(key: str) -> None:
        os.truncate(hot.cache_path(extent(key).cache_name), 10)

    async def streamed(keys: list[str]) -> list[tuple[str, bytes]]:
        members = await node.objects.batch("bkt", keys, False, ReadTally())
        assert not isinstance(members, HotBatch)
        read = [(m.key, m.body) async for m in members]  # type: ignore[misc]
        await reader.settled([extent(k).cache_name for k in keys])  # the refill behind the answer
        return read

    def refetched(key: str, misses: int) -> None:
        ext = extent(key)
        assert reader.misses == misses + 1  # the torn copy was dropped, not served: fetched again
        assert hot.is_cached(ext.cache_name)  # and cached again, whole
        assert os.stat(hot.cache_path(ext.cache_name)).st_size == ext.raw

    tear(KEYS[1])  # records not cached yet: the pool opens and checks
    misses = reader.misses
    assert node.run(streamed(KEYS)) == [(k, _data(k)) for k in KEYS]  # type: ignore[attr-defined]
    refetched(KEYS[1], misses)
    whole = [k for k in KEYS if k != KEYS[1]]
    _read(node, whole)
    assert _read(node, whole)[0] == [(k, _data(k)) for k in whole]  # kept now, on the loop
    for path in list(hot.open_files._fds):  # let go, as an eviction's unlink does
        hot.open_files.forget(path)
    tear(KEYS[2])  # the loop opens it anew and checks it
    misses = reader.misses
    assert node.run(streamed(whole)) == [(k, _data(k)) for k in whole]  # type: ignore[attr-defined]
    refetched(KEYS[2], misses)
