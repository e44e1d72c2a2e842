"""The S3 data plane as one raw ASGI application.

Per request: parse the scope, decide bucket and key, verify SigV4, pick the
handler from the operation table, await it, send. Every failure, expected or
not, leaves through one place that renders S3 XML with the request id;
nothing reaches the client as a bare 500 page or a dropped connection.
Once the response is out (or the client gone), the request is recorded in
``metrics`` and the access log, with the bytes actually received and sent.

The app builds nothing: it serves from the context its :class:`Plane`
(``gateway.node.Node``) holds at the time of each request, and answers 503
while there is none.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any, Protocol

from gateway import routes
from gateway.auth import sigv4
from gateway.auth.access import Access, signed
from gateway.config.values import Config
from gateway.handlers.context import Context, owner_ids
from gateway.observability.accesslog import AccessLog
from gateway.observability.metrics import tier_of
from gateway.s3 import xml
from gateway.s3.errors import S3Error, to_s3_error
from gateway.s3.headers import decimal
from gateway.s3.http import (
    CLIENT_HEADER,
    ClientDisconnected,
    Response,
    S3Request,
    has_body,
    new_request_id,
)

log = logging.getLogger("tierstore.s3")

# Recorded for a request that ended before any response went out (the client
# disconnected, or the server was cancelling): nginx's "client closed request".
CLIENT_CLOSED = 499


# The largest unread body read and dropped after a full disk's early
# refusal rather than the connection closed: the default small-object size,
# the bodies refused before they are read (larger ones stream to the store).
DRAIN_MAX = 4 * 1024 * 1024
_DRAINED = ("SlowDown", "InsufficientStorage")


def _drainable(scope: dict[str, Any]) -> bool:
    """A body of a known length of at most DRAIN_MAX, which the client is
    sending (not waiting for a 100 Continue first)."""
    length = None
    for name, value in scope["headers"]:
        name = name.lower()
        if name == b"expect" or name == b"transfer-encoding":
            return False
        if name == b"content-length":
            length = value.strip()
    number = None if length is None else decimal(length.decode("latin-1"))
    return number is not None and number <= DRAIN_MAX


async def _drain(receive: Any) -> bool:
    """Read the rest of the request body and drop it; True once it ended
    (False: the client left, or sent more than it announced)."""
    read = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return False
        read += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
        if read > DRAIN_MAX:
            return False


def _remote(scope: dict[str, Any], req: S3Request | None) -> str | None:
    """The client's address; for a request a read worker passed on over the
    Unix socket (no peer address), the one the worker saw."""
    client = scope.get("client")
    if client:
        return str(client[0])
    return req.headers.get(CLIENT_HEADER) if req is not None else None


class Plane(Protocol):
    """Where the S3 app finds, per request, what its handlers serve from
    (``gateway.node.Node``; a read worker's app is its own)."""

    @property
    def context(self) -> Context | None:
        """None while the data plane starts or stops: requests get 503."""


class Budget(Protocol):
    """The process's memory budget (``gateway.serving.memory.MemoryBudget``)."""

    def check(self, method: str) -> None:
        """Raise 503 SlowDown for a new request of ``method`` while over budget."""

    def admit(self, method: str, headers: dict[str, str]) -> int:
        """Reserve the bytes a new request's body will hold (503 SlowDown
        when they do not fit); the bytes reserved."""

    def release(self, size: int) -> None:
        """Give back what :meth:`admit` reserved."""


class Recorder(Protocol):
    """Where finished requests are counted (``gateway.observability.metrics.Metrics``; a
    read worker's relay to the writer)."""

    def observe(self, op: str, status: int, tier: str, seconds: float, received: int, sent: int,
                served_hot: int, served_capacity: int, batched: int = 0, user: str = "",
                served_peer: int = 0, /) -> None: ...


class S3App:
    """ASGI 3 app serving the S3 API from the context of its plane.

    Only ``http`` scopes: the servers run with lifespan off, and the data
    plane is started and stopped by the process's root (gateway/node.py).
    """

    # Raised by ``_pass_on`` (or a handler) when the request is left to
    # another process (a read worker's, gateway/workers/worker.py): out of _http
    # before anything was sent, and not recorded here.
    PASS_ON: tuple[type[BaseException], ...] = ()

    def __init__(self, config: Config, plane: Plane, metrics: Recorder, access_log: AccessLog,
                 budget: Budget | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.access_log = access_log
        self._plane = plane
        self._budget = budget
        self._record_failed = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        start = time.perf_counter()
        request_id = new_request_id()
        method = scope["method"]
        resource = scope.get("path", "/")
        body_done = not has_body(scope)
        received = sent = status = 0
        req: S3Request | None = None
        error: str | None = None
        passed_on = False

        async def tracked_receive() -> Any:
            nonlocal body_done, received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if not message.get("more_body", False):
                    body_done = True
            else:
                body_done = True
            return message

        async def counted_send(message: dict[str, Any]) -> None:
            nonlocal status, sent
            await send(message)
            if message["type"] == "http.response.start":
                status = message["status"]
            else:
                sent += len(message.get("body", b""))

        try:
            try:
                ctx = self._plane.context
                if ctx is None:
                    raise S3Error("ServiceUnavailable", "The gateway is starting or stopping; retry shortly.")
                req = S3Request.from_scope(scope, tracked_receive, request_id)
                response = await self._handle(ctx, req)
                if method != "HEAD":
                    await response.first_block()
            except ClientDisconnected:
                error = "ClientDisconnected"
                return
            except asyncio.CancelledError:
                error = "Cancelled"
                raise
            except self.PASS_ON:
                passed_on = True
                raise
            except Exception as exc:
                response, error = self._error(exc, resource, request_id, method)
            response.headers += [("x-amz-request-id", request_id), ("x-amz-id-2", request_id), ("server", "tierstore")]
            if not body_done and error in _DRAINED and _drainable(scope):
                # A full disk's refusal, made before a small body was read:
                # the client sends it all the same, and a close with its
                # bytes unread resets the connection, often before the
                # client reads the answer. Read and drop it instead (not for
                # other early errors: an unauthenticated client waits for no
                # body of its own to be read before it learns its answer).
                body_done = await _drain(tracked_receive)
            if not body_done:
                # Answered before the body was read (an early error, often under
                # Expect: 100-continue, when the client never sends it): the
                # connection's next bytes are unknowable, so it must not be reused.
                response.headers.append(("connection", "close"))
            try:
                await response.send(counted_send, head_only=method == "HEAD", receive=tracked_receive)
            except ClientDisconnected:
                error = "ClientDisconnected"
            except Exception as exc:
                # Mid-body: the head is gone, no error answer is possible. The
                # client sees a body shorter than its Content-Length; uvicorn
                # closes the connection of a response left unfinished.
                error = to_s3_error(exc).code
                log.warning("request %s: body cut short after %d bytes: %s", request_id, sent, exc)
        finally:
            # After the last byte (or the disconnect): what was sent is known.
            if not passed_on:
                self._record(scope, req, request_id, status, error, received, sent, time.perf_counter() - start)

    def _record(
        self, scope: dict[str, Any], req: S3Request | None, request_id: str, status: int,
        error: str | None, received: int, sent: int, seconds: float,
    ) -> None:
        """Metrics and the access-log line of one request; never raises."""
        try:
            if not status:  # nothing was sent: the client left, or the task was cancelled
                status = CLIENT_CLOSED
            op, tally = (req.op, req.tally) if req is not None else ("Unknown", None)
            tier = tier_of(tally)
            hot, capacity, peer = (tally.hot, tally.capacity, tally.peer) if tally is not None else (0, 0, 0)
            objects = getattr(tally, "objects", None)  # a batch's (gateway/handlers/batch.py)
            # Who asked (gateway/auth/access.py): a user's name, root or anonymous;
            # "" when the request was refused before anyone was recognised.
            user = req.caller.name if req is not None and req.caller is not None else ""
            self.metrics.observe(op, status, tier, seconds, received, sent, hot, capacity, objects or 0, user,
                                 peer)
            if self.access_log.enabled:
                self.access_log.write(
                    request_id=request_id, remote=_remote(scope, req), op=op,
                    bucket=req.bucket if req is not None else "", key=req.key if req is not None else "",
                    status=status, error=error, bytes_in=received, bytes_out=sent, tier=tier, seconds=seconds,
                    objects=objects, user=user,
                )
        except Exception:
            # A bug here must not fail requests, nor flood the log once per request.
            if not self._record_failed:
                self._record_failed = True
                log.exception("recording request %s failed (further failures are logged at debug level)",
                              request_id)
            else:
                log.debug("recording request %s failed", request_id, exc_info=True)

    async def _handle(self, ctx: Context, req: S3Request) -> Response:
        virtual_host = routes.address(req, self.config.domain)
        # Routed before authenticating, so that even a request refused by
        # SigV4 is counted under its operation; a routing error still comes
        # after the authentication error, as in S3.
        route: routes.Route | None = None
        unroutable: S3Error | None = None
        try:
            route = routes.resolve(req)
            req.op = route.op
        except S3Error as exc:
            unroutable = exc
        if self._budget is not None:
            # Over the memory budget: refused before any work, under its
            # operation's name (a small body is read and dropped, as a full
            # disk's early refusal's is).
            self._budget.check(req.method)
        self._pass_on(route, req)
        access = ctx.access
        if signed(req):
            req.auth = self._authenticate(access, req, virtual_host)
        elif route is None:  # anonymous and unroutable: refused first, as before a route is known
            raise S3Error("AccessDenied", "Anonymous access is not allowed; sign the request with AWS4-HMAC-SHA256")
        if route is None:
            assert unroutable is not None
            raise unroutable
        self._authorize(access, req, route.op)
        expected = req.headers.get("x-amz-expected-bucket-owner")
        if expected is not None and req.bucket and expected not in owner_ids(req):
            # S3 refuses a request whose bucket belongs to another account
            # than the one the client expects, whatever else it asks.
            raise S3Error("AccessDenied", "Access Denied")
        if self._budget is None:
            return await route.handler(ctx, req)
        # What its body will hold, reserved before a byte of it is read
        # (gateway/serving/memory.py); a request without one reserves nothing.
        held = self._budget.admit(req.method, req.headers)
        if not held:
            return await route.handler(ctx, req)
        try:
            return await route.handler(ctx, req)
        finally:
            self._budget.release(held)

    def _authenticate(self, access: Access, req: S3Request, virtual_host: bool) -> sigv4.AuthContext:
        """The signature checked (SigV4 or SigV2, header or presigned)."""
        return sigv4.authenticate(
            req.method, req.raw_path, req.raw_query, req.headers, access.secret_for, datetime.now(UTC),
            host_bucket=req.bucket if virtual_host else "",
        )

    def _authorize(self, access: Access, req: S3Request, op: str) -> None:
        """The one authorisation point (gateway/auth/access.py): who asks
        (``req.caller``), and may they run ``op`` on this bucket or object?
        AccessDenied if not. (A read worker passes a refusal on instead: the
        writer answers, logs and counts it.)"""
        req.caller = access.caller(req.auth.access_key if req.auth is not None else None)
        access.authorize(req.caller, req, op)

    def _pass_on(self, route: routes.Route | None, req: S3Request) -> None:
        """Raise one of PASS_ON to leave the request, once routed (None:
        unroutable) and before it is authenticated, to another process.
        This app answers everything."""

    def _error(
        self, exc: Exception, resource: str, request_id: str, method: str
    ) -> tuple[Response, str | None]:
        """The response for a failed request and its S3 error code (None for 304)."""
        err = to_s3_error(exc)
        if err.code == "InternalError":
            log.error("request %s failed", request_id, exc_info=exc)
        if err.status == 304:  # no body; the validators travel as headers
            validators = [(k.lower(), v) for k, v in err.fields.items()
                          if k.lower() in ("etag", "last-modified", "cache-control", "expires")]
            return Response(status=304, headers=validators), None
        headers: list[tuple[str, str]] = list(err.headers)
        if err.code == "SlowDown":
            headers.append(("retry-after", "1"))
        # HEAD answers carry no body; the status and headers say it all.
        body = xml.error(err, resource, request_id)
        if method == "HEAD":
            headers.append(("content-length", "0"))
            return Response(status=err.status, headers=headers, body=b""), err.code
        return Response(status=err.status, headers=headers, body=body, content_type="application/xml"), err.code
