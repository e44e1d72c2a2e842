"""The S3 data plane as one raw ASGI application.

Per request: parse the scope, decide bucket and key, verify SigV4, pick the
handler from the operation table, await it, send. Every failure, expected or
not, leaves through one place that renders S3 XML with the request id;
nothing reaches the client as a bare 500 page or a dropped connection.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from datetime import UTC, datetime
from typing import Any

from gateway import routes, sigv4, xml
from gateway.config import Config
from gateway.context import Context
from gateway.errors import S3Error, to_s3_error
from gateway.http import ClientDisconnected, Response, S3Request
from gateway.server import StartupError
from gateway.storage import object_service
from tiering.errors import CapacityError
from tiering.objects import ObjectService
from tiering.tiers import ForeignSegments

log = logging.getLogger("tierstore.s3")


def _has_body(scope: dict[str, Any]) -> bool:
    for name, value in scope["headers"]:
        if name.lower() == b"transfer-encoding" or (name.lower() == b"content-length" and value.strip() != b"0"):
            return True
    return False


class S3App:
    """ASGI 3 app serving the S3 API from an ObjectService it owns."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.service: ObjectService | None = None
        self._context: Context | None = None

    @property
    def started(self) -> bool:
        return self._context is not None

    async def startup(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        service = object_service(self.config)
        try:
            await service.start()
        except (ForeignSegments, CapacityError) as exc:
            # Not serving is the safe answer; say why in one line.
            await service.close()
            raise StartupError(str(exc)) from exc
        self.service = service
        self._context = Context(self.config, service)

    async def shutdown(self) -> None:
        self._context = None
        if self.service is not None:
            await self.service.close()
            self.service = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # reported to the server, which exits
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        request_id = secrets.token_hex(8).upper()
        method = scope["method"]
        resource = scope.get("path", "/")
        body_done = not _has_body(scope)

        async def tracked_receive() -> Any:
            nonlocal body_done
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        try:
            response = await self._handle(scope, tracked_receive, request_id)
        except ClientDisconnected:
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            response = self._error(exc, resource, request_id, method)
        response.headers += [("x-amz-request-id", request_id), ("x-amz-id-2", request_id), ("server", "tierstore")]
        if not body_done:
            # Answered before the body was read (an early error, often under
            # Expect: 100-continue, when the client never sends it): the
            # connection's next bytes are unknowable, so it must not be reused.
            response.headers.append(("connection", "close"))
        await response.send(send, head_only=method == "HEAD")

    async def _handle(self, scope: dict[str, Any], receive: Any, request_id: str) -> Response:
        if self._context is None:
            raise S3Error("ServiceUnavailable", "The gateway is starting or stopping; retry shortly.")
        req = S3Request.from_scope(scope, receive, request_id)
        virtual_host = routes.address(req, self.config.domain)
        req.auth = sigv4.authenticate(
            req.method, req.raw_path, req.raw_query, req.headers,
            self.config.credentials.get, datetime.now(UTC),
            host_bucket=req.bucket if virtual_host else "",
        )
        handler = routes.resolve(req)
        return await handler(self._context, req)

    def _error(self, exc: Exception, resource: str, request_id: str, method: str) -> Response:
        err = to_s3_error(exc)
        if err.code == "InternalError":
            log.error("request %s failed", request_id, exc_info=exc)
        if err.status == 304:  # no body; the validators travel as headers
            return Response(status=304, headers=[(k.lower(), v) for k, v in err.fields.items()
                                                 if k.lower() in ("etag", "last-modified", "cache-control", "expires")])
        headers: list[tuple[str, str]] = []
        if err.code == "SlowDown":
            headers.append(("retry-after", "1"))
        # HEAD answers carry no body; the status and headers say it all.
        body = xml.error(err, resource, request_id)
        if method == "HEAD":
            headers.append(("content-length", "0"))
            return Response(status=err.status, headers=headers, body=b"")
        return Response(status=err.status, headers=headers, body=body, content_type="application/xml")
