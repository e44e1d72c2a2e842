"""The object service: buckets and objects across the tiers.

This is the one entry point the gateway uses for data. It validates names,
streams bodies into the hot tier while hashing, verifies digests, commits to
the index, and only then removes what a write superseded, so a crash at any
point leaves either the old or the new version, never a mix.
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from packer.ranges import ByteRange, split_over
from tiering import _pool, checksums
from tiering.conditions import Conditions, check
from tiering.errors import (
    BadDigest,
    BucketAlreadyOwnedByYou,
    EntityTooLarge,
    IncompleteBody,
    InvalidRange,
    NoSuchBucket,
    NoSuchKey,
    PayloadHashMismatch,
    SlowDown,
)
from tiering.hot import ChunkWriter, HotTier
from tiering.index import Index, ListPage
from tiering.inputs import Integrity, NewObject
from tiering.meta import BucketInfo, Checksum, Chunk, ObjectMeta, now_ms
from tiering.multipart import Multipart
from tiering.names import check_bucket_name, check_key

MAX_PUT_SIZE = 5 * 1024**3  # S3's limit for a single PUT
_WRITE_BLOCK = 1024 * 1024  # body bytes gathered per pool call
_READ_BLOCK = 1024 * 1024  # bytes per pool call when streaming a GET


@dataclass(slots=True)
class Staged:
    """A body written to a hot-tier file, hashed and verified."""

    chunk: Chunk
    md5_hex: str
    checksum: Checksum | None

    def as_object(self, bucket: str, key: str, new: NewObject) -> ObjectMeta:
        """The single-chunk object these bytes become (seq set at commit)."""
        return ObjectMeta(
            bucket=bucket,
            key=key,
            size=self.chunk.size,
            etag=self.md5_hex,
            last_modified_ms=now_ms(),
            seq=0,
            content_type=new.content_type,
            headers=new.headers,
            user_meta=new.user_meta,
            checksum=self.checksum,
            chunks=(self.chunk,),
        )


class ObjectService:
    """Buckets and objects; owns the index and the hot tier of one node."""

    def __init__(self, data_dir: Path, hot_budget: int, region: str = "us-east-1") -> None:
        self.data_dir = data_dir
        self.region = region
        self.index = Index(data_dir / "index")
        self.hot = HotTier(data_dir / "hot", hot_budget)
        self.multipart = Multipart(self)

    async def start(self) -> None:
        """Remove what a crash left half-done before serving.

        After a clean shutdown there is nothing to remove and the hot tier's
        byte count was saved, so start-up skips the sweep, which has to read
        every index record (tens of seconds for millions of objects)."""
        await _pool.run(self._recover_hot)

    def _recover_hot(self) -> None:
        if not self.hot.resume_clean():
            self.hot.sweep(self.index.referenced_files())

    def close(self) -> None:
        self.index.close()
        self.hot.mark_clean()

    # -- buckets -----------------------------------------------------------

    async def create_bucket(self, name: str) -> BucketInfo:
        check_bucket_name(name)
        info = BucketInfo(name=name, created_ms=now_ms(), region=self.region)
        if not await _pool.run(self.index.create_bucket, info):
            raise BucketAlreadyOwnedByYou(BucketName=name)
        return info

    async def delete_bucket(self, name: str) -> None:
        await _pool.run(self.index.delete_bucket, name)

    async def bucket(self, name: str) -> BucketInfo:
        info = self.index.get_bucket(name)  # a point read: microseconds
        if info is None:
            raise NoSuchBucket(BucketName=name)
        return info

    async def list_buckets(self) -> list[BucketInfo]:
        return await _pool.run(self.index.list_buckets)

    # -- objects -----------------------------------------------------------

    async def head(self, bucket: str, key: str) -> ObjectMeta:
        meta = await _pool.run(self.index.get_object, bucket, key)
        if meta is None:
            await self.bucket(bucket)
            raise NoSuchKey(Key=key)
        return meta

    async def fetch(self, bucket: str, key: str, small: int) -> tuple[ObjectMeta, bytes | None]:
        """The object's record and, when it is at most ``small`` bytes, its
        whole body, in one pool call: a small GET costs one hand-off."""
        meta, data = await _pool.run(self._fetch, bucket, key, small)
        if meta is None:
            await self.bucket(bucket)
            raise NoSuchKey(Key=key)
        return meta, data

    def _fetch(self, bucket: str, key: str, small: int) -> tuple[ObjectMeta | None, bytes | None]:
        meta = self.index.get_object(bucket, key)
        if meta is None or meta.size > small:
            return meta, None
        try:
            return meta, b"".join(self.hot.read(c.file_id, 0, c.size) for c in meta.chunks)
        except FileNotFoundError:
            # Replaced or deleted between the lookup and the read: answer
            # from whatever version is current now.
            return self._fetch(bucket, key, small)

    async def put(
        self,
        bucket: str,
        key: str,
        body: AsyncIterator[bytes],
        new: NewObject,
        integrity: Integrity,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> ObjectMeta:
        check_key(key)
        await self.bucket(bucket)
        if integrity.expected_size is not None and integrity.expected_size > MAX_PUT_SIZE:
            raise EntityTooLarge(ProposedSize=integrity.expected_size, MaxSizeAllowed=MAX_PUT_SIZE)
        if if_none_match and self.index.get_object(bucket, key) is not None:
            # Checked again atomically at commit; failing early saves the upload.
            check(await self.head(bucket, key), Conditions(if_none_match="*"), for_copy=True)
        staged = await self.stage(body, integrity)
        meta = staged.as_object(bucket, key, new)
        return await self.commit(meta, if_none_match=if_none_match, if_match=if_match)

    async def commit(self, meta: ObjectMeta, **conditions: object) -> ObjectMeta:
        """Make ``meta`` the current version; drop the files it replaced.
        On failure the new files are removed, so nothing is left behind."""
        try:
            meta, old = await _pool.run(self.index.put_object, meta, **conditions)
        except BaseException:
            await _pool.run(self.hot.remove, meta.chunks)
            raise
        if old is not None:
            await self._drop(old, keep=meta.chunks)
        return meta

    async def _drop(self, old: ObjectMeta, keep: Iterable[Chunk] = ()) -> None:
        kept = {c.file_id for c in keep}
        await _pool.run(self.hot.remove, [c for c in old.chunks if c.file_id not in kept])

    async def stage(self, body: AsyncIterator[bytes], integrity: Integrity) -> Staged:
        """Stream ``body`` into a new durable hot-tier file and verify it."""
        if integrity.expected_size is not None and not self.hot.reserve(integrity.expected_size):
            raise SlowDown("The hot tier is full; retry later")
        writer = self.hot.writer(integrity.checksum_algorithm, sha256=integrity.payload_sha256 is not None)
        try:
            await _fill(writer, body)
            if integrity.expected_size is not None and writer.size != integrity.expected_size:
                raise IncompleteBody(
                    "You did not provide the number of bytes specified by the Content-Length HTTP header."
                )
            chunk = await _pool.run(writer.finish)
            checksum = _verify(writer, integrity)
        except BaseException:
            await _pool.run(writer.abort)
            raise
        return Staged(chunk, writer.md5.hexdigest(), checksum)

    async def read(self, meta: ObjectMeta, wanted: ByteRange) -> AsyncIterator[bytes]:
        """Yield the bytes of ``wanted`` in order, in blocks of about 1 MiB."""
        sizes = [c.size for c in meta.chunks]
        for index, piece in split_over(sizes, wanted):
            # One open descriptor per chunk: a delete or overwrite that
            # unlinks the file mid-stream does not cut the response short.
            fd = await _pool.run(self.hot.open, meta.chunks[index].file_id)
            try:
                offset = piece.start
                while offset < piece.end:
                    length = min(_READ_BLOCK, piece.end - offset)
                    yield await _pool.run(self.hot.pread, fd, offset, length)
                    offset += length
            finally:
                os.close(fd)

    async def read_all(self, meta: ObjectMeta, wanted: ByteRange | None = None) -> bytes:
        wanted = wanted or ByteRange(0, meta.size)
        return b"".join([piece async for piece in self.read(meta, wanted)])

    async def delete(self, bucket: str, key: str) -> None:
        """Idempotent, like S3: deleting a missing key succeeds."""
        await self.bucket(bucket)
        old = await _pool.run(self.index.delete_object, bucket, key)
        if old is not None:
            await self._drop(old)

    async def delete_many(self, bucket: str, keys: list[str]) -> None:
        """DeleteObjects: one index commit for all keys, then the files."""
        await self.bucket(bucket)
        for key in keys:
            check_key(key)
        for old in await _pool.run(self.index.delete_objects, bucket, keys):
            await self._drop(old)

    async def copy(
        self,
        source: ObjectMeta,
        bucket: str,
        key: str,
        new: NewObject | None,
        checksum_algorithm: str | None = None,
    ) -> ObjectMeta:
        """Copy ``source`` to bucket/key; ``new`` replaces the metadata
        (MetadataDirective REPLACE), None keeps the source's."""
        check_key(key)
        await self.bucket(bucket)
        new = new or NewObject(source.content_type, dict(source.headers), dict(source.user_meta))
        algorithm = checksum_algorithm or (source.checksum.algorithm if source.checksum else None)
        staged = await self.stage(
            self.read(source, ByteRange(0, source.size)),
            Integrity(checksum_algorithm=algorithm, expected_size=source.size),
        )
        return await self.commit(staged.as_object(bucket, key, new))

    async def rewrite_meta(self, source: ObjectMeta, new: NewObject) -> ObjectMeta:
        """CopyObject onto itself with REPLACE: same bytes, new metadata."""
        meta = replace(
            source,
            content_type=new.content_type,
            headers=new.headers,
            user_meta=new.user_meta,
            last_modified_ms=now_ms(),
        )
        meta, _ = await _pool.run(self.index.put_object, meta, if_match=source.etag)
        return meta

    async def list(
        self, bucket: str, prefix: str = "", delimiter: str = "", marker: str = "", max_keys: int = 1000
    ) -> ListPage:
        await self.bucket(bucket)
        return await _pool.run(self.index.list_objects, bucket, prefix, delimiter, marker, max_keys)


