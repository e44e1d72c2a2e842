"""An admin route that fails unexpectedly still answers in the one error shape."""

from __future__ import annotations

import asyncio

import httpx

from gateway.admin import build_admin_app
from gateway.config import Config
from gateway.metrics import Metrics


class _BrokenTiers:
    async def status(self) -> None:
        raise RuntimeError("disk on fire")


class _BrokenService:
    tiers = _BrokenTiers()


class _S3:
    started = True
    service = _BrokenService()
    metrics = Metrics()


def test_an_unexpected_failure_is_a_500_in_the_error_shape() -> None:
    app = build_admin_app(Config(admin_token="t"), _S3())

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            return await client.get("/tiers", headers={"Authorization": "Bearer t"})

    answer = asyncio.run(ask())
    assert answer.status_code == 500
    assert answer.json() == {
        "error": {"code": "InternalError", "message": "the gateway failed to answer; see its log"}
    }
    assert "disk on fire" not in answer.text
