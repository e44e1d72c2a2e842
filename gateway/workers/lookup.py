"""Object lookups for read workers, answered by the writer over a Unix socket.

A read worker (``gateway.workers.worker``) serves hot GETs and HEADs itself, but
the index, the hot tier's bookkeeping and the epochs stay in the writer: the
worker asks the writer where an object's bytes are, and the writer answers
from its index, records the hit and moves the epoch readers, as for a read
of its own. An answer is the object's record and the hot-tier files that
hold all its bytes; "elsewhere" when some are not hot or a mounted object
is due for revalidation (the worker then passes the whole request to the
writer); or the
S3 error of a missing bucket or key. Being the writer's answer, it is never
stale: a PUT the writer acknowledged is found by the next lookup.

Wire format, both ways: a 4-byte big-endian length, then a msgpack array.
A request is a :class:`Lookup` ``[id, bucket, key, read]``; its answer a
``tiering.reads.plan.Location`` ``[id, record, files, missing, until_ms]``
(record and files when all the bytes are hot, ``missing`` naming
NoSuchBucket or NoSuchKey, or neither: the writer serves it). Requests are
pipelined on one connection; answers come back as they are ready.

A worker keeps hot answers and serves later GETs of the key from them while
no write of the key happened (``tiering/index/generations.py``); it tells the
writer about those reads instead: ``["reads", [[bucket, key, names], ...]]``
(names: the hot files' names), which the writer takes as a lookup with
``read`` (``ObjectService.observe_reads``).

The same connection carries, the other way round and unanswered,
``["ready"]`` once the worker listens, and the requests a worker served,
``["served", [[op, status, tier, seconds, received, sent, hot, capacity,
batched, user], ...]]`` about once a second, which the writer adds to its
metrics: ``/metrics`` and ``/stats`` count every process.

The writer pushes the identities document (``tiering/identity``: users,
keys, policies, secrets still sealed) as ``["identities", document]`` when
a worker connects and whenever it changes, so a worker authorises a GET as
the writer would, a change included at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack

from gateway.observability.metrics import Metrics
from tiering.errors import TierstoreError
from tiering.identity.store import Identities
from tiering.objects import ObjectService
from tiering.reads.plan import Location

log = logging.getLogger("tierstore.workers")

_LENGTH = struct.Struct(">I")
_MAX_FRAME = 16 * 1024 * 1024  # a record of a 10,000-part object is well below
_READ_SIZE = 256 * 1024


class Lookup(NamedTuple):
    """A worker's question: where are the bytes of bucket/key? (``read``: for
    a GET, which counts as a read of the cache and moves epoch readers)."""

    id: int
    bucket: str
    key: str
    read: bool


class Elsewhere(Exception):
    """The worker cannot serve this request from the hot tier: the writer must."""


class _Frames:
    """Bytes as they arrive on a lookup socket, cut into messages."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[list[Any]]:
        """The messages ``data`` completes; ValueError on an oversized frame."""
        self._buffer += data
        messages = []
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length > _MAX_FRAME:
                raise ValueError(f"lookup frame of {length} bytes")
            end = _LENGTH.size + length
            if len(self._buffer) < end:
                break
            messages.append(msgpack.unpackb(self._buffer[_LENGTH.size : end], raw=False))
            del self._buffer[:end]
        return messages


