"""The object service: buckets and objects, whatever kind of bucket.

This is the one entry point the gateway uses for data. It checks names and
limits, then hands each call to the backend of the bucket's kind: managed
(``tiering.managed.backend``: this gateway's own layout) or mounted
(``tiering.mounts.backend``: existing data at a source). Both answer the
same small protocol, :class:`Buckets`, so nothing above this module asks
which kind a bucket is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Protocol

from packer.ranges import ByteRange
from tiering import pool
from tiering.batch.hot import HotBatch
from tiering.batch.member import Member
from tiering.batch.reads import BatchReads
from tiering.errors import (
    BucketAlreadyOwnedByYou,
    EntityTooLarge,
    MalformedVersioning,
    NoSuchBucket,
    PreconditionFailed,
)
from tiering.index.bucket_settings import Policies
from tiering.index.db import Index, ListPage
from tiering.maintenance.tiers import Tiers
from tiering.meta import BucketInfo, ObjectMeta, Part, Upload, now_ms
from tiering.model.conditions import Conditions, WriteConditions
from tiering.model.inputs import Integrity, NewObject, Write
from tiering.model.names import check_bucket_name, check_key
from tiering.model.tags import check_tags
from tiering.model.uploads import ChosenPart, check_create, check_part
from tiering.model.versions import STATUSES, Deletion, VersionPage
from tiering.mounts.buckets import Mounts
from tiering.mounts.gather import MountGather
from tiering.prefetch.epochs import Epochs
from tiering.reads.plan import Location, Read, ReadPlan, ReadTally
from tiering.settings import TierSettings

MAX_PUT_SIZE = 5 * 1024**3  # S3's limit for a single PUT


class Uploads(Protocol):
    """Multipart uploads of one kind of bucket (arguments checked by the caller)."""

    async def create(self, bucket: str, key: str, new: NewObject, checksum_algorithm: str | None,
                     checksum_type: str | None) -> Upload: ...
    async def upload_part(self, bucket: str, key: str, upload_id: str, part_number: int,
                          body: AsyncIterator[bytes], integrity: Integrity) -> Part: ...
    async def complete(self, bucket: str, key: str, upload_id: str, chosen: list[ChosenPart],
                       conditions: WriteConditions = ...) -> ObjectMeta: ...
    async def abort(self, bucket: str, key: str, upload_id: str) -> None: ...
    async def list_parts(self, bucket: str, key: str, upload_id: str, after: int,
                         limit: int) -> tuple[Upload, list[Part], bool]: ...
    async def list_uploads(self, bucket: str, prefix: str, key_marker: str, upload_id_marker: str,
                           limit: int) -> tuple[list[Upload], bool]: ...


class Buckets(Protocol):
    """What one kind of bucket answers (the bucket exists: checked by the service)."""

    uploads: Uploads

    def plan_now(self, read: Read) -> ReadPlan | None: ...
    async def plan(self, read: Read) -> ReadPlan: ...
    async def head(self, bucket: str, key: str, version: str | None = None) -> ObjectMeta: ...
    async def tags(self, bucket: str, key: str, version: str | None = None) -> dict[str, str]: ...
    def stream(self, meta: ObjectMeta, wanted: ByteRange, tally: ReadTally | None = None,
               ask_peers: bool = True) -> AsyncIterator[bytes]: ...
    def locate(self, bucket: str, key: str, read: bool) -> Location: ...
    async def list(self, bucket: str, prefix: str, delimiter: str, marker: str, max_keys: int) -> ListPage: ...
    async def list_versions(self, bucket: str, prefix: str, delimiter: str, key_marker: str,
                            version_marker: str, max_keys: int) -> VersionPage: ...
    def writable(self, bucket: str) -> None: ...
    async def set_versioning(self, info: BucketInfo, status: str) -> BucketInfo: ...
    async def put(self, info: BucketInfo, write: Write) -> ObjectMeta: ...
    async def rewrite_meta(self, info: BucketInfo, source: ObjectMeta, new: NewObject) -> ObjectMeta: ...
    async def retag(self, info: BucketInfo, key: str, tags: dict[str, str],
                    version: str | None = None) -> ObjectMeta: ...
    async def delete(self, info: BucketInfo, key: str, conditions: WriteConditions | None = None,
                     version: str | None = None) -> Deletion: ...
    async def delete_many(self, info: BucketInfo, targets: list[tuple[str, str | None]]) -> list[Deletion]: ...


def copied_meta(source: ObjectMeta) -> NewObject:
    """The metadata of a copy that keeps the source's (MetadataDirective
    COPY): content type, stored headers, user metadata and tags."""
    return NewObject(source.content_type, dict(source.headers), dict(source.user_meta), dict(source.tags))


class ObjectService:
    """Buckets and objects of one node, across both kinds of bucket."""

    def __init__(
        self,
        index: Index,
        tiers: Tiers,
        policies: Policies,
        mounts: Mounts,
        managed: Buckets,
        mounted: Buckets,
        epochs: Epochs,
        settings: TierSettings,
        region: str,
        find_bucket: Callable[[str], BucketInfo | None],
    ) -> None:
        self._find_bucket = find_bucket
        self._index = index
        self._tiers = tiers
        self._policies = policies
        self._mounts = mounts
        self._managed = managed
        self._mounted = mounted
        self._epochs = epochs
        self._settings = settings
        self._region = region
        self._batches = BatchReads(index, tiers.hot, tiers.reader, epochs)

    def _backend(self, bucket: str) -> Buckets:
        """The one place that asks what kind a bucket is."""
        return self._mounted if self._mounts.get(bucket) is not None else self._managed

    # -- buckets -----------------------------------------------------------

    async def create_bucket(self, name: str, **policy: object) -> BucketInfo:
        """Create a bucket; ``policy`` sets BucketInfo policy fields (the
        node's write-through setting is the default)."""
        check_bucket_name(name)
        if await pool.run(self._index.get_bucket, name) is not None:
            raise BucketAlreadyOwnedByYou(BucketName=name)  # on every node, not only its writer
        async with self._tiers.writing_to(name):
            info = BucketInfo(name=name, created_ms=now_ms(), region=self._region,
                              write_through=self._settings.write_through)
            info = replace(info, **policy)  # type: ignore[arg-type]
            if not await pool.run(self._index.create_bucket, info):
                raise BucketAlreadyOwnedByYou(BucketName=name)
            self._policies.changed(name)
            return info

    async def delete_bucket(self, name: str) -> None:
        self._mounts.managed_only(name, "DeleteBucket (unmount instead)")
        async with self._tiers.writing_to(name):
            await pool.run(self._index.delete_bucket, name)
            self._policies.changed(name)

    async def bucket(self, name: str) -> BucketInfo:
        """A managed bucket, or a mount (see ``tiering.mounts``)."""
        info = self._find_bucket(name)
        if info is None:
            raise NoSuchBucket(BucketName=name)
        return info

    async def set_versioning(self, name: str, status: str) -> BucketInfo:
        """PutBucketVersioning: Enabled or Suspended (a bucket once versioned
        never goes back to unversioned, as in S3; ``tiering/model/versions.py``)."""
        if status not in STATUSES:
            raise MalformedVersioning(f"Versioning status must be one of {', '.join(STATUSES)}")
        info = await self.bucket(name)
        info = await self._backend(name).set_versioning(info, status)
        self._policies.changed(name)
        return info

    async def set_policy(self, info: BucketInfo) -> BucketInfo:
        async with self._tiers.writing_to(info.name):
            await pool.run(self._index.update_bucket, info)
            self._policies.changed(info.name)
            return info

    async def list_buckets(self) -> list[BucketInfo]:
        managed = await pool.run(self._index.list_buckets)
        mounted = [self._mounts.bucket(m.name) for m in self._mounts.all()]
        return sorted([*managed, *mounted], key=lambda b: b.name)  # type: ignore[arg-type]

    # -- reads -------------------------------------------------------------

    async def read(self, read: Read) -> ReadPlan:
        """A GET or HEAD, answered in one call: see ``tiering.reads.plan``. A GET
        of a client (not of a peer) moves the epoch readers first, so the
        prefetcher looks ahead of this read while it runs."""
        if read.body and read.peer is None:
            self._epochs.observe(read.bucket, read.key)
        backend = self._backend(read.bucket)
        # A hot small object is answered from memory on the event loop; the
        # rest (and anything that would wait for the disk, or a version
        # named by id) through the pool.
        now = backend.plan_now(read) if read.version is None else None
        return now if now is not None else await backend.plan(read)

    async def head(self, bucket: str, key: str, version: str | None = None) -> ObjectMeta:
        return await self._backend(bucket).head(bucket, key, version)

    async def batch(
        self, bucket: str, keys: Sequence[str], fail: bool, tally: ReadTally,
        etags: Sequence[str] | None = None, peer: str | None = None,
    ) -> HotBatch | AsyncIterator[Member]:
        """The objects of ``keys`` in order (``tiering.batch.reads``): a
        :class:`HotBatch` when they are few, small and all hot (every
        member known before the first byte), else members as they are
        read. With ``fail``, a key that cannot be found raises its error
        here. ``tally`` counts the bytes by tier as they are read. With
        ``etags`` (one a key), each member is read only at that ETag, as a
        GET with If-Match (else its error is PreconditionFailed); ``peer``:
        another gateway asking, whose reads are never passed on."""
        await self.bucket(bucket)
        backend = self._backend(bucket)
        wanted = dict(zip(keys, etags, strict=True)) if etags is not None else None

        async def read_one(key: str) -> ReadPlan:
            conditions = Conditions(if_match=f'"{wanted[key]}"') if wanted is not None else Conditions()
            answer = await backend.plan(Read(bucket, key, conditions=conditions, peer=peer))
            if answer.status == 412:
                raise PreconditionFailed("At least one of the pre-conditions you specified did not hold",
                                         Condition="If-Match")
            return answer

        if backend is self._mounted or wanted is not None:  # objects read as GETs, several at once
            if fail:
                await self._batches.check_all(keys, lambda key: backend.head(bucket, key))
            owners = self._mounts.owners
            gather = MountGather(self._mounts, owners) if owners is not None and peer is None and \
                backend is self._mounted else None
            return self._batches.mounted(bucket, keys, read_one, tally, gather)
        found, hot = await self._batches.lookup_open(bucket, keys, tally)
        if fail:
            for meta in found:
                if not isinstance(meta, ObjectMeta):
                    if hot is not None:
                        hot.close()
                    raise meta
        if hot is not None:
            return hot
        return self._batches.managed(bucket, keys, found, read_one, tally)

    def stream(
        self, meta: ObjectMeta, wanted: ByteRange, tally: ReadTally | None = None, ask_peers: bool = True
    ) -> AsyncIterator[bytes]:
        """The bytes of ``wanted`` of a version from :meth:`head`, in order."""
        return self._backend(meta.bucket).stream(meta, wanted, tally, ask_peers)

    async def read_all(self, meta: ObjectMeta, wanted: ByteRange | None = None) -> bytes:
        wanted = wanted or ByteRange(0, meta.size)
        return b"".join([piece async for piece in self.stream(meta, wanted)])

    async def locate_many(self, wanted: list[tuple[str, str, bool]]) -> list[Location]:
        """For read workers: where the bytes of each (bucket, key, read) are,
        all looked up in one pool call (see ``ManagedBuckets.locate``). A
        read (a GET, not a HEAD) moves the epoch readers, as a GET here does."""
        backends = [self._backend(bucket) for bucket, _, _ in wanted]
        for bucket, key, read in wanted:
            if read:
                self._epochs.observe(bucket, key)

        def locate() -> list[Location]:
            return [b.locate(*w) for b, w in zip(backends, wanted, strict=True)]

        return await pool.run(locate)

    def observe_reads(self, reads: list[tuple[str, str, list[str]]]) -> None:
        """On the event loop: GETs read workers answered from the lookups
        they kept, each (bucket, key, the names of its hot files): what a
        lookup with ``read`` does, done now. The epoch readers move, the
        cached files are marked visited for eviction (a staged file's name
        is in no cache: nothing to mark) and a managed object counts a hit."""
        hot, reader = self._tiers.hot, self._tiers.reader
        for bucket, key, names in reads:
            self._epochs.observe(bucket, key)
            for name in names:
                hot.touch_cached(name)
            if self._mounts.get(bucket) is None:
                reader.hits += 1

    async def list(
        self, bucket: str, prefix: str = "", delimiter: str = "", marker: str = "", max_keys: int = 1000
    ) -> ListPage:
        await self.bucket(bucket)
        return await self._backend(bucket).list(bucket, prefix, delimiter, marker, max_keys)

    async def list_versions(self, bucket: str, prefix: str = "", delimiter: str = "", key_marker: str = "",
                            version_marker: str = "", max_keys: int = 1000) -> VersionPage:
        """ListObjectVersions: every version and delete marker, key order,
        newest first within a key."""
        await self.bucket(bucket)
        return await self._backend(bucket).list_versions(bucket, prefix, delimiter, key_marker, version_marker,
                                                         max_keys)

    # -- writes ------------------------------------------------------------

    async def _writable(self, bucket: str, key: str) -> tuple[Buckets, BucketInfo]:
        check_key(key)
        info = await self.bucket(bucket)
        backend = self._backend(bucket)
        backend.writable(bucket)
        return backend, info

    async def put(
        self,
        bucket: str,
        key: str,
        body: AsyncIterator[bytes],
        new: NewObject,
        integrity: Integrity,
        conditions: WriteConditions = WriteConditions(),
    ) -> ObjectMeta:
        backend, info = await self._writable(bucket, key)
        check_tags(new.tags)
        if integrity.expected_size is not None and integrity.expected_size > MAX_PUT_SIZE:
            raise EntityTooLarge(ProposedSize=integrity.expected_size, MaxSizeAllowed=MAX_PUT_SIZE)
        return await backend.put(info, Write(key, body, new, integrity, conditions))

    async def copy(
        self,
        source: ObjectMeta,
        bucket: str,
        key: str,
        new: NewObject,
        checksum_algorithm: str | None = None,
        conditions: WriteConditions = WriteConditions(),
    ) -> ObjectMeta:
        """Copy the bytes of ``source`` to bucket/key with the metadata
        ``new`` (``copied_meta`` for the source's own)."""
        backend, info = await self._writable(bucket, key)
        check_tags(new.tags)
        algorithm = checksum_algorithm or (source.checksum.algorithm if source.checksum else None)
        body = self.stream(source, ByteRange(0, source.size))
        integrity = Integrity(checksum_algorithm=algorithm, expected_size=source.size)
        return await backend.put(info, Write(key, body, new, integrity, conditions))

    async def rewrite_meta(self, source: ObjectMeta, new: NewObject) -> ObjectMeta:
        """CopyObject onto itself with REPLACE: same bytes, new metadata. In
        a versioned bucket that is a new version, which gets bytes of its
        own (two versions never share an extent: deleting one frees them)."""
        backend, info = await self._writable(source.bucket, source.key)
        check_tags(new.tags)
        if info.versioning is not None:
            return await self.copy(source, source.bucket, source.key, new)
        return await backend.rewrite_meta(info, source, new)

    async def retag(self, bucket: str, key: str, tags: dict[str, str], version: str | None = None) -> ObjectMeta:
        """Replace the tags of the current version of ``key`` (or of
        ``version``); none: remove them."""
        backend, info = await self._writable(bucket, key)
        check_tags(tags)
        return await backend.retag(info, key, tags, version)

    async def tags(self, bucket: str, key: str, version: str | None = None) -> dict[str, str]:
        """The tags of the current version of ``key`` (or of ``version``)."""
        await self.bucket(bucket)
        return await self._backend(bucket).tags(bucket, key, version)

    async def delete(self, bucket: str, key: str, conditions: WriteConditions | None = None,
                     version: str | None = None) -> Deletion:
        """Idempotent, like S3: deleting a missing key (or version) succeeds
        (unless ``conditions`` has If-Match: then it is NoSuchKey). In a
        versioned bucket, without ``version``, it puts a delete marker."""
        info = await self.bucket(bucket)
        return await self._backend(bucket).delete(info, key, conditions, version)

    async def delete_many(self, bucket: str, targets: list[tuple[str, str | None]]) -> list[Deletion]:
        """DeleteObjects: (key, version or None) each, answered in order."""
        info = await self.bucket(bucket)
        for key, _ in targets:
            check_key(key)
        return await self._backend(bucket).delete_many(info, targets)

    # -- multipart uploads -------------------------------------------------

    async def create_upload(
        self, bucket: str, key: str, new: NewObject, checksum_algorithm: str | None = None,
        checksum_type: str | None = None,
    ) -> Upload:
        checksum_type = check_create(key, checksum_algorithm, checksum_type)
        check_tags(new.tags)
        await self.bucket(bucket)
        return await self._backend(bucket).uploads.create(bucket, key, new, checksum_algorithm, checksum_type)

    async def upload_part(
        self, bucket: str, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes],
        integrity: Integrity,
    ) -> Part:
        check_part(part_number, integrity)
        await self.bucket(bucket)
        return await self._backend(bucket).uploads.upload_part(bucket, key, upload_id, part_number, body, integrity)

    async def upload_part_copy(
        self, bucket: str, key: str, upload_id: str, part_number: int, source: ObjectMeta, wanted: ByteRange
    ) -> Part:
        body = self.stream(source, wanted)
        return await self.upload_part(bucket, key, upload_id, part_number, body,
                                      Integrity(expected_size=wanted.length))

    async def complete_upload(
        self, bucket: str, key: str, upload_id: str, chosen: list[ChosenPart],
        conditions: WriteConditions = WriteConditions(),
    ) -> ObjectMeta:
        await self.bucket(bucket)
        return await self._backend(bucket).uploads.complete(bucket, key, upload_id, chosen, conditions)

    async def abort_upload(self, bucket: str, key: str, upload_id: str) -> None:
        await self.bucket(bucket)
        await self._backend(bucket).uploads.abort(bucket, key, upload_id)

    async def list_parts(
        self, bucket: str, key: str, upload_id: str, after: int, limit: int
    ) -> tuple[Upload, list[Part], bool]:
        await self.bucket(bucket)
        return await self._backend(bucket).uploads.list_parts(bucket, key, upload_id, after, limit)

    async def list_uploads(
        self, bucket: str, prefix: str, key_marker: str, upload_id_marker: str, limit: int
    ) -> tuple[list[Upload], bool]:
        await self.bucket(bucket)
        return await self._backend(bucket).uploads.list_uploads(bucket, prefix, key_marker, upload_id_marker, limit)
