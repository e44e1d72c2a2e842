"""The flusher seen by writers: write-through waits when the capacity store fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.unit.tiering.test_objects import body, new_service
from tiering.errors import CapacityError, ServiceUnavailable
from tiering.maintenance import fsck
from tiering.model.inputs import Integrity, NewObject


def test_write_through_put_gets_503_when_its_flush_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 503 comes when the round carrying the write fails, not at the end
    of the wait (which an S3 client's read timeout would cut first); the
    write stays committed and is flushed once the store takes it."""
    root = tmp_path / "data"

    async def refuse(name: str, data: bytes) -> None:
        raise CapacityError(f"capacity store test: put_object {name} failed after 6 attempts: SlowDown (HTTP 503)")

    async def go() -> None:
        svc = new_service(root, write_through_timeout=30.0)
        await svc.start()
        try:
            await svc.objects.create_bucket("wtb", write_through=True)
            with monkeypatch.context() as patch:
                patch.setattr(svc.tiers.capacity, "put", refuse)
                with pytest.raises(ServiceUnavailable, match="did not take the write: capacity store test"):
                    await svc.objects.put("wtb", "k", body(b"data"), NewObject(), Integrity(expected_size=4))
                assert svc.tiers.flusher.last_error is not None
            await svc.tiers.flush()
            meta = await svc.objects.head("wtb", "k")
            assert [c.extent is not None for c in meta.chunks] == [True]
            assert await svc.objects.read_all(meta) == b"data"
        finally:
            await svc.close()

    asyncio.run(go())
    assert fsck.check(root) == []
