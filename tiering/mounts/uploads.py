"""Multipart uploads on read-write mounts, passed through to the source.

The source keeps the upload, as it would for any client: the upload id is
the source's, each part the client sends becomes the same part at the
source, and ListParts / ListMultipartUploads are the source's answers. So
other tools see ordinary uploads and, once complete, an ordinary object
with the ETag S3 gives it. The gateway holds no state of its own for these
uploads, so a restart loses nothing.

A part is received whole before it is sent on (one S3 request carries one
part, and its digests must check before the source sees it). Parts waiting
in memory share one budget, ``PART_MEMORY``: an upload part waits for room
rather than growing the process, and a part larger than the whole budget is
refused (EntityTooLarge) before its body is read.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from tiering.admission import Admission
from tiering.errors import (
    AccessDenied,
    BadDigest,
    CapacityError,
    CapacityNotFound,
    EntityTooLarge,
    EntityTooSmall,
    InvalidArgument,
    InvalidDigest,
    InvalidPart,
    InvalidPartOrder,
    InvalidRequest,
    NoSuchUpload,
    NotSupported,
    TierstoreError,
)
from tiering.meta import Checksum, Mount, ObjectMeta, Part, Upload, now_ms
from tiering.model.conditions import WriteConditions
from tiering.model.digests import ingest
from tiering.model.inputs import Integrity, NewObject
from tiering.model.uploads import ChosenPart, check_order, md5_of_parts
from tiering.mounts.buckets import Mounts, unreachable
from tiering.mounts.source import answer_checksum, epoch_ms, unquoted_etag

PART_MEMORY = 1024**3  # bytes of mounted-upload parts held in memory at once

# Errors the source answers for a bad request, passed on as the same S3 error.
_SAME_CODE: dict[str, type[TierstoreError]] = {
    "NoSuchUpload": NoSuchUpload,
    "InvalidPart": InvalidPart,
    "InvalidPartOrder": InvalidPartOrder,
    "EntityTooSmall": EntityTooSmall,
    "EntityTooLarge": EntityTooLarge,
    "InvalidArgument": InvalidArgument,
    "InvalidRequest": InvalidRequest,
    "BadDigest": BadDigest,
    "InvalidDigest": InvalidDigest,
}


class MountUploads:
    """CreateMultipartUpload .. Complete on read-write mounts."""

    def __init__(self, mounts: Mounts, memory: int = PART_MEMORY) -> None:
        self._mounts = mounts
        # Their own byte semaphore (not the process's admission: a part waits
        # its turn here however long the parts before it take).
        self._memory = Admission(memory)

    async def _ask(self, name: str, call: Any, *args: Any, upload_id: str | None = None) -> Any:
        """One source call; its refusal as the S3 error it names."""
        mount = self._mounts.get(name)
        assert mount is not None
        try:
            return await call(await self._mounts.client(name), *args)
        except CapacityError as exc:
            raise _refusal(mount, exc, upload_id) from None

    async def create(
        self, name: str, key: str, new: NewObject, checksum_algorithm: str | None, checksum_type: str | None
    ) -> Upload:
        self._mounts.writable(name)
        refuse_tags(name, new)
        answer = await self._ask(
            name, lambda c: c.create_upload(
                key, new.content_type, new.headers, new.user_meta, checksum_algorithm, checksum_type
            ),
        )
        algorithm = answer.get("ChecksumAlgorithm") or checksum_algorithm
        return Upload(
            upload_id=answer["UploadId"], bucket=name, key=key, initiated_ms=now_ms(),
            content_type=new.content_type, headers=new.headers, user_meta=new.user_meta,
            checksum_algorithm=algorithm,
            checksum_type=(answer.get("ChecksumType") or checksum_type or "COMPOSITE") if algorithm else None,
        )

    async def upload_part(
        self, name: str, key: str, upload_id: str, number: int, body: AsyncIterator[bytes], integrity: Integrity
    ) -> Part:
        """Receive the part (digests checked), then send it to the source
        with the checksum the client asked for, so the source keeps it too."""
        self._mounts.writable(name)
        size = integrity.expected_size
        if size is not None and size > self._memory.limit:
            raise EntityTooLarge(
                f"Parts of uploads to a mounted bucket are limited to {self._memory.limit} bytes",
                ProposedSize=size, MaxSizeAllowed=self._memory.limit,
            )
        async with self._memory.hold(size if size is not None else self._memory.limit, wait=math.inf):
            data, checksum = await self._receive(body, integrity)
            sent = (checksum.algorithm, checksum.value) if checksum else None
            answer = await self._ask(
                name, lambda c: c.upload_part(key, upload_id, number, data, sent), upload_id=upload_id
            )
        return Part(number, len(data), unquoted_etag(answer.get("ETag")), now_ms(), checksum=checksum)

    async def _receive(self, body: AsyncIterator[bytes], integrity: Integrity) -> tuple[bytes, Checksum | None]:
        data = bytearray()

        async def keep(block: bytes) -> None:
            if len(data) + len(block) > self._memory.limit:
                raise EntityTooLarge(ProposedSize=len(data) + len(block), MaxSizeAllowed=self._memory.limit)
            data.extend(block)

        _, checksum = await ingest(body, integrity, keep)
        if checksum is not None:
            checksum = Checksum(checksum.algorithm, checksum.value, "COMPOSITE")
        return bytes(data), checksum

    async def complete(
        self, name: str, key: str, upload_id: str, chosen: list[ChosenPart],
        conditions: WriteConditions = WriteConditions(),
    ) -> ObjectMeta:
        """Complete at the source, then describe the object as it has it."""
        self._mounts.writable(name)
        if conditions:
            raise NotSupported("Conditional writes to a mounted bucket are not supported")
        check_order(chosen, upload_id)
        parts: list[dict[str, Any]] = []
        for want in chosen:
            part: dict[str, Any] = {"PartNumber": want.part_number, "ETag": f'"{want.etag}"'}
            if want.checksum and want.checksum_algorithm:
                part[f"Checksum{want.checksum_algorithm}"] = want.checksum
            parts.append(part)
        mount = self._mounts.get(name)
        assert mount is not None
        client = await self._mounts.client(name)
        try:
            answer = await client.complete_upload(key, upload_id, parts)
        except CapacityError as exc:
            # A retried Complete whose first try succeeded finds the upload
            # gone; the object is then the one it made, if its ETag says so.
            if not (exc.detail.get("code") == "NoSuchUpload" and exc.detail.get("attempts", 1) != 1):
                raise _refusal(mount, exc, upload_id) from None
            answer = {}
        try:
            meta = await self._mounts.committed(name, key)
        except CapacityNotFound:
            if not answer:
                raise NoSuchUpload(UploadId=upload_id) from None
            raise
        except CapacityError as exc:
            raise unreachable(mount, exc) from None
        if not answer and meta.etag != md5_of_parts([want.etag for want in chosen]):
            raise NoSuchUpload(UploadId=upload_id)
        checksum = answer_checksum(answer, "COMPOSITE")  # a multipart upload's, unless it says otherwise
        return meta if checksum is None else replace(meta, checksum=checksum)

    async def abort(self, name: str, key: str, upload_id: str) -> None:
        self._mounts.writable(name)
        await self._ask(name, lambda c: c.abort_upload(key, upload_id), upload_id=upload_id)

    async def list_parts(
        self, name: str, key: str, upload_id: str, after: int, limit: int
    ) -> tuple[Upload, list[Part], bool]:
        answer = await self._ask(name, lambda c: c.list_parts(key, upload_id, after, limit), upload_id=upload_id)
        algorithm = answer.get("ChecksumAlgorithm")
        upload = Upload(
            upload_id=upload_id, bucket=name, key=key, initiated_ms=0, checksum_algorithm=algorithm,
            checksum_type=(answer.get("ChecksumType") or "COMPOSITE") if algorithm else None,
        )
        parts = []
        for item in answer.get("Parts", ()):
            value = item.get(f"Checksum{algorithm}") if algorithm else None
            parts.append(Part(
                int(item["PartNumber"]), int(item["Size"]), unquoted_etag(item.get("ETag")), epoch_ms(item.get("LastModified")),
                checksum=Checksum(algorithm, value, upload.checksum_type or "COMPOSITE") if value else None,
            ))
        return upload, parts, bool(answer.get("IsTruncated"))

    async def list_uploads(
        self, name: str, prefix: str, key_marker: str, upload_id_marker: str, limit: int
    ) -> tuple[list[Upload], bool]:
        answer = await self._ask(name, lambda c: c.list_uploads(prefix, key_marker, upload_id_marker, limit))
        uploads = [
            Upload(
                upload_id=item["UploadId"], bucket=name, key=item["Key"], initiated_ms=epoch_ms(item.get("Initiated")),
                checksum_algorithm=item.get("ChecksumAlgorithm"),
                checksum_type=item.get("ChecksumType") if item.get("ChecksumAlgorithm") else None,
            )
            for item in answer["Uploads"]
        ]
        return uploads, bool(answer.get("IsTruncated"))


def _refusal(mount: Mount, exc: CapacityError, upload_id: str | None) -> TierstoreError:
    """The S3 error for the source's refusal of an upload request."""
    code, status = str(exc.detail.get("code") or ""), int(exc.detail.get("status") or 0)  # type: ignore[call-overload]
    said = str(exc.detail.get("said") or code)
    where = f"(the source of bucket {mount.name}, {mount.source}, said: {said})"
    if code in _SAME_CODE:
        detail = {"UploadId": upload_id} if upload_id and code in ("NoSuchUpload", "InvalidPart") else {}
        return _SAME_CODE[code](said or code, **detail)
    if status == 403:
        return AccessDenied(f"Access denied {where}", BucketName=mount.name)
    if status == 501:
        return NotSupported(f"Not supported {where}")
    if 400 <= status < 500:
        return InvalidRequest(f"The request was refused {where}")
    return unreachable(mount, exc)


def tags_refused(bucket: str) -> NotSupported:
    """Tags are not passed to a mount's source (nor read from it): a write
    that carries some is refused rather than stored without them."""
    return NotSupported(f"Object tags are not supported on mounted bucket {bucket}: "
                        "the source keeps its objects' tags")


def refuse_tags(bucket: str, new: NewObject) -> None:
    if new.tags:
        raise tags_refused(bucket)
