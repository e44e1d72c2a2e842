"""GETs over kept-alive HTTP/1.1 connections: the capacity store's ranged
GETs and listings, with nothing around them.

A cold read's store GET went through aiohttp's client: about 130 us of the
event loop's CPU per request here (its request and response objects,
timers, connector bookkeeping), more than the HTTP it speaks. This sends a
request line and headers it is given (signed by the caller), parses the
answer with httptools (the parser uvicorn uses), and keeps the connection
for the next GET unless the store closes it.

- **Connections**: at most ``connections`` at once; idle ones are reused
  last-in first-out. A reused connection that the store closed before
  answering (it timed the idle connection out just as it was taken) is
  replaced by a new one once: a GET is safe to send again.
- **Timeouts**: ``connect_timeout`` to open a connection (TLS included),
  ``read_timeout`` of silence while waiting for the answer's bytes
  (``TimeoutError``); a connection that failed or timed out is closed.
- **Errors**: a connection closed before the answer's end raises
  ``ConnectionResetError``; bytes that are not HTTP raise ``BadAnswer``
  (an ``OSError``); the caller's retry policy treats every ``OSError`` and
  ``TimeoutError`` as a transport failure.

Proxies are not spoken here: a store reached through an HTTP proxy keeps
aiohttp (``tiering/capacity/s3_get.py``).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping

import httptools


class BadAnswer(ConnectionError):
    """The store's bytes are not an HTTP answer."""


class _Stale(ConnectionError):
    """The connection closed before any byte of the answer."""


class _Connection(asyncio.Protocol):
    """One connection: one GET at a time, its answer collected whole."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._started = False  # a byte of the current answer arrived
        self._last = 0.0  # when bytes last arrived
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._keep_alive = False

    # -- asyncio.Protocol ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._started = True
        self._last = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadAnswer(f"the store sent what is not an HTTP answer: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            if self._status and "content-length" not in self._headers and \
                    "transfer-encoding" not in self._headers:
                self._waiter.set_result(None)  # a body that ends where the connection does
            elif not self._started:
                self._fail(_Stale("the store closed the connection before answering"))
            else:
                self._fail(ConnectionResetError("the store closed the connection in the middle of its answer"))

    # -- httptools callbacks ------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self._headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- use ------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    async def get(self, request: bytes, read_timeout: float) -> tuple[int, dict[str, str], bytes, bool]:
        """Send ``request``; the answer's status, headers (lower-case names),
        body and whether the connection may carry another request."""
        assert self._transport is not None
        self._status, self._headers, self._body = 0, {}, []
        self._started = False
        self._last = self._loop.time()
        waiter = self._waiter = self._loop.create_future()
        self._transport.write(request)
        timer = self._loop.call_later(read_timeout, self._check_silence, read_timeout)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        return self._status, self._headers, body, self._keep_alive and not self.closed

    def _check_silence(self, read_timeout: float) -> None:
        """Fires ``read_timeout`` after the request, then again after each
        silence that could still end in time: a timeout only after that long
        without a byte."""
        if self._waiter is None or self._waiter.done():
            return
        quiet = self._loop.time() - self._last
        if quiet >= read_timeout:
            self._fail(TimeoutError(f"the store sent nothing for {read_timeout:g}s"))
            self.close()
        else:
            self._loop.call_later(read_timeout - quiet, self._check_silence, read_timeout)


class HttpGetPool:
    """Connections to one store (``host``:``port``, TLS with ``tls``)."""

    def __init__(self, host: str, port: int, *, tls: ssl.SSLContext | None, connections: int,
                 connect_timeout: float, read_timeout: float) -> None:
        self._host = host
        self._port = port
        self._tls = tls
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._slots = asyncio.Semaphore(connections)
        self._idle: list[_Connection] = []

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    async def get(self, target: str, headers: Mapping[str, str], method: str = "GET",
                  body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        """GET ``target`` (path and query, encoded) with ``headers`` (Host
        among them): the status, headers (lower-case names) and body. Or
        another ``method`` with a small ``body`` (sent whole, its length
        in ``headers``), whose answer is read the same way."""
        request = "".join([f"{method} {target} HTTP/1.1\r\n", *(f"{k}: {v}\r\n" for k, v in headers.items()),
                           "\r\n"]).encode("latin-1") + body
        async with self._slots:
            while True:
                connection, reused = self._take()
                if connection is None:
                    connection = await self._connect()
                try:
                    status, received, body, again = await connection.get(request, self._read_timeout)
                except _Stale:
                    connection.close()
                    if reused:
                        continue  # timed out idle by the store: a new connection
                    raise ConnectionResetError("the store closed a new connection before answering") from None
                except BaseException:
                    connection.close()  # failed, timed out or cancelled mid-answer: not reusable
                    raise
                if again:
                    self._idle.append(connection)
                else:
                    connection.close()
                return status, received, body

    def _take(self) -> tuple[_Connection | None, bool]:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection, True
        return None, False

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, connection = await asyncio.wait_for(
            loop.create_connection(lambda: _Connection(loop), self._host, self._port, ssl=self._tls,
                                   server_hostname=self._host if self._tls is not None else None),
            self._connect_timeout,
        )
        return connection
