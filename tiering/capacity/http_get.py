"""GETs over kept-alive HTTP/1.1 connections: the capacity store's ranged
GETs and listings, with nothing around them.

A cold read's store GET went through aiohttp's client: about 130 us of the
event loop's CPU per request here (its request and response objects,
timers, connector bookkeeping), more than the HTTP it speaks. This sends a
request line and headers it is given (signed by the caller), parses the
answer with httptools (the parser uvicorn uses), and keeps the connection
for the next GET unless the store closes it.

- **Connections**: at most ``connections`` at once; idle ones are reused
  last-in first-out. Pools that share a ``ConnectionBudget`` (a node's
  pools to its peers) also hold at most its ``limit`` open connections
  together: a pool that needs one more when the budget is spent closes the
  connection that has been idle longest in any of them, or waits for one
  to be given back. A reused connection that the store closed before
  answering (it timed the idle connection out just as it was taken) is
  replaced by a new one once: a GET is safe to send again.
- **Timeouts**: ``connect_timeout`` to open a connection (TLS included),
  ``read_timeout`` of silence while waiting for the answer's bytes
  (``TimeoutError``); a connection that failed or timed out is closed.
- **Errors**: a connection closed before the answer's end raises
  ``ConnectionResetError``; bytes that are not HTTP raise ``BadAnswer``
  (an ``OSError``); the caller's retry policy treats every ``OSError`` and
  ``TimeoutError`` as a transport failure.

- **Bodies as they arrive**: with ``on_head``, the caller sees the answer's
  status and headers first and may name an ``Into`` that then receives the
  body's bytes as they arrive (a large extent sent on to a client before
  its last byte came), read by the event loop straight into its buffer;
  otherwise the body is collected whole.

Proxies are not spoken here: a store reached through an HTTP proxy keeps
aiohttp (``tiering/capacity/s3_get.py``).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping

import httptools

from tiering.capacity.store import Into, pour

# Asked once an answer's head is in: (status, headers with lower-case names)
# -> where its body goes as it arrives, or None to collect the body whole.
OnHead = Callable[[int, Mapping[str, str]], "Into | None"]
# Bytes the event loop reads at a time into the read buffer (heads,
# collected bodies, the body bytes that come with a head).
_READ_BUFFER = 256 * 1024
_buffers = threading.local()


def _read_buffer() -> memoryview:
    """The buffer every connection of this thread's event loop reads into.
    One is enough: the loop reads into it and hands the bytes to the
    connection's parser at once (``buffer_updated``), which copies what it
    keeps before the next read. One buffer each cost 256 KiB a connection,
    allocated when it opened and freed when it closed: under a hostile
    mix, where the store closes connections often, that churn left holes
    in the heap that it did not give back (docs/reliability.md)."""
    view: memoryview | None = getattr(_buffers, "view", None)
    if view is None:
        view = _buffers.view = memoryview(bytearray(_READ_BUFFER))
    return view


class BadAnswer(ConnectionError):
    """The store's bytes are not an HTTP answer."""


class _Stale(ConnectionError):
    """The connection closed before any byte of the answer."""


