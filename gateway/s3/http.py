"""Minimal HTTP request and response types for the raw-ASGI data plane.

No framework objects per request: the S3 hot path builds one small
``S3Request`` from the ASGI scope and answers with one ``Response``.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

from gateway.s3.errors import S3Error
from gateway.s3.headers import decimal
from tiering.reads.plan import Block, ReadTally, Region

Scope = dict[str, Any]
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


class ClientDisconnected(Exception):
    """The client went away mid-request; nothing is acknowledged."""


@dataclass(slots=True)
class S3Request:
    method: str
    raw_path: str  # as on the wire, percent-encoding kept
    path: str  # percent-decoded UTF-8
    raw_query: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names; repeats joined with ","
    receive: Any
    request_id: str
    bucket: str = ""
    key: str = ""
    auth: Any = None  # gateway.auth.sigv4.AuthContext once authenticated (None: anonymous)
    caller: Any = None  # gateway.auth.access.Caller once recognised: who asks, what they may do
    body_consumed: bool = False
    op: str = "Unknown"  # the S3 operation name once routed (gateway.routes)
    # Bytes of object body read per tier, for a GET: set by the handler,
    # read by the app after the response went out (metrics, access log).
    tally: ReadTally | None = None
    # The server takes body blocks that are not bytes (gateway/serving/sendfile.py):
    # a GET's hot pieces as file regions, arriving ones as buffer views.
    blocks: bool = False

    @classmethod
    def from_scope(cls, scope: Scope, receive: Any, request_id: str) -> S3Request:
        raw_path = scope.get("raw_path") or scope["path"].encode()
        raw_path_s = raw_path.decode("latin-1")
        path = raw_path_s
        if "%" in raw_path_s:
            if _BAD_ESCAPE.search(raw_path_s):  # "%zz", a trailing "%": S3 answers 400
                raise S3Error("InvalidURI", "Couldn't parse the specified URI.")
            try:
                path = unquote(raw_path_s, encoding="utf-8", errors="strict")
            except UnicodeDecodeError as exc:
                raise S3Error("InvalidURI", "Couldn't parse the specified URI.") from exc
        raw_query = scope.get("query_string", b"").decode("latin-1")
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            n = name.decode("latin-1").lower()
            v = value.decode("latin-1")
            headers[n] = f"{headers[n]},{v}" if n in headers else v
        return cls(
            method=scope["method"],
            raw_path=raw_path_s,
            path=path,
            raw_query=raw_query,
            query=_parse_query(raw_query) if raw_query else {},
            headers=headers,
            receive=receive,
            request_id=request_id,
            blocks=BLOCKS in scope.get("extensions", ()),
        )

    async def stream(self) -> AsyncIterator[bytes]:
        """The raw body as it arrives (uvicorn answers Expect: 100-continue
        when this first asks for data)."""
        self.body_consumed = True
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnected()
            chunk = message.get("body", b"")
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                return

    async def read(self, limit: int) -> bytes:
        """The whole body, refused past ``limit`` bytes (XML request bodies):
        before reading anything when Content-Length says so, else as soon as
        the bytes read pass it."""
        declared = decimal(self.headers.get("content-length", "").strip())
        if declared is not None and declared > limit:
            raise S3Error("MaxMessageLengthExceeded", "Your request was too big.")
        parts: list[bytes] = []
        size = 0
        async for chunk in self.stream():
            size += len(chunk)
            if size > limit:
                raise S3Error("MaxMessageLengthExceeded", "Your request was too big.")
            parts.append(chunk)
        return b"".join(parts)


def _parse_query(raw: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(raw, keep_blank_values=True, encoding="utf-8", errors="strict")
    except (UnicodeDecodeError, ValueError) as exc:
        raise S3Error("InvalidURI", "Couldn't parse the specified URI.") from exc
    return dict(pairs)


# A body in one piece (a hot small object is read into a bytearray).
WHOLE = (bytes, bytearray)
# The ASGI scope extension of a server that takes body blocks that are not
# bytes: ``Region`` (sent from its file) and views of a buffer.
# gateway/serving/client_bounds.py puts it there.
BLOCKS = "tierstore.blocks"


@dataclass(slots=True)
class Response:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | bytearray | AsyncIterator[bytes] | AsyncIterator[Block] = b""
    content_type: str | None = None
    # Headers already encoded, sent before ``headers`` (an object version's
    # representation headers, built once: gateway.s3.headers.object_head).
    head: Sequence[tuple[bytes, bytes]] = ()

    async def first_block(self) -> None:
        """Pull a streamed body's first block now, before the head is sent.

        A body that fails before its first byte (the capacity store does not
        answer, an extent stays corrupt) then becomes an S3 error answer
        rather than a 200 whose body is cut short. The body is closed when
        this raises."""
        if isinstance(self.body, WHOLE):
            return
        rest = self.body
        try:
            first = await anext(rest)
        except StopAsyncIteration:
            self.body = b""
            return
        except BaseException:
            await _close(rest)
            raise
        self.body = _prepended(first, rest)

    async def send(self, send: Any, head_only: bool = False, receive: Any = None) -> None:
        """Send the response. With ``receive``, a streamed body stops (and
        its iterator is closed) once the client has gone: the server drops
        what is sent after a disconnect, so the rest would be read for
        nothing. Raises ClientDisconnected then."""
        headers = [*self.head, *((k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers)]
        if self.content_type is not None:
            headers.append((b"content-type", self.content_type.encode("latin-1")))
        if isinstance(self.body, WHOLE):
            if not any(k == b"content-length" for k, _ in headers):
                headers.append((b"content-length", str(len(self.body)).encode()))
            await send({"type": "http.response.start", "status": self.status, "headers": headers})
            await send({"type": "http.response.body", "body": b"" if head_only else self.body})
            return
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        body = self.body
        gone = asyncio.ensure_future(_disconnected(receive)) if receive is not None else None
        try:
            async for chunk in body:
                if gone is not None and gone.done():
                    raise ClientDisconnected()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if type(chunk) is Region:
                    # Sent by the server from its file (gateway/serving/sendfile.py);
                    # the body closes the descriptor once asked for more.
                    if chunk.sent is None:  # the client had gone: nothing was written
                        raise ClientDisconnected()
                    await chunk.sent
            await send({"type": "http.response.body", "body": b""})
        finally:
            if gone is not None:
                gone.cancel()
                if gone.done() and not gone.cancelled():
                    gone.exception()  # retrieved: a failed receive is a disconnect too
            await _close(body)


# The client's address on a request a read worker passes to the writer
# (gateway/workers/forward.py), which sees a Unix socket; trusted only there.
CLIENT_HEADER = "x-tierstore-client"


def has_body(scope: dict[str, Any]) -> bool:
    """Whether the request announces a body (chunked, or a Content-Length above 0)."""
    for name, value in scope["headers"]:
        name = name.lower()
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def new_request_id() -> str:
    """x-amz-request-id (and x-amz-id-2): 16 hex digits, as S3's. Unique
    per process (a counter) and across processes (a random start): one
    random draw per process, not a system call per request."""
    return f"{next(_request_ids) & 0xFFFFFFFFFFFFFFFF:016X}"


_request_ids = itertools.count(int.from_bytes(secrets.token_bytes(8), "big"))


async def _prepended(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        yield first
        async for chunk in rest:
            yield chunk
    finally:
        await _close(rest)


async def _close(body: AsyncIterator[bytes]) -> None:
    """Run a streamed body's cleanup now (an async generator's), not at GC."""
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        await aclose()


async def _disconnected(receive: Any) -> None:
    """Return once the client has disconnected (the request body, if any
    is left, is read and dropped on the way)."""
    while (await receive())["type"] != "http.disconnect":
        pass
