"""Multipart uploads: create, upload parts, complete, abort, list.

A part is staged like any body (pieces of at most the part size in the hot
tier, or streamed into a segment of its own when it does not fit), and may
be flushed to the capacity tier while the upload is still open. Completing
an upload writes no bytes: the object's chunks are the chosen parts' chunks,
committed together with the removal of the upload's records in one index
batch. Parts uploaded but not chosen are deleted after that commit.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import replace

from tiering import pool
from tiering.errors import (
    EntityTooSmall,
    InvalidPart,
    InvalidRequest,
    NoSuchUpload,
)
from tiering.index.db import Index
from tiering.maintenance.segments import Piece
from tiering.maintenance.tiers import Tiers
from tiering.managed.staging import Staged, Stager
from tiering.meta import ObjectMeta, Part, Upload, now_ms
from tiering.model.conditions import WriteConditions
from tiering.model.inputs import Integrity, NewObject
from tiering.model.uploads import (
    MIN_PART_SIZE,
    ChosenPart,
    check_object_size,
    check_order,
    md5_of_parts,
    object_checksum,
)


class Multipart:
    """Multipart uploads of managed buckets (``tiering.mounts.uploads`` is
    the mounted buckets' counterpart; ``ObjectService.uploads`` picks one).
    Arguments are checked by the caller (``check_create``, ``check_part``)."""

    def __init__(self, index: Index, stager: Stager, tiers: Tiers) -> None:
        self._index = index
        self._stager = stager
        self._tiers = tiers

    async def create(
        self,
        bucket: str,
        key: str,
        new: NewObject,
        checksum_algorithm: str | None = None,
        checksum_type: str | None = None,
    ) -> Upload:
        async with self._tiers.writing_to(bucket):
            upload = Upload(
                # Time first, so an upload's id sorts by initiation within a key.
                upload_id=f"{now_ms():012x}{secrets.token_hex(12)}",
                bucket=bucket,
                key=key,
                initiated_ms=now_ms(),
                content_type=new.content_type,
                headers=new.headers,
                user_meta=new.user_meta,
                checksum_algorithm=checksum_algorithm,
                checksum_type=checksum_type,
                tags=new.tags,
            )
            await pool.run(self._index.create_upload, upload)
            return upload

    async def get(self, bucket: str, key: str, upload_id: str) -> Upload:
        upload = await pool.run(self._index.get_upload, bucket, key, upload_id)
        if upload is None:
            raise NoSuchUpload(UploadId=upload_id)
        return upload

    async def upload_part(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_number: int,
        body: AsyncIterator[bytes],
        integrity: Integrity,
    ) -> Part:
        async with self._tiers.writing_to(bucket):
            upload = await self.get(bucket, key, upload_id)
            if integrity.checksum_algorithm is None:
                integrity.checksum_algorithm = upload.checksum_algorithm
            elif upload.checksum_algorithm not in (None, integrity.checksum_algorithm):
                raise InvalidRequest(
                    f"Checksum Type mismatch occurred, expected checksum Type: "
                    f"{upload.checksum_algorithm.lower()}, actual checksum Type: {integrity.checksum_algorithm.lower()}"
                )
            staged = await self._stager.stage(body, integrity, Piece(bucket, key, part_number, upload_id))
            return await self._record(upload, part_number, staged, now_ms())

    async def _record(self, upload: Upload, number: int, staged: Staged, when: int) -> Part:
        part = Part(number, staged.size, staged.md5_hex, when, staged.chunks, staged.checksum)
        segment = staged.segment
        if segment is not None:
            segment = replace(segment, live=sum(c.extent.weight for c in part.chunks if c.extent))
        try:
            previous = await pool.run(self._index.put_part, upload, part, segment)
        except BaseException:
            await self._stager.discard(part.chunks, segment)
            raise
        if previous is False:  # completed or aborted while this part streamed
            await self._stager.discard(part.chunks, segment)
            raise NoSuchUpload(UploadId=upload.upload_id)
        if previous is not None:
            await self._stager.forget(previous.chunks)
        self._stager.note_staged(part.chunks)
        return part

    async def complete(
        self, bucket: str, key: str, upload_id: str, chosen: list[ChosenPart],
        conditions: WriteConditions = WriteConditions(),
    ) -> ObjectMeta:
        async with self._tiers.writing_to(bucket):
            try:
                upload = await self.get(bucket, key, upload_id)
            except NoSuchUpload:
                done = await self._already_completed(bucket, key, upload_id, chosen)
                if done is None:
                    raise
                return done
            check_order(chosen, upload_id)
            if conditions:
                # Checked again atomically at commit (409 if a write came in between).
                conditions.check(await pool.run(self._index.get_object, bucket, key), key)
            stored = {p.part_number: p for p in await pool.run(self._index.list_parts, upload_id)}
            parts: list[Part] = []
            for i, want in enumerate(chosen):
                part = stored.get(want.part_number)
                if part is None or part.etag != want.etag:
                    raise InvalidPart(
                        "One or more of the specified parts could not be found. The part may not have been "
                        "uploaded, or the specified entity tag may not match the part's entity tag.",
                        UploadId=upload_id,
                        PartNumber=want.part_number,
                        ETag=want.etag,
                    )
                if want.checksum is not None and (part.checksum is None or part.checksum.value != want.checksum):
                    raise InvalidPart(
                        f"The checksum of part {want.part_number} does not match the checksum sent in the request.",
                        UploadId=upload_id,
                        PartNumber=want.part_number,
                    )
                if i < len(chosen) - 1 and part.size < MIN_PART_SIZE:
                    raise EntityTooSmall(
                        "Your proposed upload is smaller than the minimum allowed object size.",
                        ProposedSize=part.size,
                        MinSizeAllowed=MIN_PART_SIZE,
                        PartNumber=want.part_number,
                        ETag=want.etag,
                    )
                parts.append(part)
            check_object_size([p.size for p in parts])
            meta = ObjectMeta(
                bucket=bucket,
                key=key,
                size=sum(p.size for p in parts),
                etag=md5_of_parts([p.etag for p in parts]),
                last_modified_ms=now_ms(),
                seq=0,
                content_type=upload.content_type,
                headers=upload.headers,
                user_meta=upload.user_meta,
                checksum=object_checksum(upload, parts),
                chunks=tuple(c for p in parts for c in p.chunks),
                part_sizes=tuple(p.size for p in parts),
                upload_id=upload_id,
                tags=upload.tags,
            )
            meta, old = await pool.run(
                self._index.put_object, meta, conditions=conditions, drop_upload=upload, drop_parts=list(stored),
                chosen_parts=[p.part_number for p in parts],
            )
            chosen_numbers = {p.part_number for p in parts}
            unused = [c for p in stored.values() if p.part_number not in chosen_numbers for c in p.chunks]
            await self._stager.forget(unused)
            if old is not None:
                await self._stager.forget(old.chunks, keep=meta.chunks)
            info = await pool.run(self._index.get_bucket, bucket)
            if info is not None:  # deleted meanwhile: nothing to wait for
                await self._stager.settle(info, meta)
            return meta

    async def _already_completed(
        self, bucket: str, key: str, upload_id: str, chosen: list[ChosenPart]
    ) -> ObjectMeta | None:
        """A retried Complete (the client lost the first answer) gets the same
        result again, as S3 does, while the object is still that upload's."""
        meta = await pool.run(self._index.get_object, bucket, key)
        if meta is None or meta.upload_id != upload_id:
            return None
        if md5_of_parts([c.etag for c in chosen]) != meta.etag:
            return None
        return meta

    async def abort(self, bucket: str, key: str, upload_id: str) -> None:
        upload = await self.get(bucket, key, upload_id)
        parts = await pool.run(self._index.delete_upload, upload)
        if parts is None:
            raise NoSuchUpload(UploadId=upload_id)
        await self._stager.forget([c for p in parts for c in p.chunks])

    async def list_parts(self, bucket: str, key: str, upload_id: str, after: int, limit: int) -> tuple[Upload, list[Part], bool]:
        upload = await self.get(bucket, key, upload_id)
        parts = await pool.run(self._index.list_parts, upload_id, after, limit + 1)
        return upload, parts[:limit], len(parts) > limit

    async def list_uploads(
        self, bucket: str, prefix: str, key_marker: str, upload_id_marker: str, limit: int
    ) -> tuple[list[Upload], bool]:
        return await pool.run(self._index.list_uploads, bucket, prefix, key_marker, upload_id_marker, limit)
