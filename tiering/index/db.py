"""The metadata index: the node's source of truth, in rocksdict.

The key layout (one prefix byte per kind of record; NUL separates names) is
mapped in ``tiering/index/keys.py``, which builds every raw key.

Keys under ``O`` sort by the object key's UTF-8 bytes, which is the order S3
lists in, so a listing page is one seek plus a short scan, and each common
prefix costs one more seek to jump past its members.

All methods are blocking; callers on the event loop use ``tiering.pool``.
Mutations that read before they write hold one lock, so every swap is atomic;
reads take no lock. Every write batch is synced to the WAL before returning:
an acknowledged write survives a crash of the process or the machine.

A full disk refuses writes (503 SlowDown or 507, ``tiering/index/room.py``)
before RocksDB's log sees them; a write the disk fails anyway is answered
the same, after the database is opened again (a failed log writer refuses
every later write until then), while reads go on from a read-only handle.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import msgpack

from tiering.errors import BucketNotEmpty, NoSuchBucket, NoSuchKey, NoSuchUpload, PreconditionFailed
from tiering.index.keys import (
    SEG_KEY,
    SEQ_KEY,
    bkey,
    bucket_event,
    gkey,
    hkey,
    label,
    mkey,
    okey,
    pkey,
    seqkey,
    successor,
    ukey,
)
from tiering.index.local import LocalRecords
from tiering.index.record_cache import Batch, RecordCache
from tiering.index.room import Database, IndexRoom
from tiering.index.tiers import Ledger, TierRecords
from tiering.index.uploads import UploadRecords
from tiering.index.versions import VersionRecords, kept_as_noncurrent, new_version
from tiering.meta import (
    BucketInfo,
    Chunk,
    ObjectMeta,
    Part,
    SegmentInfo,
    Upload,
    now_ms,
)
from tiering.model.conditions import WriteConditions
from tiering.model.versions import SUSPENDED


class ListEntry(NamedTuple):
    """What a listing needs of an object, decoded without building ObjectMeta.

    A NamedTuple, not a frozen dataclass: a listing builds one per key, and a
    frozen dataclass's __init__ (one object.__setattr__ per field) cost about
    4 us per key, several seconds per million keys listed.
    """

    key: str
    size: int
    etag: str
    last_modified_ms: int
    checksum_algorithm: str | None


@dataclass(slots=True)
class ListPage:
    contents: list[ListEntry] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    truncated: bool = False
    last: str | None = None  # last key or common prefix returned (the next marker)


class Index(Database, TierRecords, UploadRecords, LocalRecords, VersionRecords):
    """rocksdict-backed namespace: buckets, objects, uploads and parts.

    The records of multipart uploads and their parts are kept by
    ``UploadRecords`` (``tiering.index.uploads``), those of the capacity
    tier by ``TierRecords`` (``tiering.index.tiers``), noncurrent versions
    and delete markers by ``VersionRecords`` (``tiering.index.versions``);
    opening, writing and closing the database, whatever room its disk has,
    is ``Database``'s (``tiering.index.room``). This class owns the lock
    and the sequence counters they share."""

    def __init__(self, path: Path, cached_records: int = 0, room: IndexRoom | None = None) -> None:
        # Owner only: the index holds mounts' source credentials.
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._open(path, room if room is not None else IndexRoom(path))
        self._lock = threading.Lock()
        # Decoded object and mounted-object records (tiering/index/record_cache.py).
        self.records = RecordCache(cached_records)
        raw = self._db.get(SEQ_KEY)
        self._seq = int.from_bytes(raw, "big") if raw else 0
        raw = self._db.get(SEG_KEY)
        self._segments = int.from_bytes(raw, "big") if raw else 0

    @property
    def last_seq(self) -> int:
        """The last sequence number handed out (a write just committed has
        this one or a lower one)."""
        return self._seq

    def raise_seq(self, floor: int) -> None:
        """Hand out sequence numbers above ``floor`` from now on (a node
        that takes a bucket's write lease: ``tiering/cluster/cluster.py``
        says why its writes must outrank every earlier term's)."""
        with self._lock:
            if self._seq >= floor:
                return
            batch = self._batch()
            self._seq = floor
            batch.put(SEQ_KEY, self._seq.to_bytes(8, "big"))
            self._write(batch)

    # -- helpers -----------------------------------------------------------

    def _write(self, batch: Batch, sync: bool = True) -> None:
        """Commit ``batch`` (synced to the WAL unless ``sync`` is False);
        the records it wrote leave the record cache once it is in."""
        self._store(batch.raw, sync, batch.seq)
        if batch.touched:
            self.records.drop(batch.touched)

    def _batch(self) -> Batch:
        return Batch()

    def _next_seq(self, batch: Batch) -> int:
        self._seq += 1
        batch.put(SEQ_KEY, self._seq.to_bytes(8, "big"))
        batch.seq = self._seq
        return self._seq

    def _apply(self, batch: Batch, ledger: Ledger) -> None:
        for name in ledger.live.keys() | ledger.pins.keys():
            raw = self._db.get(gkey(name))
            if raw is None:
                continue
            info = SegmentInfo.from_bytes(raw)
            info = replace(info, live=info.live + ledger.live[name], pins=info.pins + ledger.pins[name])
            batch.put(gkey(name), info.to_bytes())

    def _pending(self, batch: Batch, record: dict[str, object]) -> None:
        """Queue a footer record (tombstone, bucket event) for the next
        segment. A new record gets the next sequence number; one carried over
        from a retired segment keeps its own, so it cannot outrank a write
        that came after it."""
        seq = self._next_seq(batch)
        record = {"s": seq, **record, "at": now_ms()}
        batch.put(seqkey(b"Q", seq), msgpack.packb(record, use_bin_type=True))

    def _scan(self, start: bytes, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(start)
        while it.valid():
            k = it.key()
            if not k.startswith(prefix):
                return
            yield k, it.value()
            it.next()

    def _any_with_prefix(self, prefix: bytes) -> bool:
        return next(self._scan(prefix, prefix), None) is not None

    # -- buckets -----------------------------------------------------------

    def get_bucket(self, name: str) -> BucketInfo | None:
        raw = self._db.get(bkey(name))
        return BucketInfo.from_bytes(raw) if raw is not None else None

    def create_bucket(self, info: BucketInfo) -> bool:
        """Create the bucket; False if it (or a mount of that name) exists."""
        with self._lock:
            if self._db.get(bkey(info.name)) is not None or self._db.get(mkey(info.name)) is not None:
                return False
            batch = self._batch()
            batch.put(bkey(info.name), info.to_bytes())
            self._pending(batch, bucket_event(info))
            self._write(batch)
            return True

    def update_bucket(self, info: BucketInfo) -> None:
        """Change a bucket's policy; the capacity tier learns it too."""
        with self._lock:
            if self._db.get(bkey(info.name)) is None:
                raise NoSuchBucket(BucketName=info.name)
            batch = self._batch()
            batch.put(bkey(info.name), info.to_bytes())
            self._pending(batch, bucket_event(info))
            self._write(batch)

    def delete_bucket(self, name: str) -> None:
        with self._lock:
            if self._db.get(bkey(name)) is None:
                raise NoSuchBucket(BucketName=name)
            if self.has_objects(name) or self._any_with_prefix(ukey(name)):
                raise BucketNotEmpty(BucketName=name)
            batch = self._batch()
            batch.delete(bkey(name))
            for pin, _ in self._scan(hkey(name), hkey(name)):
                batch.delete(pin)
            self._pending(batch, {"t": "bucket", "n": name, "d": True})
            self._write(batch)

    def list_buckets(self) -> list[BucketInfo]:
        return [BucketInfo.from_bytes(v) for _, v in self._scan(b"B", b"B")]

    # -- objects -----------------------------------------------------------

    def get_object(self, bucket: str, key: str) -> ObjectMeta | None:
        return self._cached_read(okey(bucket, key), ObjectMeta.from_bytes)  # type: ignore[no-any-return]

    def cached_object(self, bucket: str, key: str) -> ObjectMeta | None:
        """The object's record if the record cache holds it (no database
        read: safe on the event loop), else None."""
        return self.records.get(okey(bucket, key))  # type: ignore[no-any-return]

    def cached_objects(self, bucket: str, keys: Sequence[str]) -> list[ObjectMeta] | None:
        """:meth:`cached_object` of every key, or None as soon as one is not
        cached (a batch's lookups on the event loop, in one tight loop)."""
        prefix, get = okey(bucket), self.records.get
        found = []
        for key in keys:
            meta = get(prefix + key.encode())
            if meta is None:
                return None
            found.append(meta)
        return found

    def _cached_read(self, raw_key: bytes, decode: Callable[[bytes], object]) -> object | None:
        """A record through the record cache, kept there once decoded."""
        records = self.records
        found = records.get(raw_key)
        if found is not None:
            return found
        seen = records.commits
        raw = self._db.get(raw_key)
        if raw is None:
            return None
        found = decode(raw)
        records.keep(raw_key, found, seen)
        return found

    def get_object_record(self, bucket: str, key: str) -> bytes | None:
        """The object's record as stored (``ObjectMeta.to_bytes``)."""
        raw: bytes | None = self._db.get(okey(bucket, key))
        return raw

    def put_object(
        self,
        meta: ObjectMeta,
        *,
        conditions: WriteConditions | None = None,
        expect_etag: str | None = None,
        drop_upload: Upload | None = None,
        drop_parts: list[int] = (),  # type: ignore[assignment]
        chosen_parts: list[int] = (),  # type: ignore[assignment]
        keep_chunks: bool = False,
        segment: SegmentInfo | None = None,
    ) -> tuple[ObjectMeta, ObjectMeta | None]:
        """Commit ``meta`` (its seq assigned here) and return it with the
        version it replaced. ``conditions`` (S3's conditional writes) are
        checked under the lock, so a conditional write is atomic against
        concurrent writers; a failure here is a race lost
        (``WriteConditions.check``). ``expect_etag`` is the version the
        caller read and builds on (a metadata-only rewrite): anything else
        there is PreconditionFailed. With
        ``drop_upload`` the same batch removes a completed multipart upload
        and its part records; the object's chunks are taken from the records
        of ``chosen_parts`` as they are now, under the lock (a part flushed
        since the caller read it has extents in place of staged files).
        ``keep_chunks`` (a metadata-only rewrite) takes the bytes from the
        version replaced, as they are now: a flush may have moved them since
        the caller read it. ``segment`` is a segment written for this
        object alone (streamed straight to the capacity tier), recorded in
        the same batch. In a versioned bucket the version replaced stays,
        noncurrent (``tiering/model/versions.py``); the version returned is the
        one whose bytes nothing uses any more, if any."""
        with self._lock:
            status = self._status(meta.bucket)
            raw = self._db.get(okey(meta.bucket, meta.key))
            old = ObjectMeta.from_bytes(raw) if raw is not None else None
            if conditions:
                conditions.check(old, meta.key, at_commit=True)
            if expect_etag is not None and (old is None or old.etag != expect_etag):
                raise PreconditionFailed(Condition="If-Match")
            if keep_chunks:
                if old is None:
                    raise PreconditionFailed(Condition="If-Match")
                meta = replace(meta, chunks=old.chunks)
            if drop_upload is not None and chosen_parts:
                meta = replace(meta, chunks=self._current_chunks(drop_upload.upload_id, chosen_parts))
            return self._commit(meta, old, drop_upload, drop_parts, segment, status)

    def retag(self, bucket: str, key: str, tags: dict[str, str]) -> ObjectMeta:
        """Give the current version of ``key`` these tags (PutObjectTagging,
        DeleteObjectTagging with none): a new record of the same bytes, ETag
        and time, so the capacity tier gets a manifest with the tags."""
        with self._lock:
            raw = self._db.get(okey(bucket, key))
            if raw is None:
                raise NoSuchKey(Key=key)
            old = ObjectMeta.from_bytes(raw)
            return self._commit(replace(old, tags=tags), old, same_version=True)[0]

    def _commit(
        self, meta: ObjectMeta, old: ObjectMeta | None, drop_upload: Upload | None = None,
        drop_parts: list[int] = (), segment: SegmentInfo | None = None,  # type: ignore[assignment]
        status: str | None = None, same_version: bool = False,
    ) -> tuple[ObjectMeta, ObjectMeta | None]:
        """Write ``meta`` as the new current record of its key over ``old``,
        in one batch (the caller holds the lock): a new version in a bucket
        of versioning ``status``, or (``same_version``) a new record of the
        same version. Returns it and the version whose bytes died, if any."""
        batch = self._batch()
        ledger = Ledger()
        seq = self._next_seq(batch)
        # A new record needs its own manifest in the capacity tier, even
        # when it reuses flushed bytes (a metadata-only copy, a Complete).
        if same_version:
            meta = replace(meta, seq=seq, manifest=None)
        else:
            meta = replace(meta, seq=seq, manifest=None, vseq=seq, version=new_version(status, seq))
        batch.put(okey(meta.bucket, meta.key), meta.to_bytes())
        batch.put(seqkey(b"F", seq), label(meta.bucket, meta.key, vseq=meta.vseq))
        if segment is not None:
            batch.put(gkey(segment.name), segment.to_bytes())
        gone = None
        if old is not None and not same_version and kept_as_noncurrent(status, old):
            self._demote(batch, old)
        elif old is not None:
            ledger.release(old.chunks, keep=meta.chunks)
            ledger.unpin(old)
            gone = old
        if status == SUSPENDED and not same_version:
            gone = self._drop_null(batch, ledger, meta.bucket, meta.key) or gone
        if drop_upload is not None:
            batch.delete(ukey(drop_upload.bucket, drop_upload.key, drop_upload.upload_id))
            for number in drop_parts:
                raw_part = self._db.get(pkey(drop_upload.upload_id, number))
                if raw_part is not None:
                    ledger.release(Part.from_bytes(raw_part).chunks, keep=meta.chunks)
                batch.delete(pkey(drop_upload.upload_id, number))
        self._apply(batch, ledger)
        self._write(batch)
        return meta, gone

    def _current_chunks(self, upload_id: str, numbers: list[int]) -> tuple[Chunk, ...]:
        chunks: list[Chunk] = []
        for number in numbers:
            raw = self._db.get(pkey(upload_id, number))
            if raw is None:  # the caller read it under this upload: only Complete or Abort remove it
                raise NoSuchUpload(UploadId=upload_id)
            chunks.extend(Part.from_bytes(raw).chunks)
        return tuple(chunks)

    def _bury(self, batch: Batch, ledger: Ledger, old: ObjectMeta) -> None:
        """A deleted version: its extents die, and a tombstone goes to the
        capacity tier so a rebuild from footers cannot bring it back."""
        ledger.release(old.chunks)
        ledger.unpin(old)
        self._pending(batch, {"t": "del", "b": old.bucket, "k": old.key})

    def has_objects(self, bucket: str) -> bool:
        """Whether the bucket holds any version (a delete marker counts, as in S3)."""
        return self._any_with_prefix(okey(bucket)) or self.has_versions(bucket)

    def iter_objects(self, bucket: str | None = None, prefix: str = "") -> Iterator[ObjectMeta]:
        """Every object (of ``bucket``, under ``prefix``), in key order."""
        start = okey(bucket, prefix) if bucket is not None else b"O"
        for _, value in self._scan(start, start):
            yield ObjectMeta.from_bytes(value)

    def objects_page(self, bucket: str, prefix: str, after: str | None, limit: int) -> list[ObjectMeta]:
        """Up to ``limit`` objects of ``bucket`` under ``prefix``, in key
        order, starting after key ``after`` (for jobs walking a prefix)."""
        start = okey(bucket, prefix) if after is None else okey(bucket, after) + b"\x00"
        return [
            ObjectMeta.from_bytes(value)
            for _, value in itertools.islice(self._scan(start, okey(bucket, prefix)), limit)
        ]

    def list_objects(
        self,
        bucket: str,
        prefix: str = "",
        delimiter: str = "",
        marker: str = "",
        max_keys: int = 1000,
    ) -> ListPage:
        """One page of keys after ``marker`` under ``prefix``, rolling keys
        that contain ``delimiter`` after the prefix into common prefixes.

        ``marker`` is exclusive and may be a key or a common prefix returned
        by an earlier page (V1 NextMarker, V2 continuation token)."""
        # The loop runs once per key listed (a million times for a full walk
        # of a large bucket), so the iterator's methods and the page's lists
        # are bound to locals once.
        page = ListPage()
        base = okey(bucket)
        blen = len(base)
        scope = base + prefix.encode()
        start = max(prefix, marker)
        it = self._db.iter()
        it.seek(base + start.encode())
        valid, key_of, value_of, advance = it.valid, it.key, it.value, it.next
        add_entry, add_prefix, entry = page.contents.append, page.prefixes.append, _entry
        plen = len(prefix)
        count = 0
        last = None
        while valid():
            raw_key = key_of()
            if not raw_key.startswith(scope):
                break
            key = raw_key[blen:].decode()
            if key <= marker:
                advance()
                continue
            if delimiter:
                cut = key.find(delimiter, plen)
                if cut >= 0:
                    common = key[: cut + len(delimiter)]
                    if common > marker:
                        if count == max_keys:
                            page.truncated = True
                            break
                        add_prefix(common)
                        last = common
                        count += 1
                    it.seek(base + successor(common).encode())
                    continue
            if count == max_keys:
                page.truncated = True
                break
            add_entry(entry(key, value_of()))
            last = key
            count += 1
            advance()
        page.last = last
        return page

    def referenced_files(self) -> set[str]:
        """Every hot-tier file id an object version or a part refers to.

        Reads raw msgpack maps instead of building records: this runs over
        the whole index when a start-up follows a crash."""
        ids: set[str] = set()
        for tag in (b"O", b"V", b"P"):
            for _, value in self._scan(tag, tag):
                ids.update(c["file_id"] for c in msgpack.unpackb(value, raw=False)["chunks"] if c.get("file_id"))
        return ids


def _entry(key: str, raw: bytes, _unpack=msgpack.unpackb, _new=ListEntry) -> ListEntry:
    # Once per key listed, so decoded lazily: raw=True leaves every string
    # as bytes (only the two a listing shows are decoded), use_list=False
    # builds tuples for the arrays (chunks, part sizes) a listing ignores.
    plain = _unpack(raw, raw=True, use_list=False)
    checksum = plain.get(b"checksum")
    return _new(
        key,
        plain[b"size"],
        plain[b"etag"].decode(),
        plain[b"last_modified_ms"],
        checksum[b"algorithm"].decode() if checksum else None,
    )


