"""A GET or HEAD crosses from the gateway into tiering once: the handler
asks ObjectService.read and nothing else (docs/architecture.md, read path)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.handlers.context import Context
from gateway.handlers.objects import get_object, head_object
from gateway.s3.http import S3Request
from tiering.capacity import LocalDirStore
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node
from tiering.settings import TierSettings


class Spy:
    """Records every attribute the handler takes from the object service."""

    def __init__(self, service: object) -> None:
        self._service = service
        self.asked: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.asked.append(name)
        return getattr(self._service, name)


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _request(method: str, headers: dict[str, str], query: dict[str, str] | None = None) -> S3Request:
    return S3Request(method=method, raw_path="/bkt/k", path="/bkt/k", raw_query="", query=query or {},
                     headers=headers, receive=None, request_id="r", bucket="bkt", key="k")


@pytest.mark.parametrize(
    ("method", "headers", "query", "status"),
    [
        ("GET", {}, None, 200),
        ("GET", {"range": "bytes=0-9"}, None, 206),
        ("GET", {}, {"partNumber": "1"}, 206),
        ("GET", {"if-none-match": "*"}, None, 304),
        ("HEAD", {}, None, 200),
    ],
)
def test_a_read_is_one_call_into_tiering(tmp_path: Path, method: str, headers: dict[str, str],
                                          query: dict[str, str] | None, status: int) -> None:
    async def go() -> None:
        node = Node(tmp_path / "data", TierSettings(flush_delay=3600.0), LocalDirStore(tmp_path / "capacity"))
        await node.start()
        try:
            await node.objects.create_bucket("bkt")
            await node.objects.put("bkt", "k", _body(b"x" * 100), NewObject(), Integrity(expected_size=100))
            spy = Spy(node.objects)
            ctx = Context(None, spy, None)  # type: ignore[arg-type]
            handler = get_object if method == "GET" else head_object
            response = await handler(ctx, _request(method, headers, query))
            assert response.status == status
            assert spy.asked == ["read"]
        finally:
            await node.close()

    asyncio.run(go())