def _frame(message: list[Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return _LENGTH.pack(len(body)) + body


class LookupServer:
    """The writer's side: answers lookups from its ObjectService, and adds
    the requests workers report to ``metrics``.

    The lookups that arrived together (one read from the socket) are
    answered together, with one call into the thread pool: a busy worker
    pipelines many, and a pool handoff each would cost the writer more than
    the index reads themselves."""

    def __init__(self, service: ObjectService, metrics: Metrics, identities: Identities | None = None) -> None:
        self._service = service
        self._metrics = metrics
        self._identities = identities
        if identities is not None:
            identities.subscribe(self._push_identities)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()
        self.ready = 0  # workers that said they listen, since the start
        self._readied = asyncio.Event()

    def served(self, rows: list[list[Any]]) -> None:
        """Requests a worker answered (``Metrics.observe``'s arguments each)."""
        for row in rows:
            self._metrics.observe(*row)

    def kept_reads(self, reads: list[tuple[str, str, list[str]]]) -> None:
        """GETs a worker answered from lookups it kept."""
        self._service.observe_reads(reads)
        self._metrics.worker_reads(0, len(reads))

    def _push_identities(self, document: bytes) -> None:
        for connection in list(self._connections):
            connection.push_identities(document)

    def identities(self) -> bytes | None:
        """The identities document a new connection is sent first (None: none kept here)."""
        return self._identities.raw if self._identities is not None else None

    def worker_ready(self) -> None:
        self.ready += 1
        self._readied.set()

    async def wait_ready(self, count: int, timeout: float) -> None:
        """Until ``count`` workers in all have said they listen (TimeoutError)."""
        async with asyncio.timeout(timeout):
            while self.ready < count:
                self._readied.clear()
                await self._readied.wait()

    async def start(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Connection(self), path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.close()
        tasks = [t for c in self._connections for t in c.batches]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def answer(self, lookups: list[Lookup]) -> list[bytes]:
        try:
            found = await self._service.locate_many([(q.bucket, q.key, q.read) for q in lookups])
        except (TierstoreError, OSError) as exc:  # the writer answers these requests itself
            log.warning("lookups failed (%s); passing %d requests on", exc, len(lookups))
            found = [Location()] * len(lookups)
        self._metrics.worker_reads(sum(1 for q, where in zip(lookups, found, strict=True)
                                       if q.read and where.record is not None), 0)
        return [_frame([q.id, where.record, where.files, where.missing, where.until_ms])
                for q, where in zip(lookups, found, strict=True)]


class _Connection(asyncio.Protocol):
    """One worker's connection: frames parsed as they arrive, answered in batches."""

    def __init__(self, server: LookupServer) -> None:
        self._server = server
        self._frames = _Frames()
        self._transport: asyncio.Transport | None = None
        self.batches: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._server._connections.add(self)  # noqa: SLF001
        document = self._server.identities()
        if document is not None:
            self.push_identities(document)

    def push_identities(self, document: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(_frame(["identities", document]))

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.discard(self)  # noqa: SLF001
        for task in self.batches:
            task.cancel()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._frames.feed(data)
        except ValueError as exc:
            log.warning("read worker sent %s; closing its lookup connection", exc)
            self.close()
            return
        requests: list[Lookup] = []
        for message in messages:
            if message[0] == "reads":
                self._server.kept_reads(message[1])
            elif message[0] == "served":
                self._server.served(message[1])
            elif message[0] == "ready":
                self._server.worker_ready()
            else:
                requests.append(Lookup(*message))
        if requests:
            task = asyncio.ensure_future(self._answer(requests))
            self.batches.add(task)
            task.add_done_callback(self.batches.discard)

    async def _answer(self, requests: list[Lookup]) -> None:
        frames = await self._server.answer(requests)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.writelines(frames)


class LookupClient:
    """The worker's side: one connection to the writer, requests pipelined."""

    def __init__(self, path: str, on_identities: Callable[[bytes], None] | None = None) -> None:
        self._path = path
        self._on_identities = on_identities  # called with each identities document the writer pushes
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[list[Any]]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self.lost = asyncio.Event()  # set when the writer closed the socket

    async def start(self) -> None:
        reader, self._writer = await asyncio.open_unix_connection(self._path)
        self._reading = asyncio.create_task(self._read(reader), name="lookup answers")

    async def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
        if self._writer is not None:
            self._writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            frames = _Frames()
            while data := await reader.read(_READ_SIZE):
                for answer in frames.feed(data):
                    if answer[0] == "identities":
                        if self._on_identities is not None:
                            self._on_identities(answer[1])
                        continue
                    future = self._waiting.pop(answer[0], None)
                    if future is not None and not future.done():
                        future.set_result(answer)
        finally:
            # The writer is gone: every lookup waiting, and every later one, fails.
            self._writer = None
            self.lost.set()
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(ConnectionError("the writer process closed the lookup socket"))
            self._waiting.clear()

    def report_ready(self) -> None:
        """Tell the writer this worker listens on the S3 port."""
        if self._writer is not None:
            self._writer.write(_frame(["ready"]))

    def report_reads(self, reads: list[tuple[str, str, list[str]]]) -> None:
        """Tell the writer about GETs answered from kept lookups."""
        if self._writer is not None and reads:
            self._writer.write(_frame(["reads", reads]))

    def report_served(self, rows: list[tuple[Any, ...]]) -> None:
        """Tell the writer about requests served here (for its metrics)."""
        if self._writer is not None and rows:
            self._writer.write(_frame(["served", rows]))

    async def locate(self, bucket: str, key: str, read: bool) -> Location:
        """Where the writer finds the bytes of ``bucket/key`` (Elsewhere when
        the writer is gone: passing the request on then says so, 503)."""
        if self._writer is None:
            raise Elsewhere()
        request_id = next(self._ids)
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            self._writer.write(_frame(list(Lookup(request_id, bucket, key, read))))
            _, record, files, missing, until_ms = await future
        except ConnectionError:
            raise Elsewhere() from None
        finally:
            self._waiting.pop(request_id, None)
        return Location(record, tuple((path, offset, size) for path, offset, size in files), missing, until_ms)
