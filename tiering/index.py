"""The metadata index: the node's source of truth, in rocksdict.

Key layout (raw bytes; bucket names never contain NUL, so NUL separates):

    B<bucket>                          -> BucketInfo
    O<bucket>\\0<key>                   -> ObjectMeta
    U<bucket>\\0<key>\\0<upload id>      -> Upload
    P<upload id>\\0<part number, 4 BE>  -> Part
    F<seq, 8 BE>                       -> flush queue: an object version or
                                          part whose bytes or manifest are
                                          not yet in the capacity tier
    Q<seq, 8 BE>                       -> a footer record waiting for the next
                                          segment (tombstone, bucket event)
    G<segment>                         -> SegmentInfo
    Sseq, Sseg                         -> last sequence number, last segment

Keys under ``O`` sort by the object key's UTF-8 bytes, which is the order S3
lists in, so a listing page is one seek plus a short scan, and each common
prefix costs one more seek to jump past its members.

All methods are blocking; callers on the event loop use ``tiering._pool``.
Mutations that read before they write hold one lock, so every swap is atomic;
reads take no lock. Every write batch is synced to the WAL before returning:
an acknowledged write survives a crash of the process or the machine.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import msgpack
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from tiering.errors import BucketNotEmpty, NoSuchBucket, PreconditionFailed
from tiering.meta import BucketInfo, Chunk, Extent, ObjectMeta, Part, SegmentInfo, Upload, now_ms

_SEP = b"\x00"


def _bkey(bucket: str) -> bytes:
    return b"B" + bucket.encode()


def _okey(bucket: str, key: str = "") -> bytes:
    return b"O" + bucket.encode() + _SEP + key.encode()


def _ukey(bucket: str, key: str = "", upload_id: str | None = None) -> bytes:
    base = b"U" + bucket.encode() + _SEP + key.encode()
    return base if upload_id is None else base + _SEP + upload_id.encode()


def _pkey(upload_id: str, part_number: int | None = None) -> bytes:
    base = b"P" + upload_id.encode() + _SEP
    return base if part_number is None else base + part_number.to_bytes(4, "big")


def _seqkey(tag: bytes, seq: int) -> bytes:
    return tag + seq.to_bytes(8, "big")


def _gkey(segment: str) -> bytes:
    return b"G" + segment.encode()


_SEQ_KEY = b"Sseq"
_SEG_KEY = b"Sseg"


class _Ledger:
    """Changes to segment counters gathered while one batch is built."""

    __slots__ = ("live", "pins")

    def __init__(self) -> None:
        self.live: defaultdict[str, int] = defaultdict(int)
        self.pins: defaultdict[str, int] = defaultdict(int)

    def release(self, gone: Iterable[Chunk], keep: Iterable[Chunk] = ()) -> None:
        """Extents of ``gone`` that ``keep`` does not reuse are dead now."""
        kept = {c.extent.place for c in keep if c.extent is not None}
        for chunk in gone:
            ext = chunk.extent
            if ext is not None and ext.place not in kept:
                self.live[ext.segment] -= ext.stored

    def unpin(self, meta: ObjectMeta | None) -> None:
        if meta is not None and meta.manifest is not None:
            self.pins[meta.manifest] -= 1


@dataclass(slots=True)
class FlushItem:
    """One flush-queue entry and the record it names, as read."""

    fseq: int
    meta: ObjectMeta | None = None  # the object version (None: a part, or stale)
    upload: Upload | None = None
    part: Part | None = None


def successor(prefix: str) -> str:
    """The smallest string greater than every string starting with ``prefix``.

    Used to jump past a whole common prefix with one seek. UTF-8 order equals
    code point order, so incrementing the last code point is enough.
    """
    while prefix:
        last = ord(prefix[-1])
        if last < 0x10FFFF:
            return prefix[:-1] + chr(last + 1 if last + 1 != 0xD800 else 0xE000)
        prefix = prefix[:-1]
    return "\U0010ffff" * 2  # nothing is greater; callers stop there


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


class Index:
    """rocksdict-backed namespace: buckets, objects, uploads and parts."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db = Rdict(str(path), options)
        self._sync = WriteOptions()
        self._sync.sync = True
        self._lock = threading.Lock()
        raw = self._db.get(_SEQ_KEY)
        self._seq = int.from_bytes(raw, "big") if raw else 0
        raw = self._db.get(_SEG_KEY)
        self._segments = int.from_bytes(raw, "big") if raw else 0

    def close(self) -> None:
        self._db.close()

    # -- helpers -----------------------------------------------------------

    def _write(self, batch: WriteBatch) -> None:
        self._db.write(batch, self._sync)

    def _batch(self) -> WriteBatch:
        return WriteBatch(raw_mode=True)

    def _next_seq(self, batch: WriteBatch) -> int:
        self._seq += 1
        batch.put(_SEQ_KEY, self._seq.to_bytes(8, "big"))
        return self._seq

    def _apply(self, batch: WriteBatch, ledger: _Ledger) -> None:
        for name in ledger.live.keys() | ledger.pins.keys():
            raw = self._db.get(_gkey(name))
            if raw is None:
                continue
            info = SegmentInfo.from_bytes(raw)
            info = replace(info, live=info.live + ledger.live[name], pins=info.pins + ledger.pins[name])
            batch.put(_gkey(name), info.to_bytes())

    def _pending(self, batch: WriteBatch, record: dict[str, object]) -> None:
        """Queue a footer record (tombstone, bucket event) for the next
        segment. A new record gets the next sequence number; one carried over
        from a retired segment keeps its own, so it cannot outrank a write
        that came after it."""
        seq = self._next_seq(batch)
        record = {"s": seq, **record, "at": now_ms()}
        batch.put(_seqkey(b"Q", seq), msgpack.packb(record, use_bin_type=True))

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
        raw = self._db.get(_bkey(name))
        return BucketInfo.from_bytes(raw) if raw is not None else None

    def create_bucket(self, info: BucketInfo) -> bool:
        """Create the bucket; False if it already exists."""
        with self._lock:
            if self._db.get(_bkey(info.name)) is not None:
                return False
            batch = self._batch()
            batch.put(_bkey(info.name), info.to_bytes())
            self._pending(batch, _bucket_event(info))
            self._write(batch)
            return True

    def update_bucket(self, info: BucketInfo) -> None:
        """Change a bucket's policy; the capacity tier learns it too."""
        with self._lock:
            if self._db.get(_bkey(info.name)) is None:
                raise NoSuchBucket(BucketName=info.name)
            batch = self._batch()
            batch.put(_bkey(info.name), info.to_bytes())
            self._pending(batch, _bucket_event(info))
            self._write(batch)

    def delete_bucket(self, name: str) -> None:
        with self._lock:
            if self._db.get(_bkey(name)) is None:
                raise NoSuchBucket(BucketName=name)
            if self._any_with_prefix(_okey(name)) or self._any_with_prefix(_ukey(name)):
                raise BucketNotEmpty(BucketName=name)
            batch = self._batch()
            batch.delete(_bkey(name))
            self._pending(batch, {"t": "bucket", "n": name, "d": True})
            self._write(batch)

    def list_buckets(self) -> list[BucketInfo]:
        return [BucketInfo.from_bytes(v) for _, v in self._scan(b"B", b"B")]

    # -- objects -----------------------------------------------------------

    def get_object(self, bucket: str, key: str) -> ObjectMeta | None:
        raw = self._db.get(_okey(bucket, key))
        return ObjectMeta.from_bytes(raw) if raw is not None else None

    def put_object(
        self,
        meta: ObjectMeta,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        drop_upload: Upload | None = None,
        drop_parts: list[int] = (),  # type: ignore[assignment]
        segment: SegmentInfo | None = None,
    ) -> tuple[ObjectMeta, ObjectMeta | None]:
        """Commit ``meta`` (its seq assigned here) and return it with the
        version it replaced. Conditions are checked under the lock, so a
        conditional write is atomic against concurrent writers. With
        ``drop_upload`` the same batch removes a completed multipart upload
        and its part records. ``segment`` is a segment written for this
        object alone (streamed straight to the capacity tier), recorded in
        the same batch."""
        with self._lock:
            if self._db.get(_bkey(meta.bucket)) is None:
                raise NoSuchBucket(BucketName=meta.bucket)
            raw = self._db.get(_okey(meta.bucket, meta.key))
            old = ObjectMeta.from_bytes(raw) if raw is not None else None
            if if_none_match and old is not None:
                raise PreconditionFailed(Condition="If-None-Match")
            if if_match is not None and (old is None or if_match not in ("*", old.etag)):
                raise PreconditionFailed(Condition="If-Match")
            batch = self._batch()
            ledger = _Ledger()
            seq = self._next_seq(batch)
            # A new version needs its own manifest in the capacity tier, even
            # when it reuses flushed bytes (a metadata-only copy, a Complete).
            meta = replace(meta, seq=seq, manifest=None)
            batch.put(_okey(meta.bucket, meta.key), meta.to_bytes())
            batch.put(_seqkey(b"F", seq), _label(meta.bucket, meta.key))
            if segment is not None:
                batch.put(_gkey(segment.name), segment.to_bytes())
            if old is not None:
                ledger.release(old.chunks, keep=meta.chunks)
                ledger.unpin(old)
            if drop_upload is not None:
                batch.delete(_ukey(drop_upload.bucket, drop_upload.key, drop_upload.upload_id))
                for number in drop_parts:
                    raw_part = self._db.get(_pkey(drop_upload.upload_id, number))
                    if raw_part is not None:
                        ledger.release(Part.from_bytes(raw_part).chunks, keep=meta.chunks)
                    batch.delete(_pkey(drop_upload.upload_id, number))
            self._apply(batch, ledger)
            self._write(batch)
            return meta, old

    def delete_object(self, bucket: str, key: str) -> ObjectMeta | None:
        """Remove the key; return what was there (None if nothing)."""
        with self._lock:
            raw = self._db.get(_okey(bucket, key))
            if raw is None:
                return None
            old = ObjectMeta.from_bytes(raw)
            batch = self._batch()
            batch.delete(_okey(bucket, key))
            ledger = _Ledger()
            self._bury(batch, ledger, old)
            self._apply(batch, ledger)
            self._write(batch)
            return old

    def _bury(self, batch: WriteBatch, ledger: _Ledger, old: ObjectMeta) -> None:
        """A deleted version: its extents die, and a tombstone goes to the
        capacity tier so a rebuild from footers cannot bring it back."""
        ledger.release(old.chunks)
        ledger.unpin(old)
        self._pending(batch, {"t": "del", "b": old.bucket, "k": old.key})

    def delete_objects(self, bucket: str, keys: list[str]) -> list[ObjectMeta]:
        """Remove many keys in one synced batch (DeleteObjects); return the
        versions that were there."""
        with self._lock:
            batch = self._batch()
            ledger = _Ledger()
            removed = []
            for key in dict.fromkeys(keys):
                raw = self._db.get(_okey(bucket, key))
                if raw is not None:
                    batch.delete(_okey(bucket, key))
                    removed.append(ObjectMeta.from_bytes(raw))
                    self._bury(batch, ledger, removed[-1])
            if removed:
                self._apply(batch, ledger)
                self._write(batch)
            return removed

    def has_objects(self, bucket: str) -> bool:
        return self._any_with_prefix(_okey(bucket))

    def iter_objects(self, bucket: str | None = None) -> Iterator[ObjectMeta]:
        prefix = _okey(bucket) if bucket is not None else b"O"
        for _, value in self._scan(prefix, prefix):
            yield ObjectMeta.from_bytes(value)

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
        base = _okey(bucket)
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

    # -- multipart uploads -------------------------------------------------

    def create_upload(self, upload: Upload) -> None:
        with self._lock:
            if self._db.get(_bkey(upload.bucket)) is None:
                raise NoSuchBucket(BucketName=upload.bucket)
            batch = self._batch()
            batch.put(_ukey(upload.bucket, upload.key, upload.upload_id), upload.to_bytes())
            self._write(batch)

    def get_upload(self, bucket: str, key: str, upload_id: str) -> Upload | None:
        raw = self._db.get(_ukey(bucket, key, upload_id))
        return Upload.from_bytes(raw) if raw is not None else None

    def put_part(self, upload: Upload, part: Part, segment: SegmentInfo | None = None) -> Part | None | bool:
        """Record a part (and the segment it was streamed into, if any);
        return the part it replaced, or False if the upload is gone
        (completed or aborted meanwhile)."""
        with self._lock:
            if self._db.get(_ukey(upload.bucket, upload.key, upload.upload_id)) is None:
                return False
            raw = self._db.get(_pkey(upload.upload_id, part.part_number))
            previous = Part.from_bytes(raw) if raw is not None else None
            batch = self._batch()
            batch.put(_pkey(upload.upload_id, part.part_number), part.to_bytes())
            if segment is not None:
                batch.put(_gkey(segment.name), segment.to_bytes())
            if any(c.file_id is not None for c in part.chunks):
                label = _label(upload.bucket, upload.key, upload.upload_id, part.part_number)
                batch.put(_seqkey(b"F", self._next_seq(batch)), label)
            if previous is not None:
                ledger = _Ledger()
                ledger.release(previous.chunks)
                self._apply(batch, ledger)
            self._write(batch)
            return previous

    def list_parts(self, upload_id: str, after: int = 0, limit: int = 10_000) -> list[Part]:
        prefix = _pkey(upload_id)
        parts = []
        for _, value in self._scan(_pkey(upload_id, after + 1), prefix):
            if len(parts) == limit:
                break
            parts.append(Part.from_bytes(value))
        return parts

    def delete_upload(self, upload: Upload) -> list[Part] | None:
        """Remove an upload and its parts; return the parts (None if gone)."""
        with self._lock:
            if self._db.get(_ukey(upload.bucket, upload.key, upload.upload_id)) is None:
                return None
            parts = self.list_parts(upload.upload_id)
            batch = self._batch()
            batch.delete(_ukey(upload.bucket, upload.key, upload.upload_id))
            ledger = _Ledger()
            for part in parts:
                batch.delete(_pkey(upload.upload_id, part.part_number))
                ledger.release(part.chunks)
            self._apply(batch, ledger)
            self._write(batch)
            return parts

    def list_uploads(
        self,
        bucket: str,
        prefix: str = "",
        key_marker: str = "",
        upload_id_marker: str = "",
        limit: int = 1000,
    ) -> tuple[list[Upload], bool]:
        """Uploads ordered by key then upload id (ids sort by creation time)."""
        base = _ukey(bucket)
        scope = base + prefix.encode()
        start = base + max(prefix, key_marker).encode()
        uploads: list[Upload] = []
        for _, value in self._scan(start, scope):
            upload = Upload.from_bytes(value)
            if key_marker and (
                upload.key < key_marker
                or (upload.key == key_marker and (not upload_id_marker or upload.upload_id <= upload_id_marker))
            ):
                continue
            if len(uploads) == limit:
                return uploads, True
            uploads.append(upload)
        return uploads, False

    def referenced_files(self) -> set[str]:
        """Every hot-tier file id an object or a part refers to.

        Reads raw msgpack maps instead of building records: this runs over
        the whole index when a start-up follows a crash."""
        ids: set[str] = set()
        for tag in (b"O", b"P"):
            for _, value in self._scan(tag, tag):
                ids.update(c["file_id"] for c in msgpack.unpackb(value, raw=False)["chunks"] if c.get("file_id"))
        return ids

    # -- capacity tier: flush, compaction, recovery --------------------------
    # The flusher and the compactor never run at the same time (the tier
    # service serialises them); user writes race with both, so every commit
    # below re-reads each record and applies only to the version it read.

    def new_segment_name(self) -> str:
        """A name no segment has had, durable before the segment exists."""
        with self._lock:
            self._segments += 1
            batch = self._batch()
            batch.put(_SEG_KEY, self._segments.to_bytes(8, "big"))
            self._write(batch)
            return f"{self._segments:016x}"

    def flush_queue(self, limit: int) -> list[FlushItem]:
        """The oldest flush-queue entries with the records they name (none
        when the record was replaced or removed since: a stale entry)."""
        items: list[FlushItem] = []
        for raw_key, value in self._scan(b"F", b"F"):
            if len(items) == limit:
                break
            item = FlushItem(int.from_bytes(raw_key[1:], "big"))
            label = msgpack.unpackb(value, raw=False)
            if "u" in label:
                upload = self.get_upload(label["b"], label["k"], label["u"])
                raw = self._db.get(_pkey(label["u"], label["p"])) if upload else None
                if raw is not None:
                    item.upload, item.part = upload, Part.from_bytes(raw)
            else:
                meta = self.get_object(label["b"], label["k"])
                if meta is not None and meta.seq == item.fseq:
                    item.meta = meta
            items.append(item)
        return items

    def flush_queue_length(self) -> int:
        return sum(1 for _ in self._scan(b"F", b"F"))

    @property
    def segments_issued(self) -> int:
        return self._segments

    def pending_records(self, limit: int) -> list[tuple[int, dict]]:
        return [
            (int.from_bytes(k[1:], "big"), msgpack.unpackb(v, raw=False))
            for k, v in itertools.islice(self._scan(b"Q", b"Q"), limit)
        ]

    def commit_flush(
        self,
        info: SegmentInfo,
        done: list[tuple[FlushItem, tuple[Chunk, ...]]],
        stale: list[int],
        records: list[int],
    ) -> list[tuple[str, str]]:
        """Record a segment the capacity tier now holds: each item still
        current gets its new chunks (and, for an object, the segment as its
        manifest); queue entries and footer records written are removed.
        Returns (staged file id, cache name) pairs now safe to adopt."""
        with self._lock:
            batch = self._batch()
            adopted: list[tuple[str, str]] = []
            live, pins = 0, len(records)
            ledger = _Ledger()
            for fseq in stale:
                batch.delete(_seqkey(b"F", fseq))
            for item, chunks in done:
                if item.meta is not None:
                    okey = _okey(item.meta.bucket, item.meta.key)
                    raw = self._db.get(okey)
                    current = ObjectMeta.from_bytes(raw) if raw is not None else None
                    if current is None or current.seq != item.meta.seq:
                        batch.delete(_seqkey(b"F", item.fseq))  # replaced: the new version is queued
                        continue
                    ledger.unpin(current)
                    batch.put(okey, replace(current, chunks=chunks, manifest=info.name).to_bytes())
                    pins += 1
                else:
                    assert item.upload is not None and item.part is not None
                    pkey = _pkey(item.upload.upload_id, item.part.part_number)
                    raw = self._db.get(pkey)
                    current_part = Part.from_bytes(raw) if raw is not None else None
                    if current_part is None or current_part.chunks != item.part.chunks:
                        batch.delete(_seqkey(b"F", item.fseq))
                        continue
                    batch.put(pkey, replace(current_part, chunks=chunks).to_bytes())
                batch.delete(_seqkey(b"F", item.fseq))
                before = item.meta.chunks if item.meta is not None else item.part.chunks  # type: ignore[union-attr]
                for old, new in zip(before, chunks, strict=True):
                    if old.file_id is not None and new.extent is not None:
                        live += new.extent.stored
                        adopted.append((old.file_id, new.extent.cache_name))
            for qseq in records:
                batch.delete(_seqkey(b"Q", qseq))
            batch.put(_gkey(info.name), replace(info, live=live, pins=pins).to_bytes())
            self._apply(batch, ledger)
            self._write(batch)
            return adopted

    def commit_flush_stale(self, stale: list[int]) -> None:
        """Drop queue entries whose versions were replaced or removed."""
        if not stale:
            return
        with self._lock:
            batch = self._batch()
            for fseq in stale:
                batch.delete(_seqkey(b"F", fseq))
            self._write(batch)

    def segments(self) -> list[SegmentInfo]:
        return [SegmentInfo.from_bytes(v) for _, v in self._scan(b"G", b"G")]

    def get_segment(self, name: str) -> SegmentInfo | None:
        raw = self._db.get(_gkey(name))
        return SegmentInfo.from_bytes(raw) if raw is not None else None

    def forget_segment(self, name: str) -> bool:
        """Drop a segment nothing uses any more; False if something does."""
        with self._lock:
            raw = self._db.get(_gkey(name))
            if raw is None:
                return True
            info = SegmentInfo.from_bytes(raw)
            if info.live > 0 or info.pins > 0:
                return False
            batch = self._batch()
            batch.delete(_gkey(name))
            self._write(batch)
            return True

    def commit_compaction(
        self,
        olds: list[str],
        info: SegmentInfo | None,
        moved: dict[tuple[str, int, int], Extent],
        versions: dict[tuple[str, str], int],
        carried: int,
    ) -> list[tuple[str, str]] | None:
        """Replace segments ``olds`` by ``info`` (None: nothing was worth
        keeping). ``moved`` maps old extent places to new extents;
        ``versions`` gives, for every object whose manifest the new segment
        carries, the version it describes. If an object with bytes in the
        old segments changed meanwhile, the new segment may describe a stale
        layout: nothing is committed (None) and the caller discards it.
        Returns cache renames (old name, new name)."""
        gone = set(olds)
        with self._lock:
            batch = self._batch()
            ledger = _Ledger()
            live, pins = 0, carried
            renames: list[tuple[str, str]] = []
            updates: list[tuple[bytes, ObjectMeta]] = []
            for (bucket, key), seq in versions.items():
                raw = self._db.get(_okey(bucket, key))
                meta = ObjectMeta.from_bytes(raw) if raw is not None else None
                if meta is None:
                    continue  # deleted since: nothing of it lives on
                has_bytes = any(c.extent and c.extent.segment in gone for c in meta.chunks)
                if meta.seq != seq:
                    if has_bytes:
                        return None
                    continue  # replaced since: its new version has its own manifest
                if has_bytes or meta.manifest in gone:
                    updates.append((_okey(bucket, key), meta))
            for okey, meta in updates:
                chunks = []
                for chunk in meta.chunks:
                    ext = chunk.extent
                    if ext is not None and ext.segment in gone:
                        new = moved[ext.place]
                        renames.append((ext.cache_name, new.cache_name))
                        live += new.stored
                        chunk = replace(chunk, extent=new)
                    chunks.append(chunk)
                ledger.unpin(meta)
                batch.put(okey, replace(meta, chunks=tuple(chunks), manifest=info.name if info else None).to_bytes())
                pins += 1
            for old in olds:
                batch.delete(_gkey(old))
                ledger.pins.pop(old, None)
                ledger.live.pop(old, None)
            if info is not None:
                batch.put(_gkey(info.name), replace(info, live=live, pins=pins).to_bytes())
            self._apply(batch, ledger)
            self._write(batch)
            return renames

    def owners_of_upload_entries(self, upload_id: str, segment: str) -> bool:
        """True if an open upload still uses bytes in ``segment``."""
        for _, value in self._scan(_pkey(upload_id), _pkey(upload_id)):
            if any(c.extent is not None and c.extent.segment == segment for c in Part.from_bytes(value).chunks):
                return True
        return False

    def install(
        self,
        buckets: Iterable[BucketInfo],
        objects: Iterable[ObjectMeta],
        segments: Iterable[SegmentInfo],
        seq: int,
        segment_count: int,
    ) -> None:
        """Load a namespace rebuilt from the capacity tier into an empty
        index. Batches are not synced one by one; one synced write ends it."""
        with self._lock:
            batch = self._batch()
            pending = 0
            for record_key, record in itertools.chain(
                ((_bkey(b.name), b) for b in buckets),
                ((_okey(m.bucket, m.key), m) for m in objects),
                ((_gkey(g.name), g) for g in segments),
            ):
                batch.put(record_key, record.to_bytes())
                pending += 1
                if pending == 10_000:
                    self._db.write(batch)
                    batch, pending = self._batch(), 0
            self._seq = max(self._seq, seq)
            self._segments = max(self._segments, segment_count)
            batch.put(_SEQ_KEY, self._seq.to_bytes(8, "big"))
            batch.put(_SEG_KEY, self._segments.to_bytes(8, "big"))
            self._write(batch)  # synced: the WAL holds every batch before it

    def is_empty(self) -> bool:
        return next(self._scan(b"", b""), None) is None

    def iter_uploads(self) -> Iterator[Upload]:
        for _, value in self._scan(b"U", b"U"):
            yield Upload.from_bytes(value)

    def iter_parts(self) -> Iterator[Part]:
        for _, value in self._scan(b"P", b"P"):
            yield Part.from_bytes(value)


def _label(bucket: str, key: str, upload: str | None = None, part: int | None = None) -> bytes:
    label: dict[str, object] = {"b": bucket, "k": key}
    if upload is not None:
        label.update(u=upload, p=part)
    return msgpack.packb(label, use_bin_type=True)


def _bucket_event(info: BucketInfo) -> dict[str, object]:
    return {"t": "bucket", "n": info.name, "c": info.created_ms, "wt": info.write_through}


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


