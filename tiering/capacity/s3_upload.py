"""Multipart uploads to the S3 capacity store, fed as data arrives (a
segment streamed while it is built). Requests go through ``S3Store.call``,
the store's one retrying choke point."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from tiering.admission import ADMISSION
from tiering.capacity.store import CapacityStats
from tiering.errors import CapacityError, CapacityNotFound

log = logging.getLogger("tiering.capacity.s3")

MIN_PART_SIZE = 5 * 1024**2  # S3: every part but the last (EntityTooSmall)
MAX_PART_SIZE = 5 * 1024**3
MAX_PARTS = 10_000
# The checksum every body written to the store carries (x-amz-checksum-crc32c),
# which the store verifies: CRC32C, which botocore computes with awscrt at
# about 0.16 ms per 8 MiB here, against 2.8 ms for its CRC32.
UPLOAD_CHECKSUM = "CRC32C"
# What a part in flight holds, in parts: its bytes and the copy the HTTP
# client makes of them (aiohttp's BytesIOPayload takes the buffer of the
# BytesIO botocore wraps the body in, which copies it). Seen in
# tracemalloc snapshots of the soak's RSS spikes: the flusher's parts in
# flight and their copies were most of each spike, and reserved by
# no one (docs/reliability.md).
PART_COPIES = 2


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


T = TypeVar("T")


class UploadTarget(Protocol):
    """What an upload asks of its store (``S3Store``): its bucket, part size
    and part concurrency, its retrying choke point and client, and a plain
    PUT for an object smaller than one part."""

    bucket: str
    part_size: int
    concurrency: int
    stats: CapacityStats

    def describe(self) -> str: ...

    def client(self) -> Any: ...

    async def call(self, op: str, name: str, fn: Callable[..., Awaitable[T]], *args: Any, **kw: Any) -> T: ...

    async def put(self, name: str, data: bytes | memoryview, **object_args: Any) -> None: ...

    async def size(self, name: str) -> int: ...


class S3Upload:
    """A multipart upload fed part by part as data arrives.

    Writes gather into a buffer; each full ``part_size`` becomes a part upload
    task. At most ``concurrency`` parts are in flight: ``write`` waits for a
    slot, so memory stays under about (concurrency + 1) x part_size, and
    each part in flight reserves what it holds (``PART_COPIES``) from the
    process's admission by bytes. An object
    that never filled one part is sent with a single PUT at ``complete``.
    """

    def __init__(self, store: UploadTarget, name: str, key: str, object_args: dict[str, Any] | None = None) -> None:
        self._store = store
        self._name = name
        self._key = key
        self._object_args = object_args or {}  # ContentType, Metadata, ... of the object
        self._buffer = bytearray()
        self._size = 0
        self._upload_id: str | None = None
        self._checksum: str | None = None  # the upload's part checksum algorithm
        self._next_part = 1
        self._parts: list[dict[str, Any]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(store.concurrency)
        self._failure: BaseException | None = None
        self._state = "open"

    async def write(self, data: bytes | memoryview) -> None:
        await self._check()
        self._buffer += data
        self._size += len(data)
        part_size = self._store.part_size
        try:
            while len(self._buffer) >= part_size:
                with memoryview(self._buffer) as view:
                    chunk = bytes(view[:part_size])
                del self._buffer[:part_size]
                await self._send(chunk)
        except BaseException as exc:
            # A part may be lost (cancelled while waiting for a slot, or its
            # create failed): this upload can only be aborted now.
            if self._failure is None:
                self._failure = CapacityError(
                    f"capacity store {self._store.describe()}: upload {self._name}"
                    f" interrupted: {one_line(exc)}",
                    name=self._name,
                )
            raise

    async def complete(self) -> int:
        await self._check()
        store = self._store
        try:
            if self._upload_id is None:
                # Under one part: a single PUT, also for an empty object.
                data = bytes(self._buffer)
                self._buffer = bytearray()
                await store.put(self._name, data, **self._object_args)
                self._state = "complete"
                return len(data)
            if self._buffer:
                chunk = bytes(self._buffer)  # the last part may be small
                self._buffer = bytearray()
                await self._send(chunk)
            await asyncio.gather(*self._tasks)
            await self._check()
            parts = sorted(self._parts, key=lambda part: part["PartNumber"])
            try:
                await store.call(
                    "complete_multipart_upload",
                    self._name,
                    store.client().complete_multipart_upload,
                    Bucket=store.bucket,
                    Key=self._key,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": parts},
                )
            except CapacityError as exc:
                # A retried Complete whose first try succeeded finds the upload
                # gone (NoSuchUpload); the object then exists with our size.
                if not (
                    exc.detail.get("code") == "NoSuchUpload"
                    and exc.detail.get("attempts", 1) != 1
                    and await self._exists_with_size()
                ):
                    raise
            self._state = "complete"
            self._upload_id = None
            return self._size
        except BaseException:
            await self._abort_quietly()
            raise

    async def abort(self) -> None:
        if self._state != "open":
            return
        self._state = "aborted"
        self._buffer = bytearray()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is None:
            return
        store = self._store
        try:
            await store.call(
                "abort_multipart_upload",
                self._name,
                store.client().abort_multipart_upload,
                Bucket=store.bucket,
                Key=self._key,
                UploadId=upload_id,
            )
        except CapacityError as exc:
            if isinstance(exc, CapacityNotFound) or exc.detail.get("code") == "NoSuchUpload":
                return
            raise

    async def _check(self) -> None:
        """Raise the failure of a part (after aborting), or on a finished upload."""
        if self._failure is not None:
            failure = self._failure
            await self._abort_quietly()
            raise failure
        if self._state != "open":
            raise RuntimeError(f"upload of {self._name!r} is already {self._state}")

    async def _abort_quietly(self) -> None:
        try:
            await self.abort()
        except Exception as exc:  # noqa: BLE001  the original failure matters more
            log.warning("abandoned multipart upload of %s: abort failed: %s", self._name, exc)

    async def _exists_with_size(self) -> bool:
        try:
            return await self._store.size(self._name) == self._size
        except CapacityError:
            return False

    async def _send(self, chunk: bytes) -> None:
        """Start one part upload, after waiting for a free slot."""
        store = self._store
        if self._next_part > MAX_PARTS:
            raise CapacityError(
                f"capacity store {store.describe()}: upload {self._name}: more than"
                f" {MAX_PARTS} parts of {store.part_size} bytes"
            )
        if self._upload_id is None:
            # A checksum per part, as s3transfer does: the store verifies each
            # part and the Complete names each part's checksum. A store that
            # ignores the algorithm does not echo it, and Complete then names none.
            response = await store.call(
                "create_multipart_upload",
                self._name,
                store.client().create_multipart_upload,
                Bucket=store.bucket,
                Key=self._key,
                ChecksumAlgorithm=UPLOAD_CHECKSUM,
                **self._object_args,
            )
            self._upload_id = response["UploadId"]
            self._checksum = response.get("ChecksumAlgorithm")
        await self._slots.acquire()
        if self._failure is not None:
            self._slots.release()
            await self._check()
        # Reserved while the part is in flight (tiering/admission.py): work
        # under way, so it waits its turn a while, then takes them anyway.
        held = PART_COPIES * len(chunk)
        try:
            await ADMISSION.force(held)
        except BaseException:
            self._slots.release()
            raise
        number = self._next_part
        self._next_part += 1
        reserved = [held]  # given back once: with the slot, or if the task never ran (an abort)
        task = asyncio.create_task(self._send_part(number, chunk, reserved))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: _give(reserved))

    async def _send_part(self, number: int, chunk: bytes, reserved: list[int]) -> None:
        store = self._store
        extra = {"ChecksumAlgorithm": self._checksum} if self._checksum else {}
        try:
            response = await store.call(
                "upload_part",
                self._name,
                store.client().upload_part,
                Bucket=store.bucket,
                Key=self._key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=chunk,
                **extra,
            )
            part = {"PartNumber": number, "ETag": response["ETag"]}
            field = f"Checksum{self._checksum.upper()}" if self._checksum else ""
            if field and response.get(field):
                part[field] = response[field]
            self._parts.append(part)
            store.stats.bytes_written += len(chunk)
        except Exception as exc:  # noqa: BLE001
            # Whatever went wrong, the part is missing: keep the failure for
            # the next write or complete, which must never finish without it.
            if self._failure is None:
                self._failure = exc
        finally:
            self._slots.release()
            _give(reserved)


def _give(reserved: list[int]) -> None:
    """Give back a part's reservation, if it was not yet."""
    if reserved:
        ADMISSION.give(reserved.pop())
