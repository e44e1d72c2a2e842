"""The rebuild from the capacity store's footers, where footers hold
manifests of versions that were replaced since."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.unit.tiering.test_objects import body, new_service
from tiering import pool
from tiering.capacity import LocalDirStore
from tiering.index.db import Index
from tiering.maintenance.recover import recover
from tiering.model.inputs import Integrity, NewObject


async def _put(svc, key: str, data: bytes) -> None:  # type: ignore[no-untyped-def]
    await svc.objects.put("bkt", key, body(data), NewObject(), Integrity(expected_size=len(data)))


def test_a_replaced_version_whose_bytes_are_gone_is_not_a_loss(tmp_path: Path) -> None:
    """``x``'s metadata rewrite leaves its manifest in the segment that
    holds ``y``'s bytes, which keep that segment alive. ``x`` is then
    replaced and the segment with its old bytes is compacted away: the old
    manifest now names a segment that no longer exists. The rebuild must
    restore the new ``x`` and report nothing incomplete; the stale manifest
    was superseded, not lost."""
    root = tmp_path / "data"

    async def go() -> dict[str, object]:
        svc = new_service(root)
        await svc.start()
        try:
            await svc.objects.create_bucket("bkt")
            await _put(svc, "x", b"old x" * 1000)
            await svc.tiers.flush()
            source = await svc.objects.head("bkt", "x")
            await svc.objects.rewrite_meta(source, NewObject(user_meta={"k": "x"}))
            await _put(svc, "y", b"y" * 5000)
            await svc.tiers.flush()  # y's bytes and x's new manifest, naming x's old segment
            old = (await svc.objects.head("bkt", "x")).chunks[0].extent.segment  # type: ignore[union-attr]
            await _put(svc, "x", b"new x" * 1000)
            await svc.tiers.flush()
            await svc.tiers.compact()
            names = {s.name for s in await pool.run(svc.index.segments)}
            assert old not in names, "the old bytes' segment should be gone"
        finally:
            await svc.close()
        index = Index(tmp_path / "rebuilt" / "index")
        try:
            report = await recover(LocalDirStore(tmp_path / "data-capacity"), index)
            metas = {key: index.get_object("bkt", key) for key in ("x", "y")}
        finally:
            index.close()
        return {"report": report, "metas": metas}

    done = asyncio.run(go())
    report, metas = done["report"], done["metas"]
    assert report.incomplete == 0, report  # type: ignore[attr-defined]
    assert report.objects == 2, report  # type: ignore[attr-defined]
    assert metas["x"].user_meta == {} and metas["x"].size == 5000  # type: ignore[index]
    assert metas["y"].size == 5000  # type: ignore[index]
