"""The index's records of the capacity tier: the flush queue, pending footer
records, segments; and the commits the flusher, the compactor and recovery
make. Mixed into ``Index``, which owns the database, its lock and the
namespace records these commits touch."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import msgpack

from tiering.index.keys import (
    FOLLOW_CLOSED,
    FOLLOW_KEY,
    SEG_KEY,
    SEQ_KEY,
    WEIGHTED_KEY,
    bkey,
    bucket_from_event,
    follow_key,
    gkey,
    hkey,
    okey,
    pkey,
    record_bucket,
    seqkey,
    term_of,
    vkey,
)
from tiering.meta import BucketInfo, Chunk, Extent, ObjectMeta, Part, SegmentInfo, Upload

if TYPE_CHECKING:
    from rocksdict import Rdict

    from packer.format import Footer
    from tiering.index.record_cache import Batch


QUEUE_BATCH = 50_000  # flush-queue entries read per round (flusher, followers)


class Ledger:
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
                self.live[ext.segment] -= ext.weight

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




class TierRecords:
    """Capacity-tier methods of ``Index`` (see there for locking and
    durability); ``Index`` provides the attributes declared here."""

    _db: Rdict
    _lock: object
    _seq: int
    _segments: int

    if TYPE_CHECKING:
        def _batch(self) -> Batch: ...
        def _write(self, batch: Batch, sync: bool = True) -> None: ...
        def _apply(self, batch: Batch, ledger: Ledger) -> None: ...
        def _scan(self, start: bytes, prefix: bytes) -> Iterable[tuple[bytes, bytes]]: ...
        def get_upload(self, bucket: str, key: str, upload_id: str) -> Upload | None: ...
        def get_object(self, bucket: str, key: str) -> ObjectMeta | None: ...
        def find_vseq(self, bucket: str, key: str, vseq: int) -> tuple[bytes, ObjectMeta] | None: ...

    # -- capacity tier: flush, compaction, recovery --------------------------
    # The flusher and the compactor never run at the same time (the tier
    # service serialises them); user writes race with both, so every commit
    # below re-reads each record and applies only to the version it read.

    def live_weighted(self) -> bool:
        """Whether the segments' live counts already count an empty entry as
        one (``Extent.weight``); an index written before that may count
        segments whose only live entries are empty as unused."""
        return self._db.get(WEIGHTED_KEY) is not None

    def recount_live(self) -> int:
        """Set every segment's live count from the objects and parts that
        use it, by ``Extent.weight``, and mark the index as counted so; the
        number of segments whose count changed. One scan of every object
        and part record: run once, when an older index is opened."""
        with self._lock:
            live: defaultdict[str, int] = defaultdict(int)
            for prefix, decode in ((b"O", ObjectMeta.from_bytes), (b"V", ObjectMeta.from_bytes),
                                   (b"P", Part.from_bytes)):
                for _, raw in self._scan(prefix, prefix):
                    for chunk in decode(raw).chunks:
                        if chunk.extent is not None:
                            live[chunk.extent.segment] += chunk.extent.weight
            batch = self._batch()
            changed = 0
            for _, raw in self._scan(b"G", b"G"):
                info = SegmentInfo.from_bytes(raw)
                if info.live != live[info.name]:
                    batch.put(gkey(info.name), replace(info, live=live[info.name]).to_bytes())
                    changed += 1
            batch.put(WEIGHTED_KEY, b"")
            self._write(batch)
            return changed

    def new_segment_name(self) -> str:
        """A name no segment has had, durable before the segment exists."""
        with self._lock:
            self._segments += 1
            batch = self._batch()
            batch.put(SEG_KEY, self._segments.to_bytes(8, "big"))
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
                raw = self._db.get(pkey(label["u"], label["p"])) if upload else None
                if raw is not None:
                    item.upload, item.part = upload, Part.from_bytes(raw)
            else:
                # The version may have stopped being current since it was
                # queued: it is found by its vseq, wherever it is now.
                found = self.find_vseq(label["b"], label["k"], label.get("v", 0))
                if found is not None and found[1].seq == item.fseq:
                    item.meta = found[1]
            items.append(item)
        return items

    def flush_queue_length(self) -> int:
        return sum(1 for _ in self._scan(b"F", b"F"))

    def pending_records_count(self) -> int:
        return sum(1 for _ in self._scan(b"Q", b"Q"))

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
            ledger = Ledger()
            for fseq in stale:
                batch.delete(seqkey(b"F", fseq))
            for item, chunks in done:
                if item.meta is not None:
                    found = self.find_vseq(item.meta.bucket, item.meta.key, item.meta.vseq)
                    object_key, current = found if found is not None else (b"", None)
                    if current is None or current.seq != item.meta.seq:
                        batch.delete(seqkey(b"F", item.fseq))  # replaced: the new version is queued
                        continue
                    ledger.unpin(current)
                    batch.put(object_key, replace(current, chunks=chunks, manifest=info.name).to_bytes())
                    pins += 1
                else:
                    assert item.upload is not None and item.part is not None
                    part_key = pkey(item.upload.upload_id, item.part.part_number)
                    raw = self._db.get(part_key)
                    current_part = Part.from_bytes(raw) if raw is not None else None
                    if current_part is None or current_part.chunks != item.part.chunks:
                        batch.delete(seqkey(b"F", item.fseq))
                        continue
                    batch.put(part_key, replace(current_part, chunks=chunks).to_bytes())
                batch.delete(seqkey(b"F", item.fseq))
                before = item.meta.chunks if item.meta is not None else item.part.chunks  # type: ignore[union-attr]
                for old, new in zip(before, chunks, strict=True):
                    if old.file_id is not None and new.extent is not None:
                        live += new.extent.weight
                        adopted.append((old.file_id, new.extent.cache_name))
            for qseq in records:
                batch.delete(seqkey(b"Q", qseq))
            batch.put(gkey(info.name), replace(info, live=live, pins=pins).to_bytes())
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
                batch.delete(seqkey(b"F", fseq))
            self._write(batch)

    def segments(self) -> list[SegmentInfo]:
        return [SegmentInfo.from_bytes(v) for _, v in self._scan(b"G", b"G")]

    def get_segment(self, name: str) -> SegmentInfo | None:
        raw = self._db.get(gkey(name))
        return SegmentInfo.from_bytes(raw) if raw is not None else None

    def forget_segment(self, name: str) -> bool:
        """Drop a segment nothing uses any more; False if something does."""
        with self._lock:
            raw = self._db.get(gkey(name))
            if raw is None:
                return True
            info = SegmentInfo.from_bytes(raw)
            if info.live > 0 or info.pins > 0:
                return False
            batch = self._batch()
            batch.delete(gkey(name))
            self._write(batch)
            return True

    def commit_compaction(
        self,
        olds: list[str],
        info: SegmentInfo | None,
        moved: dict[tuple[str, int, int], Extent],
        versions: dict[tuple[str, str, int], int],
        carried: int,
    ) -> list[tuple[str, str]] | None:
        """Replace segments ``olds`` by ``info`` (None: nothing was worth
        keeping). ``moved`` maps old extent places to new extents;
        ``versions`` gives, for every object version (bucket, key, vseq)
        whose manifest the new segment carries, the record (seq) it describes. If an object with bytes in the
        old segments changed meanwhile, the new segment may describe a stale
        layout: nothing is committed (None) and the caller discards it.
        Returns cache renames (old name, new name)."""
        gone = set(olds)
        with self._lock:
            batch = self._batch()
            ledger = Ledger()
            live, pins = 0, carried
            renames: list[tuple[str, str]] = []
            updates: list[tuple[bytes, ObjectMeta]] = []
            for (bucket, key, vseq), seq in versions.items():
                found = self.find_vseq(bucket, key, vseq)
                if found is None:
                    continue  # deleted since: nothing of it lives on
                record_key, meta = found
                has_bytes = any(c.extent and c.extent.segment in gone for c in meta.chunks)
                if meta.seq != seq:
                    if has_bytes:
                        return None
                    continue  # replaced since: its new version has its own manifest
                if has_bytes or meta.manifest in gone:
                    updates.append((record_key, meta))
            for object_key, meta in updates:
                chunks = []
                for chunk in meta.chunks:
                    ext = chunk.extent
                    if ext is not None and ext.segment in gone:
                        new = moved[ext.place]
                        renames.append((ext.cache_name, new.cache_name))
                        live += new.weight
                        chunk = replace(chunk, extent=new)
                    chunks.append(chunk)
                ledger.unpin(meta)
                batch.put(object_key, replace(meta, chunks=tuple(chunks), manifest=info.name if info else None).to_bytes())
                pins += 1
            for old in olds:
                batch.delete(gkey(old))
                ledger.pins.pop(old, None)
                ledger.live.pop(old, None)
            if info is not None:
                batch.put(gkey(info.name), replace(info, live=live, pins=pins).to_bytes())
            self._apply(batch, ledger)
            self._write(batch)
            return renames

    def owners_of_upload_entries(self, upload_id: str, segment: str) -> bool:
        """True if an open upload still uses bytes in ``segment``."""
        for _, value in self._scan(pkey(upload_id), pkey(upload_id)):
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
        noncurrent: Iterable[ObjectMeta] = (),
    ) -> None:
        """Load a namespace rebuilt from the capacity tier into an empty
        index: current versions, ``noncurrent`` versions and delete markers.
        Batches are not synced one by one; one synced write ends it."""
        with self._lock:
            batch = self._batch()
            pending = 0
            for record_key, record in itertools.chain(
                ((bkey(b.name), b) for b in buckets),
                ((okey(m.bucket, m.key), m) for m in objects),
                ((vkey(m.bucket, m.key, m.vseq), m) for m in noncurrent),
                ((gkey(g.name), g) for g in segments),
            ):
                batch.put(record_key, record.to_bytes())
                pending += 1
                if pending == 10_000:
                    self._write(batch, sync=False)
                    batch, pending = self._batch(), 0
            self._seq = max(self._seq, seq)
            self._segments = max(self._segments, segment_count)
            batch.put(SEQ_KEY, self._seq.to_bytes(8, "big"))
            batch.put(SEG_KEY, self._segments.to_bytes(8, "big"))
            self._write(batch)  # synced: the WAL holds every batch before it

    # -- following another node's segments (a replica) -----------------------

    def follow_point(self, term: int) -> str:
        """The last segment of ``term`` this index applied ("" for none)."""
        raw = self._db.get(follow_key(term))
        return raw.decode() if raw else ""

    def follow_points(self) -> dict[int, str]:
        """Per write term, the last segment of it this index applied
        (``FOLLOW_CLOSED`` once the term is closed)."""
        return {
            int.from_bytes(k[len(FOLLOW_KEY):], "big"): v.decode()
            for k, v in self._scan(FOLLOW_KEY, FOLLOW_KEY)
        }

    def apply_segment(self, size: int, footer: Footer, region: str) -> tuple[list[Chunk], set[str]]:
        """Apply one segment written by another node, in write order: each
        manifest newer than (or as new as, a compaction's copy) the key's
        current version replaces it, each tombstone newer than it deletes
        it, and the segment's last bucket event per bucket decides that
        bucket. A segment the index knows already (this node wrote it)
        only moves the follow point. Returns the chunks no current object
        uses any more (for the caller to drop from the hot tier) and the
        buckets created, changed or deleted (whose settings to resolve again)."""
        name = footer.segment
        with self._lock:
            batch = self._batch()
            if self._db.get(gkey(name)) is not None:  # known already: written here
                batch.put(follow_key(term_of(name)), name.encode())
                self._write(batch)
                return [], set()
            ledger = Ledger()
            gone: list[Chunk] = []
            live = pins = 0
            top = self._seq
            events: dict[str, dict] = {}
            objects: list[ObjectMeta] = []
            for record in footer.records:
                if record.get("t") == "obj":
                    objects.append(replace(ObjectMeta.from_plain(record["m"]), manifest=name))
                elif record.get("t") == "bucket":
                    events[record["n"]] = record  # in write order: the last one counts
                    pins += 1
            for event in events.values():
                top = max(top, event.get("s", 0))
                if not event.get("d"):
                    batch.put(bkey(event["n"]), bucket_from_event(event, region).to_bytes())
            created = {meta.bucket for meta in objects if self._db.get(bkey(meta.bucket)) is None}
            for bucket in created - events.keys():
                first = min(m.last_modified_ms for m in objects if m.bucket == bucket)
                batch.put(bkey(bucket), BucketInfo(bucket, first, region).to_bytes())
            current: dict[tuple[str, str], ObjectMeta | None] = {}
            for meta in objects:
                top = max(top, meta.seq)
                where = (meta.bucket, meta.key)
                old = current[where] if where in current else self.get_object(*where)
                # A follower keeps current versions only (docs/scale-out.md):
                # a version older than the current one is not applied, and a
                # newer delete marker removes the current one.
                if old is not None and (old.vseq, old.seq) > (meta.vseq, meta.seq):
                    continue
                if meta.delete_marker:
                    if old is not None:
                        ledger.release(old.chunks)
                        ledger.unpin(old)
                        gone.extend(old.chunks)
                        batch.delete(okey(*where))
                    current[where] = None
                    pins += 1
                    continue
                if old is not None:
                    ledger.release(old.chunks, keep=meta.chunks)
                    ledger.unpin(old)
                    gone.extend(_unused(old.chunks, meta.chunks))
                current[where] = meta
                batch.put(okey(*where), meta.to_bytes())
                pins += 1
                kept = {c.extent.place for c in (old.chunks if old else ()) if c.extent is not None}
                for chunk in meta.chunks:
                    ext = chunk.extent
                    if ext is not None and ext.place not in kept:
                        if ext.segment == name:
                            live += ext.weight
                        else:
                            ledger.live[ext.segment] += ext.weight
            for tomb in footer.tombstones:
                top = max(top, tomb.seq)
                pins += 1
                where = (tomb.bucket, tomb.key)
                old = current[where] if where in current else self.get_object(*where)
                if old is None or old.seq >= tomb.seq or not tomb.kills(old.vseq, old.is_null):
                    continue
                ledger.release(old.chunks)
                ledger.unpin(old)
                gone.extend(old.chunks)
                current[where] = None
                batch.delete(okey(*where))
            for event in events.values():
                if event.get("d"):
                    batch.delete(bkey(event["n"]))
                    for pin, _ in self._scan(hkey(event["n"]), hkey(event["n"])):
                        batch.delete(pin)
            data = sum(e.stored for e in footer.entries)
            own = ledger.live.pop(name, 0), ledger.pins.pop(name, 0)
            info = SegmentInfo(name, size, data, live + own[0], pins + own[1], footer.created_ms)
            batch.put(gkey(name), info.to_bytes())
            self._apply(batch, ledger)
            self._seq = max(self._seq, top)
            self._segments = max(self._segments, int(name, 16))
            batch.put(SEQ_KEY, self._seq.to_bytes(8, "big"))
            batch.put(SEG_KEY, self._segments.to_bytes(8, "big"))
            batch.put(follow_key(term_of(name)), name.encode())
            self._write(batch)
            return gone, set(events) | created

    def advance_follow_point(self, name: str) -> None:
        """A segment this index knows already (it wrote or recovered it), or
        one its term's seal leaves out: following moves past it unread."""
        with self._lock:
            batch = self._batch()
            batch.put(follow_key(term_of(name)), name.encode())
            self._write(batch)

    def close_term(self, term: int) -> None:
        """Every valid segment of ``term`` is applied: never list it again."""
        with self._lock:
            batch = self._batch()
            batch.put(follow_key(term), FOLLOW_CLOSED.encode())
            self._write(batch)

    def forget_segments(self, names: Iterable[str]) -> None:
        """Drop the records of segments the capacity store no longer has
        (another node's compaction deleted them after moving their data)."""
        with self._lock:
            batch = self._batch()
            for name in names:
                batch.delete(gkey(name))
            self._write(batch)

    def is_empty(self) -> bool:
        return next(self._scan(b"", b""), None) is None


def _unused(old: Iterable[Chunk], new: Iterable[Chunk]) -> list[Chunk]:
    kept = {c.extent.place for c in new if c.extent is not None}
    return [c for c in old if c.extent is None or c.extent.place not in kept]


def by_bucket(
    items: list[FlushItem], records: list[tuple[int, dict]]
) -> dict[str, tuple[list[FlushItem], list[tuple[int, dict]]]]:
    """Queued items (stale ones left out) and records, by bucket, in order."""
    groups: dict[str, tuple[list[FlushItem], list[tuple[int, dict]]]] = {}
    for item in items:
        if item.meta is not None:
            groups.setdefault(item.meta.bucket, ([], []))[0].append(item)
        elif item.part is not None:
            assert item.upload is not None
            groups.setdefault(item.upload.bucket, ([], []))[0].append(item)
    for queued in records:
        groups.setdefault(record_bucket(queued[1]), ([], []))[1].append(queued)
    return groups
