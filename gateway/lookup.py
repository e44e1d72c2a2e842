"""Object lookups for read workers, answered by the writer over a Unix socket.

A read worker (``gateway.worker``) serves hot GETs and HEADs itself, but
the index, the hot tier's bookkeeping and the epochs stay in the writer: the
worker asks the writer where an object's bytes are, and the writer answers
from its index, records the hit and moves the epoch readers, as for a read
of its own. An answer is the object's record and the hot-tier files that
hold all its bytes; "elsewhere" when some are not hot or the bucket is
mounted (the worker then passes the whole request to the writer); or the
S3 error of a missing bucket or key. Being the writer's answer, it is never
stale: a PUT the writer acknowledged is found by the next lookup.

Wire format, both ways: a 4-byte big-endian length, then a msgpack array.
Request ``[id, bucket, key, read]``; answer ``[id, "hot", record, files]``,
``[id, "elsewhere"]`` or ``[id, "error", code, key]``. Requests are
pipelined on one connection; answers come back as they are ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from typing import Any

import msgpack

from tiering.errors import NoSuchBucket, NoSuchKey, TierstoreError
from tiering.meta import ObjectMeta
from tiering.objects import ObjectService

log = logging.getLogger("tierstore.workers")

_LENGTH = struct.Struct(">I")
_MAX_FRAME = 16 * 1024 * 1024  # a record of a 10,000-part object is well below


class Elsewhere(Exception):
    """The worker cannot serve this request from the hot tier: the writer must."""


async def _read_frame(reader: asyncio.StreamReader) -> list[Any] | None:
    try:
        head = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError:
        return None
    (length,) = _LENGTH.unpack(head)
    if length > _MAX_FRAME:
        raise ValueError(f"lookup frame of {length} bytes")
    return msgpack.unpackb(await reader.readexactly(length), raw=False)


def _frame(message: list[Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return _LENGTH.pack(len(body)) + body


class LookupServer:
    """The writer's side: answers lookups from its ObjectService."""

    def __init__(self, service: ObjectService) -> None:
        self._service = service
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, path: str) -> None:
        self._server = await asyncio.start_unix_server(self._connection, path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        answers: set[asyncio.Task[None]] = set()
        try:
            while (request := await _read_frame(reader)) is not None:
                answer = asyncio.create_task(self._answer(writer, *request))
                answers.add(answer)
                answer.add_done_callback(answers.discard)
        except (ConnectionError, ValueError, asyncio.IncompleteReadError) as exc:
            log.warning("read worker connection dropped: %s", exc)
        finally:
            for answer in answers:
                answer.cancel()
            writer.close()
            self._tasks.discard(task)

    async def _answer(self, writer: asyncio.StreamWriter, request_id: int, bucket: str, key: str,
                      read: bool) -> None:
        try:
            found = await self._service.locate(bucket, key, read)
        except (NoSuchKey, NoSuchBucket) as exc:
            message: list[Any] = [request_id, "error", type(exc).__name__, key]
        except (TierstoreError, OSError) as exc:  # anything else: the writer answers it itself
            log.debug("lookup %s/%s: %s; the writer serves it", bucket, key, exc)
            message = [request_id, "elsewhere"]
        else:
            if found is None:
                message = [request_id, "elsewhere"]
            else:
                meta, files = found
                message = [request_id, "hot", meta.to_bytes(), files]
        if not writer.is_closing():
            writer.write(_frame(message))


class LookupClient:
    """The worker's side: one connection to the writer, requests pipelined."""

    def __init__(self, path: str) -> None:
        self._path = path
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
            while (answer := await _read_frame(reader)) is not None:
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

    async def locate(self, bucket: str, key: str, read: bool) -> tuple[ObjectMeta, list[tuple[str, int]]]:
        """The record and hot files of ``bucket/key``; raises Elsewhere, or
        NoSuchBucket / NoSuchKey as the writer found."""
        if self._writer is None:
            raise ConnectionError("no lookup connection to the writer process")
        request_id = next(self._ids)
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            self._writer.write(_frame([request_id, bucket, key, read]))
            answer = await future
        finally:
            self._waiting.pop(request_id, None)
        kind = answer[1]
        if kind == "hot":
            return ObjectMeta.from_bytes(answer[2]), [(path, size) for path, size in answer[3]]
        if kind == "error":
            if answer[2] == "NoSuchBucket":
                raise NoSuchBucket(BucketName=bucket)
            raise NoSuchKey(Key=answer[3])
        raise Elsewhere()
