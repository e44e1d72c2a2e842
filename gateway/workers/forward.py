"""A read worker passing a request it does not serve to the writer process.

The request goes as it came (method, raw path and query, headers, body
streamed) over HTTP/1.1 on the writer's Unix socket, where the writer's own
S3 app verifies the signature and answers it; the answer streams back as it
came. Only hop-by-hop headers are dropped each way (RFC 9110 7.6.1): the
framing of each connection is its own. The writer's Date is dropped too,
since the worker's server writes its own.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from yarl import URL

from gateway.s3.errors import S3Error
from gateway.s3.http import CLIENT_HEADER, ClientDisconnected, has_body

log = logging.getLogger("tierstore.workers")

_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
    "expect",  # the worker's server answered 100-continue when the body was asked for
})
# A client's own CLIENT_HEADER is dropped: the worker adds the address it saw.
_NOT_PASSED_ON = _HOP_BY_HOP | {CLIENT_HEADER}
_NOT_PASSED_BACK = _HOP_BY_HOP | {"date"}


class Forwarder:
    """One aiohttp session on the writer's socket, its connections kept alive."""

    def __init__(self, socket_path: str, connections: int = 64) -> None:
        self._path = socket_path
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self._path, limit=self._connections),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def forward(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Pass one request on and its answer back.

        Before anything was sent back, raises S3Error: ServiceUnavailable when
        the writer cannot be reached, RequestTimeout when the client's body
        stalled; ClientDisconnected when the client left."""
        assert self._session is not None
        raw_path = scope.get("raw_path") or scope["path"].encode()
        target = raw_path.decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]
                   if name.lower().decode("latin-1") not in _NOT_PASSED_ON]
        if scope.get("client"):  # for the writer's access log (it sees a Unix socket)
            headers.append((CLIENT_HEADER, scope["client"][0]))
        body = _Body(receive) if has_body(scope) else None
        try:
            response = await self._session.request(
                scope["method"], URL("http://writer" + target, encoded=True), headers=headers,
                data=body.chunks() if body is not None else None, allow_redirects=False,
            )
        except Exception as exc:
            if body is not None and body.failed is not None:  # the client stalled (RequestTimeout) or left
                raise body.failed from exc
            if not isinstance(exc, (aiohttp.ClientError, OSError)):
                raise
            log.warning("passing %s %s to the writer failed: %s", scope["method"], target, exc)
            raise S3Error("ServiceUnavailable", "The gateway's writer process is unavailable; retry shortly.") \
                from exc
        async with response:
            back = [(name, value) for name, value in response.raw_headers
                    if name.lower().decode("latin-1") not in _NOT_PASSED_BACK]
            if body is not None and not body.done:
                # Answered before the body was all read (an early refusal): the
                # client connection's next bytes are unknowable, as in S3App.
                back.append((b"connection", b"close"))
            await send({"type": "http.response.start", "status": response.status, "headers": back})
            if scope["method"] != "HEAD":
                async for chunk in response.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Body:
    """The client's request body as it streams on: whether it was all read,
    and the client's own failure (a stall, a disconnect) if it ended one."""

    def __init__(self, receive: Any) -> None:
        self._receive = receive
        self.done = False
        self.failed: S3Error | ClientDisconnected | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnected()
                if chunk := message.get("body", b""):
                    yield chunk
                if not message.get("more_body", False):
                    self.done = True
                    return
        except (S3Error, ClientDisconnected) as exc:
            self.failed = exc
            raise
