"""The object service: buckets and objects across the tiers.

This is the one entry point the gateway uses for data. It validates names,
streams bodies into the hot tier (or, when they do not fit, straight into a
segment) while hashing, verifies digests, commits to the index, and only
then removes what a write superseded, so a crash at any point leaves either
the old or the new version, never a mix. Reads take each piece from where
it is: a staged file, the cache, or the capacity tier.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packer.ranges import ByteRange, split_over
from tiering import pool
from tiering.capacity import CapacityStore
from tiering.cluster.peers import FETCH, PeerClient, PeerRefused
from tiering.conditions import Conditions, check
from tiering.digests import Digests, check_size, gather, verify
from tiering.epochs import Epochs
from tiering.errors import (
    BucketAlreadyOwnedByYou,
    EntityTooLarge,
    InvalidRange,
    NoSuchBucket,
    NoSuchKey,
    NotSupported,
    SlowDown,
)
from tiering.fetch import segment_path
from tiering.hot import HotTier
from tiering.index import Index, ListPage
from tiering.inputs import Integrity, NewObject
from tiering.jobs import Jobs
from tiering.meta import BucketInfo, Checksum, Chunk, Extent, ObjectMeta, SegmentInfo, now_ms
from tiering.mounts.buckets import Mounts
from tiering.mounts.uploads import MountUploads
from tiering.multipart import Multipart
from tiering.names import check_bucket_name, check_key
from tiering.policy import Policies
from tiering.readahead import ReadTally, Source, stream
from tiering.segments import Piece, SegmentStream
from tiering.settings import TierSettings
from tiering.tiers import Tiers
from tiering.warm import Warmer

log = logging.getLogger("tierstore.objects")

MAX_PUT_SIZE = 5 * 1024**3  # S3's limit for a single PUT
_ROOM_WAIT = 10.0  # seconds a small write waits for the flusher to free staging room


# A read worker's lookup answer (see ObjectService.locate_many).
Located = tuple[Any, ...]


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
            checksum=self.checksum,
            chunks=self.chunks,
        )


class ObjectService:
    """Buckets and objects; owns the index and the hot tier of one node."""

    def __init__(
        self, data_dir: Path, settings: TierSettings, capacity: CapacityStore, region: str = "us-east-1"
    ) -> None:
        self.data_dir = data_dir
        self.region = region
        self.settings = settings
        self.index = Index(data_dir / "index")
        self.hot = HotTier(data_dir / "hot", settings.hot_size, settings.high_watermark, settings.low_watermark)
        self.policies = Policies(self.index, settings)
        self.tiers = Tiers(self.index, self.hot, capacity, settings, self.policies, region)
        self.multipart = Multipart(self)
        self.mounts = Mounts(self.index, self.hot, settings, region)
        self.mount_uploads = MountUploads(self.mounts)
        self.warmer = Warmer(self)
        self.epochs = Epochs(self)
        self.jobs = Jobs()
        # The other gateways over the same store, asked for an extent before
        # the store (``tiering/cluster/peers.py``); set before ``start`` when configured.
        self.peers: PeerClient | None = None

    async def start(self) -> None:
        """Remove what a crash left half-done, then start the tiers.

        After a clean shutdown there is nothing to remove and the staged
        byte count was saved, so start-up skips the sweep, which has to read
        every index record (tens of seconds for millions of objects).
        Committed writes not yet flushed are still in the flush queue: the
        flusher takes them up again."""
        await pool.run(self.hot.resume, self.index.referenced_files)
        await self.tiers.residency.restore()
        await self.tiers.start()
        await self.mounts.start()
        self.epochs.start()
        if self.peers is not None:
            await self.peers.start()

    async def close(self) -> None:
        if self.peers is not None:
            await self.peers.close()
        await self.jobs.stop()
        await self.epochs.stop()
        await self.mounts.close()
        await self.tiers.stop()
        await pool.run(self.index.close)
        await pool.run(self.hot.mark_clean)

    # -- buckets -----------------------------------------------------------

    async def create_bucket(self, name: str, **policy: object) -> BucketInfo:
        """Create a bucket; ``policy`` sets BucketInfo policy fields (the
        node's write-through setting is the default)."""
        check_bucket_name(name)
        if await pool.run(self.index.get_bucket, name) is not None:
            raise BucketAlreadyOwnedByYou(BucketName=name)  # on every node, not only its writer
        async with self.tiers.writing_to(name):
            info = BucketInfo(name=name, created_ms=now_ms(), region=self.region,
                              write_through=self.settings.write_through)
            info = replace(info, **policy)  # type: ignore[arg-type]
            if not await pool.run(self.index.create_bucket, info):
                raise BucketAlreadyOwnedByYou(BucketName=name)
            self.policies.changed(name)
            return info

    async def delete_bucket(self, name: str) -> None:
        self.mounts.managed_only(name, "DeleteBucket (unmount instead)")
        async with self.tiers.writing_to(name):
            await pool.run(self.index.delete_bucket, name)
            self.policies.changed(name)

    async def bucket(self, name: str) -> BucketInfo:
        """A managed bucket, or a mount (read-only, see ``tiering.mounts``)."""
        info = self.index.get_bucket(name) or self.mounts.bucket(name)  # point reads: microseconds
        if info is None:
            raise NoSuchBucket(BucketName=name)
        return info

    async def set_policy(self, info: BucketInfo) -> BucketInfo:
        async with self.tiers.writing_to(info.name):
            await pool.run(self.index.update_bucket, info)
            self.policies.changed(info.name)
            return info

    async def list_buckets(self) -> list[BucketInfo]:
        managed = await pool.run(self.index.list_buckets)
        mounted = [self.mounts.bucket(m.name) for m in self.mounts.all()]
        return sorted([*managed, *mounted], key=lambda b: b.name)  # type: ignore[arg-type]

    # -- objects -----------------------------------------------------------

    async def head(self, bucket: str, key: str) -> ObjectMeta:
        if self.mounts.get(bucket) is not None:
            return await self.mounts.head(bucket, key)
        meta = await pool.run(self.index.get_object, bucket, key)
        if meta is None:
            await self.bucket(bucket)
            raise NoSuchKey(Key=key)
        return meta

    async def fetch(
        self, bucket: str, key: str, small: int, tally: ReadTally | None = None
    ) -> tuple[ObjectMeta, bytes | None]:
        """The object's record and, when it is at most ``small`` bytes and
        all in the hot tier, its whole body, in one pool call: a small GET
        costs one hand-off. Otherwise the body comes from :meth:`read`.
        ``tally.fetched`` says when the body came from the capacity side."""
        if self.mounts.get(bucket) is not None:
            meta, data = await self.mounts.open_for_read(bucket, key, small)
            if data is not None and tally is not None:
                tally.fetched = True
            return meta, data
        meta, data = await pool.run(self._fetch, bucket, key, small)
        if meta is None:
            await self.bucket(bucket)
            raise NoSuchKey(Key=key)
        return meta, data

    def _fetch(self, bucket: str, key: str, small: int) -> tuple[ObjectMeta | None, bytes | None]:
        meta = self.index.get_object(bucket, key)
        if meta is None or meta.size > small:
            return meta, None
        pieces = []
        try:
            for c in meta.chunks:
                if c.file_id is not None:
                    pieces.append(self.hot.read(c.file_id, 0, c.size))
                    continue
                data = self.hot.read_cached(c.extent.cache_name, c.size)  # type: ignore[union-attr]
                if data is None:
                    return meta, None  # a miss: read() fetches from the capacity tier
                pieces.append(data)
        except FileNotFoundError:
            # Flushed, replaced or deleted between the lookup and the read:
            # answer from whatever version is current now.
            return self._fetch(bucket, key, small)
        self.tiers.reader.hits += 1
        return meta, b"".join(pieces)

    async def locate_many(self, wanted: list[tuple[str, str, bool]]) -> list[Located]:
        """For read workers: where the bytes of each (bucket, key, read) are,
        all looked up in one pool call. An answer is ``("hot", record,
        files)``: the object's encoded record and the hot-tier files that
        hold all of its bytes, in order, as (path, size); ``("elsewhere",)``
        when some bytes are not hot or the bucket is mounted (the writer
        serves those itself); or ``("NoSuchBucket",)`` / ``("NoSuchKey",)``.
        With ``read`` (a GET, not a HEAD) a hot answer counts as a read: a
        cache hit, and an epoch reader's position moves."""
        mounted = [self.mounts.get(bucket) is not None for bucket, _, _ in wanted]
        for (bucket, key, read), is_mount in zip(wanted, mounted, strict=True):
            if read and not is_mount:
                self.epochs.observe(bucket, key)
        return await pool.run(self._locate_many, wanted, mounted)

    def _locate_many(self, wanted: list[tuple[str, str, bool]], mounted: list[bool]) -> list[Located]:
        out: list[Located] = []
        for (bucket, key, read), is_mount in zip(wanted, mounted, strict=True):
            if is_mount:
                out.append(("elsewhere",))
                continue
            raw = self.index.get_object_record(bucket, key)
            if raw is None:
                out.append(("NoSuchKey",) if self.index.get_bucket(bucket) is not None else ("NoSuchBucket",))
                continue
            meta = ObjectMeta.from_bytes(raw)
            files = []
            for c in meta.chunks:
                if c.file_id is not None:
                    files.append((str(self.hot.path_of(c.file_id)), c.size))
                elif c.extent is not None and self.hot.touch_cached(c.extent.cache_name):
                    files.append((str(self.hot.cache_path(c.extent.cache_name)), c.size))
                else:
                    break
            else:
                if read:
                    self.tiers.reader.hits += 1
                out.append(("hot", raw, files))
                continue
            out.append(("elsewhere",))
        return out

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
        info = await self.bucket(bucket)
        self.mounts.writable(bucket)
        if integrity.expected_size is not None and integrity.expected_size > MAX_PUT_SIZE:
            raise EntityTooLarge(ProposedSize=integrity.expected_size, MaxSizeAllowed=MAX_PUT_SIZE)
        if self.mounts.get(bucket) is not None:
            if if_none_match or if_match is not None:
                raise NotSupported("Conditional writes to a mounted bucket are not supported")
            return await self._put_mounted(bucket, key, body, new, integrity)
        async with self.tiers.writing_to(bucket):
            if if_none_match and self.index.get_object(bucket, key) is not None:
                # Checked again atomically at commit; failing early saves the upload.
                check(await self.head(bucket, key), Conditions(if_none_match="*"), for_copy=True)
            staged = await self.stage(body, integrity, Piece(bucket, key, 0))
            meta = staged.as_object(bucket, key, new)
            meta = await self.commit(meta, staged.segment, if_none_match=if_none_match, if_match=if_match)
            await self.settle(info, meta)
            return meta

    async def _put_mounted(
        self, bucket: str, key: str, body: AsyncIterator[bytes], new: NewObject, integrity: Integrity
    ) -> ObjectMeta:
        """A write through a read-write mount: streamed to the source as it
        arrives (hashed on the way), completed only once the digests check."""
        upload = await self.mounts.open_upload(bucket, key, new)
        digests = Digests(integrity.checksum_algorithm, sha256=integrity.payload_sha256 is not None)

        async def send(block: bytes) -> None:
            await pool.run(digests.update, block)
            await upload.write(block)

        try:
            await gather(body, send)
            check_size(digests, integrity)
            checksum = verify(digests, integrity)
            await upload.complete()
        except BaseException:
            await upload.abort()
            raise
        meta = await self.mounts.committed(bucket, key)
        return replace(meta, checksum=checksum)  # for the answer; the source keeps its own

    async def settle(self, info: BucketInfo, meta: ObjectMeta) -> None:
        """After a commit: wake the flusher when a segment's worth waits; on
        a write-through bucket, return only once the capacity tier has it."""
        self.tiers.flusher.note_staged(sum(c.size for c in meta.chunks if c.file_id is not None))
        if info.write_through:
            await self.tiers.flusher.wait_flushed(meta.seq, self.settings.write_through_timeout)

    async def commit(self, meta: ObjectMeta, segment: SegmentInfo | None = None, **conditions: object) -> ObjectMeta:
        """Make ``meta`` the current version; drop the files it replaced.
        On failure the new files (or streamed segment) are removed, so
        nothing is left behind."""
        if segment is not None:
            segment = replace(segment, live=sum(c.extent.stored for c in meta.chunks if c.extent))
        try:
            meta, old = await pool.run(self.index.put_object, meta, segment=segment, **conditions)
        except BaseException:
            await self.discard(meta.chunks, segment)
            raise
        if old is not None:
            await self.forget(old.chunks, keep=meta.chunks)
        return meta

    async def discard(self, chunks: Iterable[Chunk], segment: SegmentInfo | None = None) -> None:
        """Remove bytes written for a write that did not commit."""
        await pool.run(self.hot.remove, chunks)
        if segment is not None:
            await self.tiers.capacity.delete(segment_path(segment.name))

    async def forget(self, chunks: Iterable[Chunk], keep: Iterable[Chunk] = ()) -> None:
        """Remove the staged files and cached extents of ``chunks`` that
        ``keep`` does not use (after the index no longer refers to them)."""
        chunks = list(chunks)
        kept = {c.file_id for c in keep if c.file_id} | {c.extent.cache_name for c in keep if c.extent}
        await pool.run(self.hot.remove, [c for c in chunks if c.file_id and c.file_id not in kept])
        cached = [c.extent.cache_name for c in chunks if c.extent and c.extent.cache_name not in kept]
        if cached:
            await pool.run(self.hot.drop_cached, cached)

    async def stage(self, body: AsyncIterator[bytes], integrity: Integrity, label: Piece) -> Staged:
        """Take ``body`` in: into durable hot-tier files, or, when it cannot
        fit in the hot tier now, straight into a segment of its own."""
        settings = self.policies.settings(label.bucket)
        size = integrity.expected_size
        reserved = 0
        if size is not None:
            if not await self._make_room(size, settings.small_object_size):
                return await self._stream(body, integrity, label, settings)
            reserved = size
        digests = Digests(integrity.checksum_algorithm, sha256=integrity.payload_sha256 is not None)
        writer = self.hot.writer(settings.part_size, digests, reserved)
        try:
            await gather(body, lambda block: pool.run(writer.write, block))
            check_size(digests, integrity)
            chunks = await pool.run(writer.finish)
            checksum = verify(digests, integrity)
        except BaseException:
            await pool.run(writer.abort)
            raise
        return Staged(chunks, digests.md5.hexdigest(), checksum)

    async def _make_room(self, size: int, small: int) -> bool:
        """Reserve staging room; False means: stream this body past the hot
        tier (it is large). A small body waits for the flusher to free room,
        then gets SlowDown: staged data is never evicted, and the disk is
        never filled past the budget."""
        if self.hot.reserve(size):
            if self.hot.over_high:
                await pool.run(self.hot.evict)
            return True
        if size > small:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _ROOM_WAIT
        while loop.time() < deadline:
            self.tiers.flusher.request()
            await asyncio.sleep(0.05)
            if self.hot.reserve(size):
                if self.hot.over_high:
                    await pool.run(self.hot.evict)
                return True
        raise SlowDown("The hot tier is full of data not yet in the capacity tier; retry later")

    async def _stream(
        self, body: AsyncIterator[bytes], integrity: Integrity, label: Piece, settings: TierSettings
    ) -> Staged:
        """Write the body into a new segment as it arrives, one part-sized
        extent at a time; memory holds a few parts, the hot tier nothing."""
        name = await pool.run(self.index.new_segment_name)
        stream = SegmentStream(self.tiers.capacity, name, settings)
        digests = Digests(integrity.checksum_algorithm, sha256=integrity.payload_sha256 is not None)
        chunks: list[Chunk] = []

        async def put_part(block: bytes) -> None:
            await pool.run(digests.update, block)
            chunks.append(await stream.add(label, len(chunks), block))

        try:
            await gather(body, put_part, settings.part_size)
            check_size(digests, integrity)
            checksum = verify(digests, integrity)
            if not chunks:
                chunks.append(await stream.add(label, 0, b""))
            info = await stream.finish()
        except BaseException:
            await stream.abort()
            raise
        return Staged(tuple(chunks), digests.md5.hexdigest(), checksum, info)

    async def read(
        self, meta: ObjectMeta, wanted: ByteRange, tally: ReadTally | None = None, ask_peers: bool = True
    ) -> AsyncIterator[bytes]:
        """Yield the bytes of ``wanted`` in order, in blocks of about 1 MiB.

        Staged chunks and cached extents are read with pread; missing
        extents are fetched, up to ``fetch_concurrency`` of them ahead of
        the one being sent: from the node that owns their segment when this
        one has peers (and ``ask_peers``: not for a peer's own request),
        else, or if that node does not send them, from the capacity tier.
        ``tally`` counts the bytes yielded by the tier they came from."""
        tally = tally if tally is not None else ReadTally()
        if self.mounts.get(meta.bucket) is not None:
            async for block in self.mounts.read(meta, wanted, tally):
                yield block
            return
        pin = self.policies.pinned(meta.bucket, meta.key)
        origin = meta if ask_peers and self.peers is not None else None
        # Where each chunk starts in the object: what a peer is asked for.
        starts = list(itertools.accumulate((c.size for c in meta.chunks), initial=0)) if origin else None

        async def open_piece(index: int) -> Source:
            chunk = meta.chunks[index]
            if chunk.file_id is None:
                return await self._source(chunk, pin, origin, starts[index] if starts else 0)
            try:
                return await pool.run(self.hot.open, chunk.file_id)
            except FileNotFoundError:
                # Flushed since the lookup (the file became a cached extent):
                # read the same version's extent instead.
                return await self._source(
                    await self._reload_chunk(meta, index), pin, origin, starts[index] if starts else 0
                )

        pieces = list(split_over([c.size for c in meta.chunks], wanted))
        async for block in stream(
            pieces, open_piece, window=self.settings.fetch_concurrency, tally=tally,
            prefetch=lambda index: meta.chunks[index].file_id is None,  # files open when their turn comes
        ):
            yield block

    def is_hot(self, meta: ObjectMeta, wanted: ByteRange) -> bool:
        """True if every byte of ``wanted`` is staged or cached on this node
        (a mounted bucket's objects are not asked about: False)."""
        if self.mounts.get(meta.bucket) is not None:
            return False
        for index, _ in split_over([c.size for c in meta.chunks], wanted):
            chunk = meta.chunks[index]
            if chunk.file_id is None and not (chunk.extent and self.hot.is_cached(chunk.extent.cache_name)):
                return False
        return True

    async def _source(
        self, chunk: Chunk, pin: bool, origin: ObjectMeta | None = None, start: int = 0
    ) -> int | bytes:
        """A descriptor on the cached extent, or its bytes after a fetch
        (cached, pinned when ``pin``); ``origin`` and ``start`` (the object
        and where the chunk starts in it) let a peer that owns the segment
        send them."""
        ext = chunk.extent
        assert ext is not None
        fd = await self.tiers.reader.open_cached(ext)
        if fd is not None:
            return fd
        ask = None
        if origin is not None and self.peers is not None:
            node = self.peers.group.owner(ext.segment)
            if node != self.peers.group.me:
                ask = functools.partial(self._from_peer, node, origin, start, ext)
        return await self.tiers.reader.fetch(ext, pin, ask)

    async def _from_peer(self, node: str, meta: ObjectMeta, start: int, ext: Extent) -> bytes | None:
        """The extent from the node that owns its segment (it reads the
        store on a miss, once for every node); None to read the store here."""
        assert self.peers is not None
        try:
            return await self.peers.extent(node, meta.bucket, meta.key, meta.etag, start, ext,
                                           self.settings.compression_level, FETCH)
        except PeerRefused as exc:
            log.info("peer %s did not send %s/%s: %s", node, meta.bucket, meta.key, exc)
            return None

    async def _reload_chunk(self, meta: ObjectMeta, index: int) -> Chunk:
        current = await pool.run(self.index.get_object, meta.bucket, meta.key)
        if current is None or current.seq != meta.seq or current.chunks[index].extent is None:
            raise NoSuchKey("The object was replaced while it was being read", Key=meta.key)
        return current.chunks[index]

    async def read_all(self, meta: ObjectMeta, wanted: ByteRange | None = None) -> bytes:
        wanted = wanted or ByteRange(0, meta.size)
        return b"".join([piece async for piece in self.read(meta, wanted)])

    async def delete(self, bucket: str, key: str) -> None:
        """Idempotent, like S3: deleting a missing key succeeds."""
        info = await self.bucket(bucket)
        if self.mounts.get(bucket) is not None:
            await self.mounts.delete(bucket, key)
            return
        async with self.tiers.writing_to(bucket):
            old = await pool.run(self.index.delete_object, bucket, key)
            if old is not None:
                await self.forget(old.chunks)
                await self._settle_delete(info)

    async def delete_many(self, bucket: str, keys: list[str]) -> None:
        """DeleteObjects: one index commit for all keys, then the files."""
        info = await self.bucket(bucket)
        for key in keys:
            check_key(key)
        if self.mounts.get(bucket) is not None:
            for key in keys:
                await self.mounts.delete(bucket, key)
            return
        async with self.tiers.writing_to(bucket):
            removed = await pool.run(self.index.delete_objects, bucket, keys)
            for old in removed:
                await self.forget(old.chunks)
            if removed:
                await self._settle_delete(info)

    async def _settle_delete(self, info: BucketInfo) -> None:
        """On a write-through bucket a delete is acknowledged once its
        tombstone is in the capacity tier, like a write."""
        if info.write_through:
            await self.tiers.flusher.wait_records(self.index.last_seq, self.settings.write_through_timeout)

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
        info = await self.bucket(bucket)
        self.mounts.writable(bucket)
        new = new or NewObject(source.content_type, dict(source.headers), dict(source.user_meta))
        algorithm = checksum_algorithm or (source.checksum.algorithm if source.checksum else None)
        if self.mounts.get(bucket) is not None:
            body = self.read(source, ByteRange(0, source.size))
            integrity = Integrity(checksum_algorithm=algorithm, expected_size=source.size)
            return await self._put_mounted(bucket, key, body, new, integrity)
        async with self.tiers.writing_to(bucket):
            staged = await self.stage(
                self.read(source, ByteRange(0, source.size)),
                Integrity(checksum_algorithm=algorithm, expected_size=source.size),
                Piece(bucket, key, 0),
            )
            meta = await self.commit(staged.as_object(bucket, key, new), staged.segment)
            await self.settle(info, meta)
            return meta

    async def rewrite_meta(self, source: ObjectMeta, new: NewObject) -> ObjectMeta:
        """CopyObject onto itself with REPLACE: same bytes, new metadata."""
        if self.mounts.get(source.bucket) is not None:
            return await self.copy(source, source.bucket, source.key, new)
        async with self.tiers.writing_to(source.bucket):
            meta = replace(
                source,
                content_type=new.content_type,
                headers=new.headers,
                user_meta=new.user_meta,
                last_modified_ms=now_ms(),
            )
            meta, _ = await pool.run(self.index.put_object, meta, if_match=source.etag, keep_chunks=True)
            await self.settle(await self.bucket(meta.bucket), meta)
            return meta

    async def list(
        self, bucket: str, prefix: str = "", delimiter: str = "", marker: str = "", max_keys: int = 1000
    ) -> ListPage:
        await self.bucket(bucket)
        if self.mounts.get(bucket) is not None:
            return await self.mounts.list_objects(bucket, prefix, delimiter, marker, max_keys)
        return await pool.run(self.index.list_objects, bucket, prefix, delimiter, marker, max_keys)


def resolve_part(meta: ObjectMeta, part_number: int) -> ByteRange:
    """The byte range of part ``part_number`` (GetObject ?partNumber=)."""
    sizes = meta.part_sizes or (meta.size,)
    if not 1 <= part_number <= len(sizes):
        raise InvalidRange("The requested partnumber is not satisfiable", ActualObjectSize=meta.size)
    start = sum(sizes[: part_number - 1])
    return ByteRange(start, start + sizes[part_number - 1])
