"""An empty object's piece keeps its segment alive (Extent.weight): found by
the tiers model (put, flush, metadata rewrite, compaction), kept here as the
short sequence that lost the segment under the object."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from tiering.capacity import LocalDirStore
from tiering.maintenance import fsck
from tiering.model.inputs import Integrity, NewObject
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


def test_an_index_from_before_is_recounted_once_at_start(tmp_path: Path) -> None:
    """An index written before empty entries counted one: its segment of
    empty live entries shows 0 live bytes; the next start recounts it."""
    from dataclasses import replace

    from tiering.index.keys import WEIGHTED_KEY, gkey

    async def go() -> None:
        def open_node() -> Node:
            return Node(tmp_path / "data", TierSettings(flush_delay=3600.0), LocalDirStore(tmp_path / "capacity"))

        node = open_node()
        await node.start()
        await node.objects.create_bucket("bkt")
        await node.objects.put("bkt", "dir/", _empty(), NewObject(), Integrity(expected_size=0))
        await node.tiers.flush()
        meta = await node.objects.head("bkt", "dir/")
        segment = meta.chunks[0].extent.segment  # type: ignore[union-attr]
        info = node.index.get_segment(segment)
        assert info is not None and info.live == 1
        # As the index of an older gateway left it.
        node.index._db.put(gkey(segment), replace(info, live=0).to_bytes())  # noqa: SLF001
        node.index._db.delete(WEIGHTED_KEY)  # noqa: SLF001
        await node.close()

        node = open_node()
        await node.start()
        try:
            assert node.index.live_weighted()
            recounted = node.index.get_segment(segment)
            assert recounted is not None and recounted.live == 1
            await node.tiers.compact(threshold=0.5)
            assert node.index.get_segment(segment) is not None, "kept: an object still uses it"
        finally:
            await node.close()
        assert fsck.check(tmp_path / "data") == []

    asyncio.run(go())
