"""Managed buckets: objects this gateway lays out itself.

Reads take each piece from where it is: a staged file, the cache, or the
capacity tier (through the peer that owns the extent, when there are peers);
writes stage through ``tiering.managed.staging`` and are flushed into segments later.
This is one of the two bucket backends (the other: ``tiering.mounts.backend``);
``tiering.objects.ObjectService`` picks one per bucket.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from packer.ranges import ByteRange, split_over
from tiering import pool
from tiering.cluster.handover import Handover
from tiering.cluster.peers import FETCH, HOT, PeerClient, PeerRefused
from tiering.errors import NoSuchBucket, NoSuchKey, NotHot
from tiering.hot.open_files import Opened
from tiering.hot.tier import HotTier
from tiering.index.bucket_settings import Policies
from tiering.index.db import Index, ListPage
from tiering.maintenance.segments import Piece
from tiering.maintenance.tiers import Tiers
from tiering.managed.multipart import Multipart
from tiering.managed.staging import Stager
from tiering.meta import BucketInfo, Chunk, Extent, ObjectMeta, now_ms
from tiering.model import versions
from tiering.model.conditions import WriteConditions
from tiering.model.inputs import NewObject, Write
from tiering.model.versions import Deletion, VersionPage
from tiering.reads.plan import (
    SMALL_READ,
    Block,
    Decision,
    Location,
    Read,
    ReadPlan,
    ReadTally,
    decide,
    hot_plan,
    plan,
    plan_from_memory,
)
from tiering.reads.readahead import Source, stream
from tiering.settings import TierSettings

log = logging.getLogger("tierstore.objects")


class ManagedBuckets:
    """Reads and writes of the objects of managed buckets."""

    def __init__(
        self,
        index: Index,
        hot: HotTier,
        tiers: Tiers,
        stager: Stager,
        policies: Policies,
        settings: TierSettings,
        uploads: Multipart,
        peers: PeerClient | None = None,
    ) -> None:
        self.uploads = uploads
        self._index = index
        self._hot = hot
        self._tiers = tiers
        self._stager = stager
        self._policies = policies
        self._settings = settings
        # The other gateways over the same store, asked for an extent before
        # the store (``tiering/cluster/peers.py``); and, for an extent of
        # this node's share after it joined, the node that kept it before.
        self._peers = peers
        self._handover = Handover(peers) if peers is not None else None

    # -- reads -------------------------------------------------------------

    async def head(self, bucket: str, key: str, version: str | None = None) -> ObjectMeta:
        if version is not None:
            return await pool.run(self._version, bucket, key, version)
        meta = await pool.run(self._index.get_object, bucket, key)
        if meta is None:
            raise self._missing(bucket, key)
        return meta

    def _missing(self, bucket: str, key: str) -> NoSuchKey | NoSuchBucket:
        if self._index.get_bucket(bucket) is None:  # a point read: microseconds
            return NoSuchBucket(BucketName=bucket)
        return versions.missing(self._index, bucket, key)

    def _version(self, bucket: str, key: str, version: str) -> ObjectMeta:
        """Blocking: the version ``version`` of the key, to read."""
        meta = self._index.get_version(bucket, key, version)
        if meta is None and self._index.get_bucket(bucket) is None:
            raise NoSuchBucket(BucketName=bucket)
        return versions.readable(meta, key, version)

    def plan_now(self, read: Read) -> ReadPlan | None:
        """The plan of ``read`` from memory alone, on the event loop: its
        record from the record cache and, for a body, a small object's bytes
        from the page cache (``HotTier.read_now``). None when either is not
        there: :meth:`plan` answers it through the pool."""
        meta = self._index.cached_object(read.bucket, read.key)
        return plan_from_memory(meta, read, self._read_now) if meta is not None else None

    def _read_now(self, meta: ObjectMeta) -> bytes | bytearray | None:
        """The whole object from the page cache (``HotTier.read_now``), or None."""
        data = self._hot.read_now([
            (c.file_id, c.extent.cache_name if c.file_id is None else None, c.size)  # type: ignore[union-attr]
            for c in meta.chunks
        ])
        if data is not None:
            self._tiers.reader.hits += 1
        return data

    async def plan(self, read: Read) -> ReadPlan:
        """Decide ``read`` and, for a small object all in the hot tier, read
        its body, in one pool call: a hot GET costs one hand-off. Larger or
        colder bodies stream from :meth:`stream`; a read with nothing for
        the pool to read is decided on the event loop (:meth:`_decided_now`)."""
        now = self._decided_now(read)
        meta, decision, data = now if now is not None else await pool.run(self._plan_sync, read)
        tally = ReadTally()
        if not (read.body and decision.sends_body):
            return plan(meta, read, decision, tally=tally)
        wanted = decision.wanted
        if data is not None:
            return hot_plan(meta, read, decision, data)
        if read.peer == HOT and not self.is_hot(meta, wanted):
            raise NotHot("Not in this gateway's hot tier yet; ask again later or read the capacity store")
        if wanted.length <= SMALL_READ:  # answered in one piece, and any failure as an S3 error
            chunks = self.stream(meta, wanted, tally, ask_peers=read.peer is None)
            return plan(meta, read, decision, b"".join([block async for block in chunks]), tally)
        body = self.stream(meta, wanted, tally, ask_peers=read.peer is None, blocks=read.blocks)
        return plan(meta, read, decision, body, tally)

    def _decided_now(self, read: Read) -> tuple[ObjectMeta, Decision, None] | None:
        """``read`` decided on the event loop when there is nothing for the
        pool to read: its body is not a small object all in the hot tier (a
        miss of a small object, any large one, or no body asked). None
        otherwise (and for a missing key or a version): :meth:`_plan_sync`.
        The record is a point read, on the loop as a mounted object's is
        (about 5 us decoded); the pool call of a cold small GET only found
        out that its bytes were not cached, at about 100 us of the process's
        CPU and six context switches (``benchmarks/app_cpu.py --cold --managed``)."""
        if read.version is not None:
            return None
        meta = self._index.get_object(read.bucket, read.key)
        if meta is None:
            return None
        decision = decide(meta, read)
        if read.body and decision.sends_body and meta.size <= SMALL_READ and self.is_hot(meta, ByteRange(0, meta.size)):
            return None  # read whole in the pool
        return meta, decision, None

    def _plan_sync(self, read: Read) -> tuple[ObjectMeta, Decision, bytes | None]:
        while True:
            if read.version is not None:
                meta = self._version(read.bucket, read.key, read.version)
            else:
                meta = self._index.get_object(read.bucket, read.key)
            if meta is None:
                raise self._missing(read.bucket, read.key)
            decision = decide(meta, read)
            if not (read.body and decision.sends_body) or meta.size > SMALL_READ:
                return meta, decision, None
            try:
                return meta, decision, self._read_hot(meta)
            except FileNotFoundError:
                # Flushed, replaced or deleted between the lookup and the
                # read: answer from whatever version is current now.
                continue

    def _read_hot(self, meta: ObjectMeta) -> bytes | None:
        """The whole body when every piece is staged or cached, else None."""
        pieces = []
        for c in meta.chunks:
            if c.file_id is not None:
                pieces.append(self._hot.read(c.file_id, 0, c.size))
                continue
            data = self._hot.read_cached(c.extent.cache_name, c.size)  # type: ignore[union-attr]
            if data is None:
                return None  # a miss: stream() fetches from the capacity tier
            pieces.append(data)
        self._tiers.reader.hits += 1
        return b"".join(pieces)

    def is_hot(self, meta: ObjectMeta, wanted: ByteRange) -> bool:
        """True if every byte of ``wanted`` is staged or cached on this node."""
        for index, _ in split_over([c.size for c in meta.chunks], wanted):
            chunk = meta.chunks[index]
            if chunk.file_id is None and not (chunk.extent and self._hot.is_cached(chunk.extent.cache_name)):
                return False
        return True

    def locate(self, bucket: str, key: str, read: bool) -> Location:
        """Blocking: where a read worker finds the bytes of bucket/key
        (``ObjectService.locate_many``). With ``read`` (a GET) a hot answer
        counts as a cache hit."""
        raw = self._index.get_object_record(bucket, key)
        if raw is None:
            missing = "NoSuchKey" if self._index.get_bucket(bucket) is not None else "NoSuchBucket"
            return Location(missing=missing)
        meta = ObjectMeta.from_bytes(raw)
        files = []
        for c in meta.chunks:
            if c.file_id is not None:
                files.append((str(self._hot.path_of(c.file_id)), 0, c.size))
            elif c.extent is not None and self._hot.touch_cached(c.extent.cache_name):
                files.append((*self._hot.where(None, c.extent.cache_name), c.size))
            else:
                return Location()  # not all hot: the writer serves it
        if read:
            self._tiers.reader.hits += 1
        return Location(record=raw, files=tuple(files))

    async def stream(
        self, meta: ObjectMeta, wanted: ByteRange, tally: ReadTally | None = None, ask_peers: bool = True,
        blocks: bool = False,
    ) -> AsyncIterator[Block]:
        """Yield the bytes of ``wanted`` in order, in blocks of about 1 MiB.

        Staged chunks and cached extents are read with pread (or, with
        ``blocks``, yielded as a ``Region`` of their file for the server to
        send); missing extents are fetched, up to ``fetch_concurrency`` of
        them ahead of the one being sent: from the node that owns their
        segment when this one has peers (and ``ask_peers``: not for a
        peer's own request), else, or if that node does not send them,
        from the capacity tier, where a large extent stored as it is is
        sent on as it arrives (``ExtentReader.open_live``). An extent this
        node owns since it joined is first asked of its previous owner's
        memory (``Handover``), for a peer's request too: that ask passes
        nothing on. ``tally`` counts the bytes yielded by the tier they came from."""
        tally = tally if tally is not None else ReadTally()
        pin = self._policies.pinned(meta.bucket, meta.key)
        origin = meta if self._peers is not None else None
        # Where each chunk starts in the object: what a peer is asked for.
        starts = list(itertools.accumulate((c.size for c in meta.chunks), initial=0)) if origin else None

        async def open_piece(index: int) -> Source:
            chunk = meta.chunks[index]
            start = starts[index] if starts else 0
            if chunk.file_id is None:
                return await self._source(chunk, pin, origin, start, ask_peers)
            try:
                return Opened(await pool.run(self._hot.open, chunk.file_id), 0)
            except FileNotFoundError:
                # Flushed since the lookup (the file became a cached extent):
                # read the same version's extent instead.
                return await self._source(await self._reload_chunk(meta, index), pin, origin, start, ask_peers)

        pieces = list(split_over([c.size for c in meta.chunks], wanted))
        async for block in stream(
            pieces, open_piece, window=self._settings.fetch_concurrency, tally=tally,
            prefetch=lambda index: meta.chunks[index].file_id is None,  # files open when their turn comes
            blocks=blocks,
        ):
            yield block

    async def _source(self, chunk: Chunk, pin: bool, origin: ObjectMeta | None, start: int,
                      ask_owner: bool = True) -> Source:
        """A descriptor on the cached extent, or its bytes after a fetch
        (cached, pinned when ``pin``); ``origin`` and ``start`` (the object
        and where the chunk starts in it) let the peer that owns the extent
        send them (with ``ask_owner``), or, for an extent this node took
        over, the peer that kept it."""
        ext = chunk.extent
        assert ext is not None
        reader = self._tiers.reader
        fd = await reader.open_cached(ext)
        if fd is not None:
            return fd
        ask = None
        if origin is not None and self._peers is not None and self._handover is not None:
            node = self._peers.group.extent_owner(ext)
            if node != self._peers.group.me:
                if ask_owner:
                    ask = functools.partial(self._from_peer, node, origin, start, ext)
            elif (before := self._handover.before(ext.cache_name)) is not None:
                ask = functools.partial(self._handed_over, before, origin, start, ext)
        return await reader.open_live(ext, pin, ask)

    async def _from_peer(self, node: str, meta: ObjectMeta, start: int, ext: Extent) -> bytes | None:
        """The extent from the node that owns its segment (it reads the
        store on a miss, once for every node); None to read the store here."""
        assert self._peers is not None
        try:
            return await self._peers.extent(node, meta.bucket, meta.key, meta.etag, start, ext,
                                            self._settings.compression_level, FETCH)
        except PeerRefused as exc:
            log.info("peer %s did not send %s/%s: %s", node, meta.bucket, meta.key, exc)
            return None

    async def _handed_over(self, node: str, meta: ObjectMeta, start: int, ext: Extent) -> bytes | None:
        """An extent of this node's share from the memory of ``node``, which
        kept it before this node joined (``HOT``: it reads no store for
        this), checked, and cached here: this node owns it now. None to
        read the store."""
        assert self._peers is not None and self._handover is not None
        try:
            data = await self._peers.extent(node, meta.bucket, meta.key, meta.etag, start, ext,
                                            self._settings.compression_level, HOT)
        except PeerRefused as exc:
            log.info("previous owner %s did not send %s/%s: %s", node, meta.bucket, meta.key, exc)
            data = None
        if self._handover.outcome(data) is not None:
            await self._tiers.reader.adopt(ext, data)  # type: ignore[arg-type]  # not None here
        return data

    async def _reload_chunk(self, meta: ObjectMeta, index: int) -> Chunk:
        found = await pool.run(self._index.find_vseq, meta.bucket, meta.key, meta.vseq)
        current = found[1] if found is not None else None
        if current is None or current.seq != meta.seq or current.chunks[index].extent is None:
            raise NoSuchKey("The object was replaced while it was being read", Key=meta.key)
        return current.chunks[index]

    async def list(self, bucket: str, prefix: str, delimiter: str, marker: str, max_keys: int) -> ListPage:
        return await pool.run(self._index.list_objects, bucket, prefix, delimiter, marker, max_keys)

    async def list_versions(self, bucket: str, prefix: str, delimiter: str, key_marker: str,
                            version_marker: str, max_keys: int) -> VersionPage:
        return await pool.run(self._index.list_versions, bucket, prefix, delimiter, key_marker,
                              version_marker, max_keys)

    # -- writes ------------------------------------------------------------

    async def set_versioning(self, info: BucketInfo, status: str) -> BucketInfo:
        async with self._tiers.writing_to(info.name):
            return await pool.run(self._index.set_versioning, info.name, status)

    def writable(self, bucket: str) -> None:
        """Every managed bucket takes writes (on its writer node: see
        ``Tiers.writing_to``)."""

    async def put(self, info: BucketInfo, write: Write) -> ObjectMeta:
        bucket, key = info.name, write.key
        async with self._tiers.writing_to(bucket):
            if write.conditions:
                # Checked again atomically at commit; failing early saves the upload.
                write.conditions.check(await pool.run(self._index.get_object, bucket, key), key)
            staged = await self._stager.stage(write.body, write.integrity, Piece(bucket, key, 0))
            meta = staged.as_object(bucket, key, write.new)
            meta = await self._stager.commit(meta, staged.segment, conditions=write.conditions)
            await self._stager.settle(info, meta)
            return meta

    async def rewrite_meta(self, info: BucketInfo, source: ObjectMeta, new: NewObject) -> ObjectMeta:
        """CopyObject onto itself with REPLACE: same bytes, new metadata."""
        async with self._tiers.writing_to(source.bucket):
            meta = replace(
                source,
                content_type=new.content_type,
                headers=new.headers,
                user_meta=new.user_meta,
                tags=new.tags,
                last_modified_ms=now_ms(),
            )
            meta, _ = await pool.run(self._index.put_object, meta, expect_etag=source.etag, keep_chunks=True)
            await self._stager.settle(info, meta)
            return meta

    async def tags(self, bucket: str, key: str, version: str | None = None) -> dict[str, str]:
        return (await self.head(bucket, key, version)).tags

    async def retag(self, info: BucketInfo, key: str, tags: dict[str, str], version: str | None = None) -> ObjectMeta:
        async with self._tiers.writing_to(info.name):
            if version is None:
                meta = await pool.run(self._index.retag, info.name, key, tags)
            else:
                found = await pool.run(self._index.retag_version, info.name, key, version, tags)
                meta = found if found is not None else await self.head(info.name, key, version)
            await self._stager.settle(info, meta)
            return meta

    async def delete(self, info: BucketInfo, key: str, conditions: WriteConditions | None = None,
                     version: str | None = None) -> Deletion:
        async with self._tiers.writing_to(info.name):
            deletion = await pool.run(self._index.delete_object, info.name, key, conditions, version)
            await self._deleted(info, [deletion])
            return deletion

    async def delete_many(self, info: BucketInfo, targets: list[tuple[str, str | None]]) -> list[Deletion]:
        """DeleteObjects: (key, version or None) each; in a bucket never
        versioned, one index commit for all keys; then the files."""
        async with self._tiers.writing_to(info.name):
            deletions = await pool.run(self._index.delete_objects, info.name, targets)
            await self._deleted(info, deletions)
            return deletions

    async def _deleted(self, info: BucketInfo, deletions: list[Deletion]) -> None:
        """After deletes committed: the files of what they removed go."""
        for deletion in deletions:
            for old in deletion.gone:
                await self._stager.forget(old.chunks)
        if any(d.gone or d.marker for d in deletions):
            await self._stager.settle_delete(info)