class _Connection(asyncio.BufferedProtocol):
    """One connection: one GET at a time, its answer collected whole, or its
    body received straight into the buffer of an ``Into``.

    A buffered protocol: the event loop reads into a buffer this names
    (``get_buffer``), so no bytes object is made per read. Heads and
    collected bodies go through httptools from the loop's read buffer
    (:func:`_read_buffer`, shared by its connections); a body
    of known length that goes to an ``Into`` is read, past the bytes that
    came with the head, straight into the ``Into``'s buffer, without the
    parser (a new one takes the connection's next answer): no copy of it
    in this process at all."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._read = _read_buffer()
        self._transport: asyncio.Transport | None = None
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._started = False  # a byte of the current answer arrived
        self._last = 0.0  # when bytes last arrived
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._keep_alive = False
        self._on_head: OnHead | None = None
        self._into: Into | None = None
        self._left = -1  # body bytes still due to ``_into``, when its length is known
        self._direct = False  # the rest of the body is read straight into ``_into``

    # -- asyncio.BufferedProtocol -------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._direct:
            assert self._into is not None
            return self._into.buffer()[: self._left]
        return self._read

    def buffer_updated(self, nbytes: int) -> None:
        self._started = True
        self._last = self._loop.time()
        if self._direct:
            assert self._into is not None
            self._into.landed(nbytes)
            self._left -= nbytes
            if not self._left:
                self._direct = False
                self._parser = httptools.HttpResponseParser(self)  # the old one is mid-body
                self.on_message_complete()
            return
        try:
            self._parser.feed_data(self._read[:nbytes])
        except httptools.HttpParserError as exc:
            self._fail(BadAnswer(f"the store sent what is not an HTTP answer: {exc}"))
            self.close()
            return
        # The rest of a body of known length that goes to an Into: straight there.
        self._direct = self._into is not None and self._left > 0 and not self._done()

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
        # The parser refers back to this connection: a cycle only the collector's rarely run
        # older generations would free (docs/reliability.md). Nothing reads once the connection is gone.
        self._parser = None  # type: ignore[assignment]

    # -- httptools callbacks ------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self._headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()
        if self._on_head is not None and self._status < 300:
            self._into = self._on_head(self._status, self._headers)
            length = self._headers.get("content-length", "")
            if self._into is not None and length.isdigit():
                self._left = int(length)

    def on_body(self, body: bytes) -> None:
        if self._into is not None:
            pour(self._into, body)
            self._left -= len(body)
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _done(self) -> bool:
        return self._waiter is None or self._waiter.done()

    # -- use ------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    async def get(self, request: bytes, read_timeout: float,
                  on_head: OnHead | None = None) -> tuple[int, dict[str, str], bytes | None, bool]:
        """Send ``request``; the answer's status, headers (lower-case names),
        body and whether the connection may carry another request. The body
        is None when the ``Into`` that ``on_head`` named for it (an answer
        under 300) took it."""
        assert self._transport is not None
        self._status, self._headers, self._body = 0, {}, []
        self._on_head, self._into, self._left, self._direct = on_head, None, -1, False
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
            sunk, self._on_head, self._into, self._direct = self._into is not None, None, None, False
        body = None if sunk else self._body[0] if len(self._body) == 1 else b"".join(self._body)
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


class ConnectionBudget:
    """Open connections counted across several pools, at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.most = 0  # the most open at once, for tests and the status
        self._idle: OrderedDict[_Connection, HttpGetPool] = OrderedDict()  # longest idle first
        self._freed = asyncio.Event()

    async def take(self) -> None:
        """Count one more connection, once there is room for it."""
        while self.open >= self.limit:
            if self._idle:
                connection, pool = self._idle.popitem(last=False)
                pool.forget(connection)  # closed: the room it held is ours
                continue
            self._freed.clear()
            await self._freed.wait()
        self.open += 1
        self.most = max(self.most, self.open)

    def give_back(self) -> None:
        self.open -= 1
        self._freed.set()

    def resting(self, connection: _Connection, pool: HttpGetPool) -> None:
        """``connection`` of ``pool`` is idle: a pool waiting for room may close it."""
        self._idle[connection] = pool
        self._freed.set()

    def woken(self, connection: _Connection) -> None:
        self._idle.pop(connection, None)


class HttpGetPool:
    """Connections to one store (``host``:``port``, TLS with ``tls``), with
    a ``budget`` shared with other pools when given."""

    def __init__(self, host: str, port: int, *, tls: ssl.SSLContext | None, connections: int,
                 connect_timeout: float, read_timeout: float, budget: ConnectionBudget | None = None) -> None:
        self._host = host
        self._port = port
        self._tls = tls
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._slots = asyncio.Semaphore(connections)
        self._idle: list[_Connection] = []
        self._budget = budget

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            self._drop(connection)

    def forget(self, connection: _Connection) -> None:
        """Close an idle connection the budget takes back."""
        self._idle.remove(connection)
        self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        connection.close()
        if self._budget is not None:
            self._budget.woken(connection)
            self._budget.give_back()

    async def get(self, target: str, headers: Mapping[str, str], method: str = "GET",
                  body: bytes = b"", on_head: OnHead | None = None) -> tuple[int, dict[str, str], bytes | None]:
        """GET ``target`` (path and query, encoded) with ``headers`` (Host
        among them): the status, headers (lower-case names) and body. Or
        another ``method`` with a small ``body`` (sent whole, its length
        in ``headers``), whose answer is read the same way. With
        ``on_head``, an answer under 300 may have its body go to an ``Into``
        as it arrives (then None here); a connection that fails after some
        of it landed raises as any other, the ``Into`` keeping what it got."""
        request = "".join([f"{method} {target} HTTP/1.1\r\n", *(f"{k}: {v}\r\n" for k, v in headers.items()),
                           "\r\n"]).encode("latin-1") + body
        async with self._slots:
            while True:
                connection, reused = self._take()
                if connection is None:
                    connection = await self._connect()
                try:
                    status, received, answer, again = await connection.get(request, self._read_timeout, on_head)
                except _Stale:
                    self._drop(connection)
                    if reused:
                        continue  # timed out idle by the store: a new connection
                    raise ConnectionResetError("the store closed a new connection before answering") from None
                except BaseException:
                    self._drop(connection)  # failed, timed out or cancelled mid-answer: not reusable
                    raise
                if again:
                    self._idle.append(connection)
                    if self._budget is not None:
                        self._budget.resting(connection, self)
                else:
                    self._drop(connection)
                return status, received, answer

    def _take(self) -> tuple[_Connection | None, bool]:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                if self._budget is not None:
                    self._budget.woken(connection)
                return connection, True
            self._drop(connection)
        return None, False

    async def _connect(self) -> _Connection:
        if self._budget is not None:
            await self._budget.take()
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), self._host, self._port, ssl=self._tls,
                                       server_hostname=self._host if self._tls is not None else None),
                self._connect_timeout,
            )
        except BaseException:
            if self._budget is not None:
                self._budget.give_back()
            raise
        return connection
