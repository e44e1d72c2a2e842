"""Large extents read as they arrive (tiering/reads/arrival.py): the first
bytes go before the extent is in, a CRC mismatch never ends an answer as
if it were whole, and the read-ahead stays within its window. No network:
a local capacity store whose GETs hand their bytes over in steps."""

from __future__ import annotations

import asyncio
import os
import sys
import zlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from packer import format as seg
from packer.ranges import ByteRange, split_over
from tiering.capacity import LocalDirStore
from tiering.capacity.layout import segment_path
from tiering.capacity.store import Into, pour
from tiering.errors import CapacityError
from tiering.hot.open_files import Opened
from tiering.hot.tier import HotTier
from tiering.maintenance.segments import extent_of
from tiering.meta import Extent
from tiering.reads.arrival import BLOCK, Arrival
from tiering.reads.fetch import ExtentReader
from tiering.reads.plan import ReadTally, Region
from tiering.reads.readahead import stream

MiB = 1024 * 1024
SEGMENT = "0000000000000001"
CRC32C = True  # what the extents of _object carry; both kinds by the fixture below


@pytest.fixture(autouse=True, params=[True, False], ids=["crc32c", "crc32"])
def _crc_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test, over extents checked with CRC32C (carried on the event
    loop as the bytes land) and with the CRC32 of segments written before
    footer version 3 (carried in the pool)."""
    monkeypatch.setattr(sys.modules[__name__], "CRC32C", request.param)


class Stepped(LocalDirStore):
    """A local store whose ranged GETs (``get_range_into``) hand their bytes
    over in two steps, the second once ``go`` is set. ``flip[start]``: the
    offsets (within the GET) of bytes to corrupt in the next streamed GET
    that starts at ``start``; ``flip_whole[start]``: how many of the
    whole-extent refetches (``get_range``) from there come back corrupt.
    Counts GETs, and the most in flight at once."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.go = asyncio.Event()
        self.go.set()
        self.flip: dict[int, list[int]] = {}
        self.flip_whole: dict[int, int] = {}
        self.streamed = 0
        self.refetched = 0
        self.in_flight = 0
        self.most = 0

    async def get_range_into(self, name: str, start: int, end: int, into: Into) -> None:
        data = bytearray(await super().get_range(name, start, end))
        for offset in self.flip.pop(start, ()):
            data[offset] ^= 0x40
        self.streamed += 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            half = len(data) // 2
            pour(into, bytes(data[:half]))
            await asyncio.sleep(0.005)  # readers run meanwhile
            await self.go.wait()
            pour(into, bytes(data[half:]))
        finally:
            self.in_flight -= 1

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        data = bytearray(await super().get_range(name, start, end))
        if name.startswith("segments/"):
            self.refetched += 1
            if self.flip_whole.get(start, 0) > 0:
                self.flip_whole[start] -= 1
                data[10] ^= 0x40
        return bytes(data)


async def _object(store: LocalDirStore, parts: list[bytes]) -> list[Extent]:
    """``parts`` stored as they are (codec none), one extent each, in one segment."""
    encoder = seg.SegmentEncoder(SEGMENT)
    body = bytearray(encoder.header())
    refs = []
    for part_no, payload in enumerate(parts):
        ref, stored = encoder.add("b", "k", 1, part_no, payload, compress=False)
        refs.append(ref)
        body += stored
    body += encoder.finish()
    await LocalDirStore.put(store, segment_path(SEGMENT), bytes(body))
    extents = [extent_of(SEGMENT, ref) for ref in refs]
    assert all(ext.codec == "none" and ext.crc32c for ext in extents)
    if not CRC32C:  # as a segment written before CRC32C lists them: the same bytes, zlib's CRC32
        extents = [replace(ext, crc=zlib.crc32(payload), crc32c=False) for ext, payload in zip(extents, parts)]
    return extents


def _setup(tmp_path: Path, concurrency: int = 8) -> tuple[Stepped, HotTier, ExtentReader]:
    store = Stepped(tmp_path / "cap")
    hot = HotTier(tmp_path / "hot", budget=1 << 30)
    return store, hot, ExtentReader(store, hot, concurrency=concurrency)


