"""A multipart upload to the S3 store (moto) reserves the bytes of its
parts in flight from the process's admission by bytes."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from tiering.admission import Admission
from tiering.capacity.s3 import MIN_PART_SIZE, S3Store
from tiering.capacity.s3_upload import PART_COPIES

pytestmark = pytest.mark.anyio


async def test_s3_parts_in_flight_are_reserved(
    make_s3: Callable[..., S3Store], monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """Each part in flight holds its bytes and the HTTP client's copy of
    them: reserved until the part is done, or the upload aborted."""
    store = make_s3(concurrency=2)
    await store.start()
    admission = Admission()
    monkeypatch.setattr("tiering.capacity.s3_upload.ADMISSION", admission)
    real = store._client.upload_part
    held: list[int] = []

    async def upload_part(**kw: Any) -> Any:
        held.append(admission.held)
        return await real(**kw)

    monkeypatch.setattr(store._client, "upload_part", upload_part)
    try:
        data = os.urandom(3 * MIN_PART_SIZE)
        upload = store.upload("reserved")
        await upload.write(data)
        assert await upload.complete() == len(data)
        assert len(held) == 3 and min(held) >= PART_COPIES * MIN_PART_SIZE
        assert admission.peak <= 2 * PART_COPIES * MIN_PART_SIZE  # two in flight at most
        assert admission.held == 0
        assert await store.get_range("reserved", 0, len(data)) == data
        aborted = store.upload("aborted")
        await aborted.write(data)
        await aborted.abort()
        assert admission.held == 0
    finally:
        await store.close()
