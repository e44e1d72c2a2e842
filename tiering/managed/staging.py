"""Taking bodies in and committing them: the write half of a managed bucket.

A body is streamed into durable hot-tier files while it is hashed (or, when
it cannot fit in the hot tier now, straight into a segment of its own),
verified, and committed to the index in one batch; only then is what the
write superseded removed, so a crash at any point leaves either the old or
the new version, never a mix. Object writes (``tiering.managed.backend``) and
multipart parts (``tiering.managed.multipart``) both stage through here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, replace

from tiering import pool
from tiering.admission import ADMISSION, BODY_HELD
from tiering.capacity import CapacityStore
from tiering.capacity.layout import segment_path
from tiering.files import no_space
from tiering.hot.tier import HotTier
from tiering.index.bucket_settings import Policies
from tiering.index.db import Index
from tiering.maintenance.flush import Flusher
from tiering.maintenance.segments import Piece, SegmentStream
from tiering.meta import BucketInfo, Checksum, Chunk, ObjectMeta, SegmentInfo, now_ms
from tiering.model.digests import Digests, ingest
from tiering.model.inputs import Integrity, NewObject
from tiering.settings import TierSettings

_ROOM_WAIT = 10.0  # seconds a small write waits for the flusher to free staging room
# What a body streamed to the capacity tier holds beyond the block every
# write holds (BODY_HELD), in parts: the part being gathered, its copy and
# its encoded entry. An S3 store's upload reserves its own parts in flight
# (PART_COPIES in tiering/capacity/s3_upload.py), so they are not counted
# here a second time; a local directory's writes each part at once.
_STREAM_PARTS = 3
# Seconds a body streamed to the capacity tier waits for those bytes: no
# byte of it is read yet, so it is refused (SlowDown) rather than queued.
_STREAM_WAIT = 1.0


@dataclass(slots=True)
class Staged:
    """A body written to hot-tier files (or streamed into a segment of its
    own), hashed and verified."""

    chunks: tuple[Chunk, ...]
    md5_hex: str
    checksum: Checksum | None
    segment: SegmentInfo | None = None  # set when streamed to the capacity tier

    @property
    def size(self) -> int:
        return sum(c.size for c in self.chunks)

    def as_object(self, bucket: str, key: str, new: NewObject) -> ObjectMeta:
        """The single-chunk object these bytes become (seq set at commit)."""
        return ObjectMeta(
            bucket=bucket,
            key=key,
            size=self.size,
            etag=self.md5_hex,
            last_modified_ms=now_ms(),
            seq=0,
            content_type=new.content_type,
            headers=new.headers,
            user_meta=new.user_meta,
            tags=new.tags,
            checksum=self.checksum,
            chunks=self.chunks,
        )


class Stager:
    """Stages bodies, commits versions, and removes what they replaced."""

    def __init__(
        self,
        index: Index,
        hot: HotTier,
        capacity: CapacityStore,
        flusher: Flusher,
        policies: Policies,
        settings: TierSettings,
    ) -> None:
        self._index = index
        self._hot = hot
        self._capacity = capacity
        self._flusher = flusher
        self._policies = policies
        self._settings = settings

    async def stage(self, body: AsyncIterator[bytes], integrity: Integrity, label: Piece) -> Staged:
        """Take ``body`` in: into durable hot-tier files, or, when it cannot
        fit in the hot tier now, straight into a segment of its own."""
        settings = self._policies.settings(label.bucket)
        size = integrity.expected_size
        reserved = 0
        if size is not None:
            if not await self._make_room(size, settings.small_object_size):
                return await self._stream(body, integrity, label, settings)
            reserved = size
        digests = Digests.of(integrity)
        writer = self._hot.writer(settings.part_size, digests, reserved)
        try:
            # The writer hashes each block in the same pool call as its write.
            _, checksum = await ingest(body, integrity, lambda b: pool.run(writer.write, b), digests=digests)
            chunks = await pool.run(writer.finish)
        except BaseException as exc:
            await pool.run(writer.abort)
            if no_space(exc):
                # The filesystem had less room than it showed: another process
                # took it meanwhile. A refusal, and the room is made now.
                self._flusher.request()
                raise self._hot.disk.refuse("disk", self._hot.can_free()) from None
            raise
        return Staged(chunks, digests.md5.hexdigest(), checksum)

    async def _make_room(self, size: int, small: int) -> bool:
        """Reserve staging room; False means: stream this body past the hot
        tier (it is large). A small body waits for the flusher and eviction
        to free room (in the budget, or above the free-space floor), then
        gets SlowDown; or 507 at once when nothing the gateway can free
        would make room. Staged data is never evicted, and the disk is never
        filled past the budget or below the floor."""
        hot = self._hot
        if hot.reserve(size):
            if hot.over_high:
                await pool.run(hot.evict)
            return True
        if size > small:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _ROOM_WAIT
        cause = hot.shortage(size) or "budget"
        while loop.time() < deadline:
            if cause == "floor":
                await pool.run(hot.evict, None, size)  # clean cache first: no need to wait for that
                if hot.reserve(size):
                    return True
                if not hot.can_free():
                    # Pinned data, or other data than the gateway's: no
                    # flush or eviction will make room, so no wait either.
                    raise hot.disk.refuse(cause, False)
            self._flusher.request()
            await asyncio.sleep(0.05)
            if hot.reserve(size):
                if hot.over_high:
                    await pool.run(hot.evict)
                return True
            cause = hot.shortage(size) or cause
        # The budget (the gateway's own setting) always waits, then SlowDown.
        raise hot.disk.refuse(cause, cause == "budget" or hot.can_free())

    async def _stream(
        self, body: AsyncIterator[bytes], integrity: Integrity, label: Piece, settings: TierSettings
    ) -> Staged:
        """Write the body into a new segment as it arrives, one part-sized
        extent at a time; memory holds a few parts (reserved first), the
        hot tier nothing."""
        async with ADMISSION.hold(_STREAM_PARTS * settings.part_size, _STREAM_WAIT, BODY_HELD):
            return await self._stream_held(body, integrity, label, settings)

    async def _stream_held(
        self, body: AsyncIterator[bytes], integrity: Integrity, label: Piece, settings: TierSettings
    ) -> Staged:
        name = await pool.run(self._index.new_segment_name)
        stream = SegmentStream(self._capacity, name, settings)
        chunks: list[Chunk] = []

        async def put_part(block: bytes) -> None:
            chunks.append(await stream.add(label, len(chunks), block))

        try:
            digests, checksum = await ingest(body, integrity, put_part, block=settings.part_size)
            if not chunks:
                chunks.append(await stream.add(label, 0, b""))
            info = await stream.finish()
        except BaseException:
            await stream.abort()
            raise
        return Staged(tuple(chunks), digests.md5.hexdigest(), checksum, info)

    async def commit(self, meta: ObjectMeta, segment: SegmentInfo | None = None, **conditions: object) -> ObjectMeta:
        """Make ``meta`` the current version; drop the files it replaced.
        On failure the new files (or streamed segment) are removed, so
        nothing is left behind."""
        if segment is not None:
            segment = replace(segment, live=sum(c.extent.weight for c in meta.chunks if c.extent))
        try:
            meta, old = await pool.run(self._index.put_object, meta, segment=segment, **conditions)
        except BaseException:
            await self.discard(meta.chunks, segment)
            raise
        if old is not None:
            await self.forget(old.chunks, keep=meta.chunks)
        return meta

    async def discard(self, chunks: Iterable[Chunk], segment: SegmentInfo | None = None) -> None:
        """Remove bytes written for a write that did not commit."""
        await pool.run(self._hot.remove, chunks)
        if segment is not None:
            await self._capacity.delete(segment_path(segment.name))

    async def forget(self, chunks: Iterable[Chunk], keep: Iterable[Chunk] = ()) -> None:
        """Remove the staged files and cached extents of ``chunks`` that
        ``keep`` does not use (after the index no longer refers to them)."""
        chunks = list(chunks)
        kept = {c.file_id for c in keep if c.file_id} | {c.extent.cache_name for c in keep if c.extent}
        await pool.run(self._hot.remove, [c for c in chunks if c.file_id and c.file_id not in kept])
        cached = [c.extent.cache_name for c in chunks if c.extent and c.extent.cache_name not in kept]
        if cached:
            await pool.run(self._hot.drop_cached, cached)

    def note_staged(self, chunks: Iterable[Chunk]) -> None:
        """Wake the flusher once a segment's worth of staged bytes waits."""
        self._flusher.note_staged(sum(c.size for c in chunks if c.file_id is not None))

    async def settle(self, info: BucketInfo, meta: ObjectMeta) -> None:
        """After a commit: wake the flusher when a segment's worth waits; on
        a write-through bucket, return only once the capacity tier has it."""
        self.note_staged(meta.chunks)
        if info.write_through:
            await self._flusher.wait_flushed(meta.seq, self._settings.write_through_timeout)

    async def settle_delete(self, info: BucketInfo) -> None:
        """On a write-through bucket a delete is acknowledged once its
        tombstone is in the capacity tier, like a write."""
        if info.write_through:
            await self._flusher.wait_records(self._index.last_seq, self._settings.write_through_timeout)

