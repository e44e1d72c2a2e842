"""Bounds on clients, below the application.

Abusive clients are bounded here, below the application (see
:class:`_BoundedHeads`, in the HTTP protocol uvicorn runs, and
:class:`BodyDeadline`, around the S3 app; gateway/serving/listener.py puts both in
place for every server it makes): a request head must
arrive whole within ``client_timeout`` seconds and ``MAX_REQUEST_HEAD``
bytes, and a request body may not stall for longer than ``client_timeout``.
uvicorn bounds neither time (and with httptools, its fast parser, not even
the size of a head): a connection that sends nothing, or trickles a head
one byte at a time (slowloris), or a body that stops short of its
Content-Length, would hold its socket, its task and (for a PUT) its
hot-tier reservation forever. The number of
connections is left to the descriptor limit: uvicorn's ``limit_concurrency``
counts connections that have not sent a head yet, so slow clients holding
it would get legitimate requests refused with 503; the head deadline is
what frees them.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
from typing import Any

import uvicorn

from gateway.s3.errors import S3Error
from gateway.s3.http import BLOCKS, has_body
from gateway.serving.sendfile import send_region
from tiering.reads.plan import Region

# Bound on one request head (request line and headers): S3 heads are small
# (user metadata is capped at 2 KiB; S3 itself refuses heads over 8 KiB with
# RequestHeaderSectionTooLarge) but presigned URLs and many x-amz-* headers
# add up; h11's 16 KiB default is too tight for some clients.
MAX_REQUEST_HEAD = 64 * 1024
_TIMED_OUT = ("RequestTimeout", "Your socket connection to the server was not read from or "
              "written to within the timeout period. Idle connections will be closed.")
_TOO_LARGE = ("RequestHeaderSectionTooLarge",
              "Your request header section exceeds the maximum allowed size.")


class Limits(uvicorn.Config):
    """uvicorn's configuration, plus the bounds :class:`_BoundedHeads` enforces."""

    def __init__(self, app: Any, *, client_timeout: float, s3_errors: bool, **options: Any) -> None:
        super().__init__(app, **options)
        self.client_timeout = client_timeout
        self.max_head = MAX_REQUEST_HEAD
        self.s3_errors = s3_errors  # refusals as S3 XML errors (else uvicorn's plain text)


class _BoundedHeads:
    """Bounds on the request heads of one connection, for either uvicorn parser.

    A head must be complete within ``client_timeout`` seconds of the
    connection opening, or of the first byte of the next request on a
    kept-alive connection (between requests uvicorn's keep-alive timer
    closes idle connections, but the first byte of a head cancels it). At
    most ``max_head`` bytes may arrive while a head is incomplete, so memory
    is bounded whatever the parser; with httptools, which would buffer a
    head of any size, a complete head may not be larger either (h11 lets
    one that arrives whole in a single read through).

    A connection that sent nothing is closed silently; one in the middle of
    a head gets S3's answer first (400 RequestTimeout or
    RequestHeaderSectionTooLarge), as does any request the HTTP parser
    refuses (400 InvalidRequest), so every refusal on the S3 port is S3 XML.
    """

    config: Limits
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    _refusal: tuple[str, str] | None = None
    _blocks = False

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(_HeadsWithBodies(transport))  # type: ignore[misc]
        # Body blocks sent from their files need the bytes unencrypted on
        # the socket: not over TLS (gateway/serving/sendfile.py).
        self._blocks = not self.config.is_ssl and transport.get_extra_info("sslcontext") is None
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)  # type: ignore[misc]
        if self.transport.is_closing():
            self._stop_head_timer()
        elif self.cycle is not cycle:  # a head is complete: its request runs
            self._stop_head_timer()
            self._head_bytes = 0
        elif self.cycle is None or (self.cycle.response_complete and not self.cycle.more_body):
            # Part of a head. (An answer sent before its request's body was
            # read, as a route that takes none does, leaves the body's late
            # bytes coming in: the parser reads them as that body, not as a
            # head, so they count against no head's bound.)
            self._head_bytes += len(data)
            if self._head_bytes > self.config.max_head:
                self._refuse(_TOO_LARGE)
            elif self._head_timer is None:
                self._start_head_timer()

    def shutdown(self) -> None:
        """The server stops: an idle connection is closed now, a busy one
        after its response. Over TLS, closing sends close_notify and waits
        for the client's, which an idle pooled client (urllib3, aiohttp)
        never sends: each such connection would hold the stop for asyncio's
        30 s TLS shutdown timeout. An idle connection is between requests,
        so nothing is cut short by dropping it at once instead."""
        idle = self.cycle is None or self.cycle.response_complete
        super().shutdown()  # type: ignore[misc]
        if idle and self.config.is_ssl:
            self.transport.abort()

    def send_400_response(self, msg: str) -> None:
        """What uvicorn sends when its parser refuses a request."""
        code, message = self._refusal or ("InvalidRequest", msg)
        if not self.config.s3_errors:
            super().send_400_response(message)  # type: ignore[misc]
            return
        # Imported late: only the S3 port's refusals need the data plane's modules.
        from gateway.s3 import xml
        from gateway.s3.http import new_request_id

        request_id = new_request_id()
        body = xml.error(S3Error(code, message), "", request_id)
        head = (f"HTTP/1.1 400 Bad Request\r\ncontent-type: application/xml\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\nserver: tierstore\r\n"
                f"x-amz-request-id: {request_id}\r\nx-amz-id-2: {request_id}\r\n\r\n")
        self.transport.write(head.encode("ascii") + body)
        self.transport.close()

    def _refuse(self, refusal: tuple[str, str]) -> None:
        self._refusal = refusal
        self.send_400_response(refusal[1])

    def _start_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.config.client_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_bytes:
            self._refuse(_TIMED_OUT)
        else:
            self.transport.close()


