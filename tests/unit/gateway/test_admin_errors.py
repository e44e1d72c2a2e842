"""An admin route that fails unexpectedly still answers in the one error shape."""

from __future__ import annotations

import asyncio
import logging
import re

import httpx
import pytest

from gateway.admin import build_admin_app
from gateway.config.values import Config
from gateway.observability.metrics import Metrics


class _BrokenTiers:
    async def status(self) -> None:
        raise RuntimeError("disk on fire")


class _BrokenService:
    tiers = _BrokenTiers()


class _S3:
    started = True
    service = _BrokenService()
    metrics = Metrics()


def test_an_unexpected_failure_is_a_500_in_the_error_shape(caplog: pytest.LogCaptureFixture) -> None:
    app = build_admin_app(Config(admin_token="t"), _S3())

    async def ask() -> httpx.Response:
        # raise_app_exceptions left on: the failure must not leave the app
        # (uvicorn would log it a second time, "Exception in ASGI application").
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            return await client.get("/tiers", headers={"Authorization": "Bearer t"})

    with caplog.at_level(logging.ERROR):
        answer = asyncio.run(ask())
    assert answer.status_code == 500
    body = answer.json()
    assert set(body) == {"error"} and body["error"]["code"] == "InternalError"
    message = body["error"]["message"]
    assert re.fullmatch(r"the gateway failed to answer; see its log \(request id [0-9A-F]{16}\)", message)
    request_id = answer.headers["x-request-id"]
    assert request_id in message
    assert "disk on fire" not in answer.text
    # Logged once, with the request id and the traceback.
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    assert request_id in failures[0].getMessage() and failures[0].exc_info is not None
