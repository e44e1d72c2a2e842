"""Mounted buckets as a bucket backend: the same calls as managed buckets
(``tiering.managed.backend``), answered by ``Mounts`` (reads through the hot tier,
writes through to the source on read-write mounts)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from packer.ranges import ByteRange
from tiering.cluster.peers import HOT
from tiering.errors import NoSuchVersion, NotHot, NotSupported
from tiering.index.db import ListPage
from tiering.meta import BucketInfo, ObjectMeta
from tiering.model.conditions import WriteConditions
from tiering.model.digests import ingest
from tiering.model.inputs import Integrity, NewObject, Write
from tiering.model.versions import NULL, Deletion, VersionEntry, VersionPage
from tiering.mounts.buckets import Mounts
from tiering.mounts.uploads import MountUploads, refuse_tags, tags_refused
from tiering.reads.plan import (
    SMALL_READ,
    Location,
    Read,
    ReadPlan,
    ReadTally,
    decide,
    plan,
    plan_from_memory,
)
from tiering.reads.readahead import Peered


class MountedBuckets:
    """Reads and writes of the objects of mounted buckets."""

    def __init__(self, mounts: Mounts, uploads: MountUploads) -> None:
        self._mounts = mounts
        self.uploads = uploads

    # -- reads -------------------------------------------------------------

    async def head(self, bucket: str, key: str, version: str | None = None) -> ObjectMeta:
        _only_null(key, version)
        return await self._mounts.head(bucket, key)

    def plan_now(self, read: Read) -> ReadPlan | None:
        """The plan of ``read`` from memory alone, on the event loop (the
        record cache, the page cache); None when :meth:`plan` must answer."""
        meta = self._mounts.known_now(read.bucket, read.key)
        return plan_from_memory(meta, read, self._mounts.read_now) if meta is not None else None

    async def plan(self, read: Read) -> ReadPlan:
        """An object not validated lately is described by one ranged GET of
        its first bytes, which are its whole body when it is small: a cold
        small read costs the source one request. A HEAD, or a GET with
        conditions (whose answer may send no body), asks with a HEAD."""
        _only_null(read.key, read.version)
        if read.peer == HOT:  # a peer asks for what memory holds (plan_now had it): never the source
            raise NotHot("Not in this gateway's hot tier yet; ask again later or read the capacity store")
        small = SMALL_READ if read.body and not read.conditions else 0
        # A peer asking (this node owns the object, as it sees it) is never passed on.
        meta, data = await self._mounts.open_for_read(read.bucket, read.key, small, ask_peers=read.peer is None)
        decision = decide(meta, read)
        tally = ReadTally()
        if not (read.body and decision.sends_body):
            return plan(meta, read, decision, tally=tally)
        wanted = decision.wanted
        if data is not None:  # fetched just now: from the source, or from the node that keeps it
            if isinstance(data, Peered):
                data = data.data
                tally.peer += wanted.length
            else:
                tally.capacity += wanted.length
            body = data if wanted.length == len(data) else data[wanted.start : wanted.end]
            return plan(meta, read, decision, body, tally)
        chunks = self._mounts.pieces.read(meta, wanted, tally, ask_peers=read.peer is None,
                                          blocks=read.blocks and wanted.length > SMALL_READ)
        if wanted.length <= SMALL_READ:
            return plan(meta, read, decision, b"".join([block async for block in chunks]), tally)
        return plan(meta, read, decision, chunks, tally)

    def locate(self, bucket: str, key: str, read: bool) -> Location:
        """Blocking: a read worker serves a mounted object itself when it is
        validated and all in the hot tier; anything else goes to the writer."""
        return self._mounts.locate(bucket, key) or Location()

    async def stream(
        self, meta: ObjectMeta, wanted: ByteRange, tally: ReadTally | None = None, ask_peers: bool = True
    ) -> AsyncIterator[bytes]:
        async for block in self._mounts.pieces.read(meta, wanted, tally if tally is not None else ReadTally(), ask_peers):
            yield block

    async def list(self, bucket: str, prefix: str, delimiter: str, marker: str, max_keys: int) -> ListPage:
        return await self._mounts.list_objects(bucket, prefix, delimiter, marker, max_keys)

    async def list_versions(self, bucket: str, prefix: str, delimiter: str, key_marker: str,
                            version_marker: str, max_keys: int) -> VersionPage:
        """A mount's objects are each their one null version (the source's
        own versions are not passed through: docs/s3-compatibility.md)."""
        if version_marker:  # the only version of key_marker is listed already
            key_marker = key_marker + "\x00"
        page = await self.list(bucket, prefix, delimiter, key_marker, max_keys)
        return VersionPage(
            entries=[VersionEntry(e.key, NULL, True, False, e.size, e.etag, e.last_modified_ms, e.checksum_algorithm)
                     for e in page.contents],
            prefixes=page.prefixes, truncated=page.truncated,
            next_key=page.last, next_version=NULL if page.last is not None and page.last not in page.prefixes else None,
        )

    # -- writes (read-write mounts) ----------------------------------------

    def writable(self, bucket: str) -> None:
        """AccessDenied for a write to a read-only mount."""
        self._mounts.writable(bucket)

    async def put(self, info: BucketInfo, write: Write) -> ObjectMeta:
        """A write through a read-write mount: streamed to the source as it
        arrives (hashed on the way), completed only once the digests check."""
        if write.conditions:
            raise NotSupported("Conditional writes to a mounted bucket are not supported")
        refuse_tags(info.name, write.new)
        self._mounts.writable(info.name)
        new = write.new
        upload = (await self._mounts.client(info.name)).upload_object(write.key, new.content_type, new.headers,
                                                                      new.user_meta)
        try:
            _, checksum = await ingest(write.body, write.integrity, upload.write)
            await upload.complete()
        except BaseException:
            await upload.abort()
            raise
        meta = await self._mounts.committed(info.name, write.key)
        return replace(meta, checksum=checksum)  # for the answer; the source keeps its own

    async def rewrite_meta(self, info: BucketInfo, source: ObjectMeta, new: NewObject) -> ObjectMeta:
        """CopyObject onto itself with REPLACE: the source has no metadata
        update, so the object is written again with the new metadata."""
        body = self.stream(source, ByteRange(0, source.size))
        return await self.put(info, Write(source.key, body, new, Integrity(expected_size=source.size)))

    async def tags(self, bucket: str, key: str, version: str | None = None) -> dict[str, str]:
        raise tags_refused(bucket)

    async def retag(self, info: BucketInfo, key: str, tags: dict[str, str], version: str | None = None) -> ObjectMeta:
        raise tags_refused(info.name)

    async def delete(self, info: BucketInfo, key: str, conditions: WriteConditions | None = None,
                     version: str | None = None) -> Deletion:
        if conditions:
            raise NotSupported("Conditional deletes in a mounted bucket are not supported")
        if version not in (None, NULL):
            return Deletion(version)  # no such version: S3 answers 204
        await self._mounts.delete(info.name, key)
        return Deletion(version)

    async def delete_many(self, info: BucketInfo, targets: list[tuple[str, str | None]]) -> list[Deletion]:
        return [await self.delete(info, key, None, version) for key, version in targets]

    async def set_versioning(self, info: BucketInfo, status: str) -> BucketInfo:
        raise NotSupported(
            f"Bucket {info.name} is a mount of {self._mounts.get(info.name).source}: its objects are the "  # type: ignore[union-attr]
            "source's own, one per key, so the gateway cannot keep versions of them; enable versioning on "
            "the source bucket instead"
        )


def _only_null(key: str, version: str | None) -> None:
    """A mounted object is its one null version."""
    if version not in (None, NULL):
        raise NoSuchVersion("The specified version does not exist.", Key=key, VersionId=version)