def _read(reader: ExtentReader, extents: list[Extent], window: int = 8, blocks: bool = False,
          wanted: ByteRange | None = None) -> AsyncIterator[bytes | memoryview | Region]:
    """What ManagedBuckets.stream does for an object of ``extents``."""
    sizes = [ext.raw for ext in extents]
    pieces = list(split_over(sizes, wanted or ByteRange(0, sum(sizes))))

    async def open_piece(index: int) -> Opened | bytes | Arrival:
        fd = await reader.open_cached(extents[index])
        return fd if fd is not None else await reader.open_live(extents[index])

    return stream(pieces, open_piece, window=window, tally=ReadTally(), blocks=blocks)


def run(coro) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(coro)


def test_the_first_bytes_go_before_the_extent_has_arrived(tmp_path: Path) -> None:
    async def go() -> None:
        store, hot, reader = _setup(tmp_path)
        payload = os.urandom(3 * MiB)
        (ext,) = await _object(store, [payload])
        store.go.clear()  # the GET hands over half, then waits
        body = _read(reader, [ext])
        first = await anext(body)
        assert store.in_flight == 1, "the first block came while the GET was still under way"
        assert 0 < len(first) <= len(payload) // 2 and bytes(first) == payload[: len(first)]
        store.go.set()
        rest = b"".join([bytes(block) async for block in body])
        assert bytes(first) + rest == payload
        await reader.drain()
        assert hot.read_cached(ext.cache_name, ext.raw) == payload, "cached behind the answer"
        assert (store.streamed, store.refetched) == (1, 0)

    run(go())


def test_blocks_are_handed_out_at_least_a_block_at_a_time(tmp_path: Path) -> None:
    """A store that sends 32 KiB at a time does not cost a send per piece."""

    class Small(Stepped):
        async def get_range_into(self, name: str, start: int, end: int, into: Into) -> None:
            data = await LocalDirStore.get_range(self, name, start, end)
            for at in range(0, len(data), 32 * 1024):
                pour(into, data[at : at + 32 * 1024])
                await asyncio.sleep(0)

    async def go() -> None:
        store = Small(tmp_path / "cap")
        reader = ExtentReader(store, HotTier(tmp_path / "hot", budget=1 << 30), concurrency=8)
        payload = os.urandom(4 * MiB)
        (ext,) = await _object(store, [payload])
        blocks = [bytes(block) async for block in _read(reader, [ext], blocks=True)]
        assert b"".join(blocks) == payload
        assert all(len(block) >= BLOCK for block in blocks[:-1]) and len(blocks) <= len(payload) // BLOCK + 1
        await reader.drain()

    run(go())


def test_a_corrupt_extent_mid_stream_fails_the_answer_and_never_completes_it(tmp_path: Path) -> None:
    """Bytes that fail the CRC every time: the body raises before its end,
    so a client sees fewer bytes than the Content-Length, never a whole
    answer with a wrong byte in it; and nothing is cached."""

    async def go() -> None:
        store, hot, reader = _setup(tmp_path)
        parts = [os.urandom(3 * MiB), os.urandom(3 * MiB)]
        extents = await _object(store, parts)
        store.flip = {extents[0].offset: [MiB]}  # in the first half of the first extent: sent before the check
        store.flip_whole = {extents[0].offset: 3}  # and every refetch corrupt too
        got = bytearray()
        with pytest.raises(CapacityError):
            async for block in _read(reader, extents):
                got += block
        assert len(got) < sum(map(len, parts)), "the answer never reached its length"
        assert len(got) < len(parts[0]), "it stopped inside the corrupt extent"
        await reader.drain()
        assert hot.read_cached(extents[0].cache_name, extents[0].raw) is None

    run(go())


def test_bytes_sent_before_a_mismatch_must_equal_the_refetched_ones(tmp_path: Path) -> None:
    """Corrupt once, in bytes already sent: the refetch is good, but what
    went out differs from it, so the answer is cut short all the same."""

    async def go() -> None:
        store, _, reader = _setup(tmp_path)
        payload = os.urandom(3 * MiB)
        (ext,) = await _object(store, [payload])
        store.flip = {ext.offset: [5]}
        got = bytearray()
        with pytest.raises(CapacityError, match="differ"):
            async for block in _read(reader, [ext]):
                got += block
        assert 0 < len(got) < len(payload) and got[5] != payload[5]
        assert store.refetched == 1
        await reader.drain()

    run(go())


