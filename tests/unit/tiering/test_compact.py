"""Compaction passes that overlap (an operator's job beside another, or the
periodic one)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from tests.unit.tiering.test_objects import body, new_service
from tiering import pool
from tiering.maintenance import fsck
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node


async def _record_only(svc: Node) -> list[str]:
    return [s.name for s in await pool.run(svc.index.segments) if s.data == 0 and s.pins > 0]


async def _put(svc: Node, key: str, data: bytes) -> None:
    await svc.objects.put("merge", key, body(data), NewObject(), Integrity(expected_size=len(data)))


def test_overlapping_passes_merge_record_only_segments_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two passes both see the same segments holding only tombstones; the
    first merges them. The second must find them gone under the layout lock,
    not try to read them and log that the index names segments the store
    does not have (the alarm for a lost segment)."""
    root = tmp_path / "data"

    async def go() -> None:
        svc = new_service(root)
        await svc.start()
        try:
            await svc.objects.create_bucket("merge")
            await _put(svc, "kept", b"k" * 100_000)  # keeps the data segment dense: no rewrite
            await _put(svc, "gone-0", b"0")
            await _put(svc, "gone-1", b"1")
            await svc.tiers.flush()
            for key in ("gone-0", "gone-1"):
                await svc.objects.delete("merge", key)
                await svc.tiers.flush()  # a segment of its tombstone alone
            before = await _record_only(svc)
            assert len(before) == 2, before
            reports = await asyncio.gather(svc.tiers.compact(), svc.tiers.compact())
            assert sorted(r.merged for r in reports) == [0, 2], reports
            after = await _record_only(svc)
            assert len(after) == 1 and not set(after) & set(before), after
            assert [e.key for e in (await svc.objects.list("merge")).contents] == ["kept"]
        finally:
            await svc.close()

    with caplog.at_level(logging.ERROR, logger="tierstore.compact"):
        asyncio.run(go())
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert fsck.check(root) == []
