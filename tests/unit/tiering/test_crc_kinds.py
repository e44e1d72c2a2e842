"""A data dir from before CRC32C (segments of footer version 2, records
without ``crc32c``) still reads, cold, and its extents move to CRC32C as
compaction copies them."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

import packer.encoder
from tiering.capacity import LocalDirStore
from tiering.maintenance import fsck
from tiering.meta import Extent
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node
from tiering.settings import TierSettings

MiB = 1024 * 1024


async def _body(data: bytes):  # type: ignore[no-untyped-def]
    yield data


def _node(tmp_path: Path) -> Node:
    settings = TierSettings(flush_delay=3600.0, part_size=MiB)
    return Node(tmp_path / "data", settings, LocalDirStore(tmp_path / "capacity"))


async def _extents(node: Node, key: str) -> list[Extent]:
    meta = await node.objects.head("bkt", key)
    return [c.extent for c in meta.chunks if c.extent is not None]


def test_a_data_dir_from_before_crc32c_reads_and_compacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = {"large": os.urandom(3 * MiB + 5), "small": b"s" * 1000, "gone": os.urandom(2 * MiB)}

    async def go() -> None:
        with monkeypatch.context() as older:  # written as the version before CRC32C wrote it
            older.setattr(packer.encoder, "FOOTER_VERSION", 2)
            node = _node(tmp_path)
            await node.start()
            await node.objects.create_bucket("bkt")
            for key, data in bodies.items():
                await node.objects.put("bkt", key, _body(data), NewObject(), Integrity(expected_size=len(data)))
            await node.tiers.flush()
            for key in bodies:
                extents = await _extents(node, key)
                assert extents and not any(ext.crc32c for ext in extents)
            await node.close()

        node = _node(tmp_path)
        await node.start()
        try:
            await node.tiers.residency.evict("bkt", "")
            for key, data in bodies.items():  # read from the store, checked with CRC32
                assert await node.objects.read_all(await node.objects.head("bkt", key)) == data
            await node.objects.delete("bkt", "gone")
            await node.tiers.flush()
            report = await node.tiers.compact(threshold=0.9)
            assert report.rewritten >= 1, report
            del bodies["gone"]
            for key in bodies:
                extents = await _extents(node, key)
                assert extents and all(ext.crc32c for ext in extents), "copied with CRC32C"
            await node.tiers.residency.evict("bkt", "")
            for key, data in bodies.items():  # read from the new segment, checked with CRC32C
                assert await node.objects.read_all(await node.objects.head("bkt", key)) == data
        finally:
            await node.close()
        assert fsck.check(tmp_path / "data") == []

    asyncio.run(go())