def test_a_mismatch_in_bytes_not_sent_yet_is_fetched_again_and_served(tmp_path: Path) -> None:
    async def go() -> None:
        store, hot, reader = _setup(tmp_path)
        payload = os.urandom(3 * MiB)
        (ext,) = await _object(store, [payload])
        store.flip = {ext.offset: [len(payload) - 10]}  # in the half that comes second
        got = b"".join([bytes(block) async for block in _read(reader, [ext])])
        assert got == payload
        assert (store.streamed, store.refetched) == (1, 1)
        await reader.drain()
        assert hot.read_cached(ext.cache_name, ext.raw) == payload

    run(go())


def test_a_corrupt_extent_ahead_of_the_reader_is_fetched_again_before_it_is_sent(tmp_path: Path) -> None:
    async def go() -> None:
        store, _, reader = _setup(tmp_path)
        parts = [os.urandom(2 * MiB) for _ in range(3)]
        extents = await _object(store, parts)
        store.flip = {extents[1].offset: [7]}  # the second extent, read ahead while the first is sent
        body = _read(reader, extents)
        got = bytes(await anext(body))
        await asyncio.sleep(0.1)  # a slow client: the extents ahead have all arrived meanwhile
        got += b"".join([bytes(block) async for block in body])
        assert got == b"".join(parts)
        assert store.refetched == 1
        await reader.drain()

    run(go())


def test_ranges_within_extents_are_cut_exactly(tmp_path: Path) -> None:
    async def go() -> None:
        store, hot, reader = _setup(tmp_path)
        parts = [os.urandom(2 * MiB + 17) for _ in range(3)]
        extents = await _object(store, parts)
        whole = b"".join(parts)
        for start, end in ((5, 100), (MiB, 3 * MiB), (2 * MiB + 10, 2 * MiB + 20), (100, len(whole))):
            got = b"".join([bytes(b) async for b in _read(reader, extents, wanted=ByteRange(start, end))])
            assert got == whole[start:end], (start, end)
            await reader.drain()
            hot.drop_cached([ext.cache_name for ext in extents])  # cold again

    run(go())


def test_the_read_ahead_fetches_at_most_its_window(tmp_path: Path) -> None:
    """A reader that stops after its first block holds no more than
    ``window`` extents' GETs, however long the object."""

    async def go() -> None:
        store, _, reader = _setup(tmp_path, concurrency=16)
        parts = [os.urandom(MiB + 4096) for _ in range(12)]
        extents = await _object(store, parts)
        store.go.clear()  # every GET stops halfway
        body = _read(reader, extents, window=3)
        await anext(body)
        for _ in range(400):  # the GETs start after a pool call each
            if store.streamed >= 3:
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)  # and no fourth starts
        assert store.streamed == 3 and store.most == 3
        store.go.set()
        rest = [bytes(b) async for b in body]
        assert len(b"".join(rest)) > 0
        assert store.most <= 3, "never more than the window in flight"
        await reader.drain()

    run(go())


def test_a_second_reader_of_an_arriving_extent_shares_its_get(tmp_path: Path) -> None:
    async def go() -> None:
        store, _, reader = _setup(tmp_path)
        payload = os.urandom(3 * MiB)
        (ext,) = await _object(store, [payload])
        store.go.clear()
        first = _read(reader, [ext])
        await anext(first)
        second = asyncio.ensure_future(reader.fetch(ext))  # a whole-extent reader joins it
        third = _read(reader, [ext])
        store.go.set()
        assert b"".join([bytes(b) async for b in third]) == payload
        assert await second == payload
        async for _ in first:
            pass
        assert store.streamed == 1
        await reader.drain()

    run(go())


def test_hot_pieces_are_handed_to_a_server_as_file_regions(tmp_path: Path) -> None:
    async def go() -> None:
        store, hot, reader = _setup(tmp_path)
        payload = os.urandom(3 * MiB)
        (ext,) = await _object(store, [payload])
        assert b"".join([bytes(b) async for b in _read(reader, [ext])]) == payload
        await reader.drain()  # now cached
        body = _read(reader, [ext], blocks=True, wanted=ByteRange(10, 3 * MiB))
        region = await anext(body)  # its descriptor is open until the body is asked for more
        assert isinstance(region, Region) and len(region) == 3 * MiB - 10
        assert os.pread(region.fd, 100, region.offset) == payload[10:110]
        assert [b async for b in body] == []
        assert b"".join([bytes(b) async for b in _read(reader, [ext])]) == payload  # bytes without blocks

    run(go())