def resolve_part(meta: ObjectMeta, part_number: int) -> ByteRange:
    """The byte range of part ``part_number`` (GetObject ?partNumber=)."""
    sizes = meta.part_sizes or (meta.size,)
    if not 1 <= part_number <= len(sizes):
        raise InvalidRange("The requested partnumber is not satisfiable", ActualObjectSize=meta.size)
    start = sum(sizes[: part_number - 1])
    return ByteRange(start, start + sizes[part_number - 1])


async def _fill(writer: ChunkWriter, body: AsyncIterator[bytes]) -> None:
    """Gather small network reads into ~1 MiB blocks so each pool call
    (hash + write) amortises its hand-off cost."""
    buffer = bytearray()
    async for piece in body:
        buffer += piece
        if len(buffer) >= _WRITE_BLOCK:
            await _pool.run(writer.write, bytes(buffer))
            buffer.clear()
    if buffer or writer.size == 0:
        await _pool.run(writer.write, bytes(buffer))


def _verify(writer: ChunkWriter, integrity: Integrity) -> Checksum | None:
    if integrity.payload_sha256 is not None and writer.sha256 is not None:
        if writer.sha256.hexdigest() != integrity.payload_sha256:
            raise PayloadHashMismatch(
                "The provided 'x-amz-content-sha256' header does not match what was computed."
            )
    if integrity.content_md5 is not None:
        if base64.b64encode(writer.md5.digest()).decode() != integrity.content_md5:
            raise BadDigest("The Content-MD5 you specified did not match what we received.")
    if writer.checksum is None:
        return None
    algorithm = writer.checksum.algorithm
    value = writer.checksum.b64()
    if integrity.checksum_value is not None:
        checksums.decode_digest(algorithm, integrity.checksum_value)
        if integrity.checksum_value != value:
            raise BadDigest(f"The {algorithm} you specified did not match the calculated checksum.")
    return Checksum(algorithm, value, "FULL_OBJECT")
