"""A TCP proxy on 127.0.0.1 that adds latency and counts HTTP requests.

``DelayProxy(target_port, delay_s=0.010)`` listens on a free loopback port
and forwards every connection to ``127.0.0.1:target_port``. Every chunk of
data, in both directions, is held back ``delay_s`` seconds before it is
written on: 10 ms each way adds about 20 ms to a round trip. The delay is a
pipeline, not a pause: each direction of a connection keeps a queue of
(due time, chunk) and one timer writes whatever is due, while reading goes
on. Throughput is therefore not capped at chunk/latency. What a direction
may hold in its queue is its ``window`` (64 MiB by default, more than a
loopback stream fills in 10 ms): past it, reading pauses until the queue
drains, which is back-pressure, not a limit. A small ``window`` does limit:
one stream then carries at most ``window / delay_s`` bytes a second, as a
TCP connection whose window is that size would over a long link, while
parallel connections each get their own. ``rate_down`` (bytes a second, 0
by default: none) caps what the target sends over all connections
together, as a store's shared link would.

The client-to-server byte stream is also parsed just enough to count HTTP/1.1
requests by method (``proxy.counts["PUT"]``) and by S3 operation as guessed
from method and query string (``proxy.operations["UploadPart"]``): request
line and headers, then the body skipped by ``Content-Length``, or chunk by
chunk for ``Transfer-Encoding: chunked``. Keep-alive connections carry many
requests; each is counted when its header block is complete. A header block
that never ends within 1 MiB stops the counting on that connection (it is
then reported in ``proxy.unparsed``) but not the forwarding. One case is
miscounted: a request sent with ``Expect: 100-continue`` whose body the
server refuses before it is sent (the following request would be taken for
that body). It takes a server that refuses a request from its head alone,
such as a 403, on a connection it keeps open.

From Python (the event loop runs in a background thread)::

    with DelayProxy(9000, delay_s=0.010) as proxy:
        use(proxy.endpoint)                  # http://127.0.0.1:<proxy.port>
        print(proxy.snapshot())              # counts by method and operation, bytes
        proxy.reset()                        # zero the counters
        proxy.delay_s = 0.0                  # applies to data read from now on

From a shell (Ctrl-C prints the counts)::

    python benchmarks/delay_proxy.py --target 9000 --delay-ms 10 [--port 9001] [--window-kib 512]

Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import signal
import sys
import threading
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

HOST = "127.0.0.1"
MAX_BUFFER = 64 * 1024 * 1024  # default window: bytes held per direction before reading pauses
MAX_HEADER = 1024 * 1024  # a request head longer than this stops the counting
_TRANSPORT_HIGH = 4 * 1024 * 1024  # write buffer limits of each socket
_TRANSPORT_LOW = 1024 * 1024


# -- request counting ---------------------------------------------------------


def s3_operation(method: str, target: str) -> str:
    """The S3 operation an HTTP request most likely is, from its method and
    query string (path-style or virtual-host, it does not matter)."""
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    key = parts.path.strip("/").count("/") >= 1  # /bucket/key vs /bucket
    if method == "PUT":
        if "partNumber" in query and "uploadId" in query:
            return "UploadPart"
        return "PutObject" if key else "CreateBucket"
    if method == "POST":
        if "uploads" in query:
            return "CreateMultipartUpload"
        if "uploadId" in query:
            return "CompleteMultipartUpload"
        return "DeleteObjects" if "delete" in query else "POST"
    if method == "GET":
        if not key:
            return "ListObjects" if parts.path.strip("/") else "ListBuckets"
        return "ListParts" if "uploadId" in query else "GetObject"
    if method == "HEAD":
        return "HeadObject" if key else "HeadBucket"
    if method == "DELETE":
        if "uploadId" in query:
            return "AbortMultipartUpload"
        return "DeleteObject" if key else "DeleteBucket"
    return method


class RequestCounter:
    """Follows one client-to-server HTTP/1.1 byte stream and reports each
    request's (method, target) to ``on_request`` as its head completes.

    States: reading a request head; skipping a Content-Length body; reading
    a chunk-size line, skipping a chunk (plus its CRLF), reading trailers of
    a chunked body. Fed arbitrary slices of the stream."""

    def __init__(self, on_request: Callable[[str, str], None]) -> None:
        self._on_request = on_request
        self._buffer = bytearray()
        self._state = "head"
        self._skip = 0  # body or chunk bytes still to pass over
        self.lost = False  # gave up on this stream (unparseable head)

    def feed(self, data: bytes) -> None:
        if self.lost:
            return
        view = memoryview(data)
        while view:
            if self._skip:
                step = min(self._skip, len(view))
                self._skip -= step
                view = view[step:]
                if not self._skip and self._state == "chunk-data":
                    self._state = "chunk-size"
                continue
            self._buffer += view
            view = memoryview(b"")
            rest = self._parse_buffered()
            if rest is None:
                return
            view = memoryview(rest)

    def _parse_buffered(self) -> bytes | None:
        """Consume complete lines or heads from the buffer. Returns the bytes
        that follow once a body or chunk starts (to be skipped), or None when
        more input is needed."""
        while True:
            if self._state == "head":
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buffer) > MAX_HEADER:
                        self.lost, self._buffer = True, bytearray()
                    return None
                head = bytes(self._buffer[:end])
                del self._buffer[: end + 4]
                self._start_request(head)
            elif self._state in ("chunk-size", "trailers"):
                end = self._buffer.find(b"\r\n")
                if end < 0:
                    if len(self._buffer) > MAX_HEADER:
                        self.lost, self._buffer = True, bytearray()
                    return None
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 2]
                self._chunk_line(line)
            if self._skip:
                rest, self._buffer = bytes(self._buffer), bytearray()
                return rest

    def _start_request(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        while lines and not lines[0]:  # stray CRLFs between requests (RFC 9112 2.2)
            lines.pop(0)
        if not lines:
            return
        request_line = lines[0].decode("latin-1").split(" ")
        method = request_line[0].upper()
        target = request_line[1] if len(request_line) > 1 else "/"
        self._on_request(method, target)
        length, chunked = 0, False
        for line in lines[1:]:
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                with contextlib.suppress(ValueError):
                    length = int(value.strip())
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        if chunked:  # RFC 9112 6.3: chunked wins over Content-Length
            self._state = "chunk-size"
        else:
            self._state, self._skip = "head", length

    def _chunk_line(self, line: bytes) -> None:
        if self._state == "trailers":
            if not line:  # the empty line that ends the chunked body
                self._state = "head"
            return
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            self.lost, self._buffer = True, bytearray()
            return
        if size == 0:
            self._state = "trailers"
        else:
            self._state, self._skip = "chunk-data", size + 2  # data, then CRLF


# -- forwarding ---------------------------------------------------------------


class _Pipe:
    """One direction of one connection: chunks read from ``src`` are written
    to ``dst`` once their due time (arrival + delay) has come, in order."""

    def __init__(self, conn: _Connection, src: asyncio.Transport) -> None:
        self._conn = conn
        self._loop = conn.proxy.loop
        self._src = src
        self._dst: asyncio.Transport | None = None
        self._queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self._queued = 0
        self._timer: asyncio.TimerHandle | None = None
        self._eof = False
        self.done = False  # EOF passed on after the last byte
        self._dst_full = False
        self._reading_paused = False
        self.counter: RequestCounter | None = None

    def connect(self, dst: asyncio.Transport) -> None:
        self._dst = dst
        self._flush()

    def feed(self, data: bytes, down: bool = False) -> None:
        if self.counter is not None:
            self.counter.feed(data)
        proxy = self._conn.proxy
        due = self._loop.time() + proxy.delay_s
        if down and proxy.rate_down:
            # One link from the target, shared by every connection: the
            # chunk leaves once the ones before it have.
            due = proxy.link_free = max(due, proxy.link_free) + len(data) / proxy.rate_down
        self._queue.append((due, data))
        self._queued += len(data)
        self._flush()

    def end(self) -> None:
        """The source closed (EOF or lost): pass that on after the data."""
        self._eof = True
        self._flush()

    def dst_full(self, full: bool) -> None:
        self._dst_full = full
        self._pressure()

    def _flush(self) -> None:
        self.cancel()
        dst = self._dst
        if dst is None or dst.is_closing():
            return
        now = self._loop.time()
        while self._queue and self._queue[0][0] <= now:
            _, data = self._queue.popleft()
            self._queued -= len(data)
            dst.write(data)
        if self._queue:
            self._timer = self._loop.call_at(self._queue[0][0], self._flush)
        elif self._eof and not self.done:
            self.done = True
            self._conn.pipe_done(dst)
        self._pressure()

    def _pressure(self) -> None:
        """Pause reading while too much is held (queue or socket buffer)."""
        if self._src.is_closing():
            return
        full = self._dst_full or self._queued >= self._conn.proxy.window
        if full and not self._reading_paused:
            self._reading_paused = True
            self._src.pause_reading()
        elif not full and self._reading_paused:
            self._reading_paused = False
            self._src.resume_reading()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Side(asyncio.Protocol):
    """One socket of a proxied connection: what it reads goes into ``out``
    (towards the other socket); ``back`` is the pipe that writes to it."""

    def __init__(self, conn: _Connection, on_made: Callable[[], None] | None = None) -> None:
        self.conn = conn
        self.on_made = on_made
        self.transport: asyncio.Transport | None = None
        self.out: _Pipe | None = None
        self.back: _Pipe | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(_TRANSPORT_HIGH, _TRANSPORT_LOW)
        self.out = _Pipe(self.conn, transport)
        if self.on_made is not None:
            self.on_made()

    def data_received(self, data: bytes) -> None:
        assert self.out is not None
        proxy = self.conn.proxy
        if self is self.conn.client:
            proxy.bytes_up += len(data)
            self.out.feed(data)
        else:
            proxy.bytes_down += len(data)
            self.out.feed(data, down=True)

    def eof_received(self) -> bool:
        assert self.out is not None
        self.out.end()
        return True  # keep the socket open for the other direction

    def pause_writing(self) -> None:
        if self.back is not None:
            self.back.dst_full(True)

    def resume_writing(self) -> None:
        if self.back is not None:
            self.back.dst_full(False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.out is not None:
            self.out.end()
        self.conn.side_lost()


class _Connection:
    """A client connection and its upstream connection to the target.

    A half-close is passed on (``write_eof``); once both directions have
    ended, both sockets are closed."""

    def __init__(self, proxy: DelayProxy) -> None:
        self.proxy = proxy
        self.client = _Side(self, on_made=self._client_made)
        self.upstream = _Side(self)

    def _client_made(self) -> None:
        # The client's bytes queue in its pipe until the upstream is there.
        assert self.client.out is not None
        self.client.out.counter = RequestCounter(self.proxy.note_request)
        self.proxy.loop.create_task(self._open_upstream())

    async def _open_upstream(self) -> None:
        client, up = self.client, self.upstream
        assert client.transport is not None and client.out is not None
        try:
            await self.proxy.loop.create_connection(lambda: up, HOST, self.proxy.target_port)
        except OSError:
            client.transport.abort()
            return
        assert up.transport is not None and up.out is not None
        client.back, up.back = up.out, client.out
        up.out.connect(client.transport)
        client.out.connect(up.transport)

    def pipe_done(self, dst: asyncio.Transport) -> None:
        pipes = [s.out for s in (self.client, self.upstream)]
        if all(p is not None and p.done for p in pipes):
            self.close()
        elif dst.can_write_eof():
            dst.write_eof()
        else:
            dst.close()

    def close(self) -> None:
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.close()

    def abort(self) -> None:
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.abort()

    def side_lost(self) -> None:
        """Once both sockets are gone (or the upstream never came), stop the
        timers and let the proxy forget the connection."""
        up = self.upstream
        if self.client.lost and (up.lost or up.transport is None):
            for side in (self.client, up):
                if side.out is not None:
                    side.out.cancel()
            self.proxy.connection_done(self)
        elif self.client.lost and not up.lost and up.transport is not None:
            # The client is gone; anything the target still sends has nowhere to go.
            if up.out is not None and self.client.out is not None and self.client.out.done:
                up.transport.close()


class DelayProxy:
    """A latency-adding, request-counting TCP proxy in a background thread.

    ``port`` is where it listens (a free one unless given); ``counts`` and
    ``operations`` are ``collections.Counter`` objects of the requests seen
    since the start or the last ``reset()``; ``bytes_up``/``bytes_down``
    count payload bytes towards and from the target."""

    def __init__(
        self, target_port: int, delay_s: float = 0.0, port: int = 0, window: int | None = None
    ) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        self.port = port
        # Bytes held in the delay line per direction of a connection before
        # reading pauses; None: MAX_BUFFER, large enough not to limit anything.
        self.window = window or MAX_BUFFER
        # Bytes per second the target sends in all, over all connections (a
        # store's link shared by every client); 0: not limited.
        self.rate_down = 0.0
        self.link_free = 0.0  # loop time when the shared link is next free
        self.counts: collections.Counter[str] = collections.Counter()
        self.operations: collections.Counter[str] = collections.Counter()
        # (operation, path without the query): which objects were asked for.
        self.paths: collections.Counter[tuple[str, str]] = collections.Counter()
        # ListObjects by (path, prefix): what a listing asked for, which its path alone does not say.
        self.listed: collections.Counter[tuple[str, str]] = collections.Counter()
        self.unparsed = 0  # connections whose requests could not all be counted
        self.connections = 0  # accepted since the start or reset()
        self.bytes_up = 0  # towards the target
        self.bytes_down = 0  # from the target
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._open: set[_Connection] = set()

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def note_request(self, method: str, target: str) -> None:
        self.counts[method] += 1
        operation = s3_operation(method, target)
        self.operations[operation] += 1
        parts = urlsplit(target)
        self.paths[operation, parts.path] += 1
        if operation == "ListObjects":
            self.listed[parts.path, parse_qs(parts.query).get("prefix", [""])[0]] += 1

    def reset(self) -> None:
        """Zero the counters (from any thread; applied on the proxy's loop)."""
        self._call(self._reset)

    def _reset(self) -> None:
        self.counts.clear()
        self.operations.clear()
        self.paths.clear()
        self.listed.clear()
        self.bytes_up = self.bytes_down = 0
        self.connections = 0

    def requests_to(self, operation: str, fragment: str) -> int:
        """How many ``operation`` requests named a path containing ``fragment``."""
        return self._call(lambda: sum(n for (op, path), n in self.paths.items()
                                      if op == operation and fragment in path))

    def snapshot(self) -> dict[str, object]:
        """A consistent copy of the counters."""
        return self._call(
            lambda: {
                "methods": dict(self.counts),
                "operations": dict(self.operations),
                "bytes": {"up": self.bytes_up, "down": self.bytes_down},
                "connections": self.connections,
            }
        )

    def _call(self, fn: Callable[[], object]):  # type: ignore[no-untyped-def]
        if self._thread is None or threading.current_thread() is self._thread:
            return fn()
        return asyncio.run_coroutine_threadsafe(_as_coroutine(fn), self.loop).result(10)

    # -- lifecycle ------------------------------------------------------------

    async def serve(self) -> None:
        """Start listening (on the current loop, which must be ``self.loop``)."""

        def accept() -> _Side:
            conn = _Connection(self)
            self._open.add(conn)
            self.connections += 1
            return conn.client

        self._server = await self.loop.create_server(accept, HOST, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    def connection_done(self, conn: _Connection) -> None:
        self._open.discard(conn)
        counter = conn.client.out.counter if conn.client.out is not None else None
        self.unparsed += counter is not None and counter.lost

    async def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._open):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()

    def start(self) -> DelayProxy:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(self.serve())
            except BaseException as exc:  # noqa: BLE001  reported to the caller
                failure.append(exc)
                started.set()
                return
            started.set()
            self.loop.run_forever()

        self._thread = threading.Thread(target=run, name="delay-proxy", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self._thread = None
        self.loop.close()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _as_coroutine(fn: Callable[[], object]) -> object:
    return fn()


# -- command line -------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=int, required=True, help="port on 127.0.0.1 to forward to")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    ap.add_argument("--delay-ms", type=float, default=10.0,
                    help="one-way delay added in each direction, ms (default 10)")
    ap.add_argument("--window-kib", type=int, default=0,
                    help="bytes in flight per direction of a connection, KiB: caps one "
                         "stream at window/delay, like a TCP window (default: no cap)")
    args = ap.parse_args(argv)

    proxy = DelayProxy(args.target, delay_s=args.delay_ms / 1000, port=args.port,
                       window=args.window_kib * 1024 or None)
    asyncio.set_event_loop(proxy.loop)
    proxy.loop.run_until_complete(proxy.serve())
    print(f"forwarding {proxy.endpoint} -> {HOST}:{args.target}, +{args.delay_ms:g} ms each way"
          " (Ctrl-C to stop)", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        proxy.loop.add_signal_handler(sig, stop.set)
    try:
        proxy.loop.run_until_complete(stop.wait())
        proxy.loop.run_until_complete(proxy.shutdown())
    finally:
        proxy.loop.close()
    print(f"requests by method: {dict(proxy.counts)}", file=sys.stderr)
    print(f"requests by S3 operation: {dict(proxy.operations)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