class _HeadsWithBodies:
    """A connection's transport that sends a small write together with the
    next one: a response's head with its body's first bytes.

    uvicorn writes a response head as soon as the app starts the response,
    and the body when it comes: two sends, and on loopback each send runs
    the receiver's side of TCP too. A write of at most ``HOLD`` bytes is
    held instead; the next write sends both with one ``writelines`` (a
    vectored send, no copy), and a held write is sent at the latest in the
    event loop's next iteration, so nothing waits on the app. Measured on a
    bare uvicorn app answering 64 KiB: 57 -> 42 us of CPU per request.

    A body block that is a ``Region`` of a file (a hot GET's, where the
    request's scope said this connection can) is sent from the file by the
    kernel (``gateway/serving/sendfile.py``).
    """

    HOLD = 16 * 1024

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._held: bytes | None = None

    def write(self, data: bytes | memoryview | Region) -> None:
        if type(data) is Region:  # a body block in a file: the kernel sends it (gateway/serving/sendfile.py)
            self._send_held()
            data.sent = send_region(self._transport, data)
            return
        held = self._held
        if held is not None:
            self._held = None
            self._transport.writelines((held, data))
        elif len(data) <= self.HOLD:
            self._held = bytes(data)
            self._loop.call_soon(self._send_held)
        else:
            self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        self._send_held()
        self._transport.writelines(chunks)

    def _send_held(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def close(self) -> None:
        self._send_held()
        self._transport.close()

    def write_eof(self) -> None:
        self._send_held()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:  # get_extra_info, pause_reading, ...
        return getattr(self._transport, name)


@functools.cache
def bounded_protocol() -> type[asyncio.Protocol]:
    """uvicorn's fastest HTTP/1.1 protocol (httptools when installed), bounded."""
    if importlib.util.find_spec("httptools") is None:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        class BoundedH11Protocol(_BoundedHeads, H11Protocol):
            pass  # h11 itself refuses an incomplete head past h11_max_incomplete_event_size

        return BoundedH11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpToolsProtocol(_BoundedHeads, HttpToolsProtocol):
        url: bytes
        headers: list[tuple[bytes, bytes]]
        scope: Any

        def on_headers_complete(self) -> None:
            # A head that arrived in one read was never counted incomplete.
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > self.config.max_head:
                self._refusal = _TOO_LARGE
                raise ValueError("request head too large")  # the parser answers 400
            if self._blocks:  # this protocol writes body blocks with transport.write
                self.scope["extensions"] = {BLOCKS: {}}  # type: ignore[typeddict-unknown-key]
            super().on_headers_complete()

    return BoundedHttpToolsProtocol


class BodyDeadline:
    """The S3 app with a bound on silence in the middle of a request body.

    Once ``seconds`` pass without a byte of a body that is not complete,
    the app's read fails with 400 RequestTimeout (S3's code), which ends the
    request like any error: what was staged is removed, the connection
    closed. Reads after the body (a streamed GET watches for a disconnect)
    wait as long as they need.
    """

    def __init__(self, app: Any, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not has_body(scope):  # nothing to stall on: receive only tells of a disconnect
            await self.app(scope, receive, send)
            return
        await self.app(scope, _StallGuard(receive, self.seconds).receive, send)


class _StallGuard:
    """One request's ``receive``, failing once its body stalls for ``seconds``.

    One timer per request, re-armed when it fires, not one per read: a
    fast upload makes thousands of reads, and a timer per read (what
    ``asyncio.timeout`` would do) costs more than the read itself.
    """

    def __init__(self, receive: Any, seconds: float) -> None:
        self._receive = receive
        self._seconds = seconds
        self._loop = asyncio.get_running_loop()
        self._body_done = False
        self._waiter: asyncio.Task[Any] | None = None  # the task waiting for body bytes
        self._since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False

    async def receive(self) -> Any:
        if self._body_done:
            return await self._receive()
        self._waiter = asyncio.current_task()
        self._since = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(self._since + self._seconds, self._check)
        try:
            message = await self._receive()
        except asyncio.CancelledError:
            assert self._waiter is not None
            if self._expired and self._waiter.uncancel() == 0:  # our cancel, nobody else's
                raise S3Error(*_TIMED_OUT) from None
            raise
        finally:
            self._waiter = None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._body_done = True
            if self._timer is not None:
                self._timer.cancel()
        return message

    def _check(self) -> None:
        self._timer = None
        if self._waiter is None:
            return  # not waiting now: the next read arms the timer again
        deadline = self._since + self._seconds
        if self._loop.time() < deadline:
            self._timer = self._loop.call_at(deadline, self._check)
        else:
            self._expired = True
            self._waiter.cancel()  # it waits in receive(), which turns this into RequestTimeout
