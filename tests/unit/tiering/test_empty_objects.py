"""An empty object's piece keeps its segment alive (Extent.weight): found by
the tiers model (put, flush, metadata rewrite, compaction), kept here as the
short sequence that lost the segment under the object."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from tiering import fsck
from tiering.capacity import LocalDirStore
from tiering.inputs import Integrity, NewObject
from tiering.node import Node
from tiering.settings import TierSettings


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""


def test_compaction_keeps_the_segment_of_an_empty_object_rewritten(tmp_path: Path) -> None:
    async def go() -> None:
        node = Node(tmp_path / "data", TierSettings(flush_delay=3600.0), LocalDirStore(tmp_path / "capacity"))
        await node.start()
        try:
            objects = node.objects
            await objects.create_bucket("bkt")
            empty = Integrity(expected_size=0)
            await node.tiers.flush()
            await objects.put("bkt", "k3", _empty(), NewObject(), empty)
            await node.tiers.compact(threshold=0.5)
            await node.tiers.flush()
            await objects.put("bkt", "k0", _empty(), NewObject(), empty)
            source = await objects.head("bkt", "k3")
            await objects.rewrite_meta(source, NewObject(user_meta={"v": "2"}))  # its manifest moves on
            await node.tiers.compact(threshold=0.5)
            await node.tiers.flush()
            await node.tiers.residency.evict("bkt", "")
            for key in ("k3", "k0"):
                assert await objects.read_all(await objects.head("bkt", key)) == b""
        finally:
            await node.close()
        assert fsck.check(tmp_path / "data") == []

    asyncio.run(go())
