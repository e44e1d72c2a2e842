"""Extent reads from the capacity tier: verification, refetch, single flight."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from packer import format as seg
from tiering.capacity import LocalDirStore
from tiering.errors import CapacityError
from tiering.fetch import ExtentReader, segment_path
from tiering.hot import HotTier
from tiering.segments import extent_of


class Flaky(LocalDirStore):
    """A local store that counts GETs and corrupts the first ``bad`` of them."""

    def __init__(self, root: Path, bad: int = 0) -> None:
        super().__init__(root)
        self.bad = bad
        self.gets = 0

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        self.gets += 1
        await asyncio.sleep(0.01)  # long enough for concurrent callers to pile up
        data = bytearray(await super().get_range(name, start, end))
        if self.gets <= self.bad and data:
            data[len(data) // 2] ^= 0x40
        return bytes(data)


async def _segment(store: LocalDirStore, payload: bytes):
    encoder = seg.SegmentEncoder("0000000000000001")
    header = encoder.header()
    ref, stored = encoder.add("b", "k", 1, 0, payload)
    await store.put(segment_path("0000000000000001"), header + stored + encoder.finish())
    return extent_of("0000000000000001", ref)


def _reader(tmp_path: Path, bad: int = 0) -> tuple[Flaky, HotTier, ExtentReader]:
    store = Flaky(tmp_path / "cap", bad)
    hot = HotTier(tmp_path / "hot", budget=1 << 30)
    return store, hot, ExtentReader(store, hot, concurrency=4)


PAYLOAD = b"training sample " * 5000


def test_concurrent_misses_share_one_get(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _reader(tmp_path)
        ext = await _segment(store, PAYLOAD)
        results = await asyncio.gather(*(reader.fetch(ext) for _ in range(20)))
        assert all(r == PAYLOAD for r in results)
        assert store.gets == 1
        await reader.drain()
        assert hot.read_cached(ext.cache_name, ext.raw) == PAYLOAD

    asyncio.run(go())


def test_corrupt_bytes_are_fetched_again_never_served(tmp_path: Path) -> None:
    async def go():
        store, _, reader = _reader(tmp_path, bad=2)
        ext = await _segment(store, PAYLOAD)
        assert await reader.fetch(ext) == PAYLOAD
        assert store.gets == 3

    asyncio.run(go())


def test_persistent_corruption_is_an_error_and_caches_nothing(tmp_path: Path) -> None:
    async def go():
        store, hot, reader = _reader(tmp_path, bad=100)
        ext = await _segment(store, PAYLOAD)
        with pytest.raises(CapacityError, match="corrupt"):
            await reader.fetch(ext)
        await reader.drain()
        assert hot.read_cached(ext.cache_name, ext.raw) is None
        assert hot.cached == 0

    asyncio.run(go())
