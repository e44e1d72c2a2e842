"""The index's records of object versions (S3 bucket versioning; the
model is described in ``tiering/model/versions.py``). Mixed into ``Index``, which
owns the database, its lock and the current-version records these methods
move versions in and out of.

The current version of a key is its ``O`` record, as in a bucket never
versioned; noncurrent versions and delete markers are ``V`` records, newest
first. A version keeps its record (chunks, manifest, pins and live bytes)
when it stops being current: it is data until it is deleted by its id.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from tiering.errors import NoSuchBucket
from tiering.index.keys import bkey, bucket_event, label, okey, seqkey, successor, vkey
from tiering.index.tiers import Ledger
from tiering.meta import BucketInfo, ObjectMeta, now_ms
from tiering.model.conditions import WriteConditions
from tiering.model.versions import (
    ENABLED,
    NULL,
    SUSPENDED,
    Deletion,
    VersionEntry,
    VersionPage,
    shown,
    version_id,
    vseq_of,
)

if TYPE_CHECKING:
    from rocksdict import Rdict

    from tiering.index.record_cache import Batch

Found = tuple[bytes, ObjectMeta]  # a version's raw index key and record


def new_version(status: str | None, seq: int) -> str | None:
    """The version id a write gets in a bucket with ``status``."""
    if status == ENABLED:
        return version_id(seq)
    return NULL if status == SUSPENDED else None


def kept_as_noncurrent(status: str | None, old: ObjectMeta) -> bool:
    """Whether a version a new write (or delete marker) supersedes stays as
    a noncurrent version: always when versioning is Enabled; when Suspended
    unless it is the null version, which the new null version replaces."""
    return status == ENABLED or (status == SUSPENDED and not old.is_null)


def _tombstone(meta: ObjectMeta) -> dict[str, object]:
    """The footer record of one version deleted for good. A null version's
    also kills every older null version of the key (each replaced the one
    before it), so recovery cannot bring an older one back."""
    record: dict[str, object] = {"t": "del", "b": meta.bucket, "k": meta.key, "v": meta.vseq}
    if meta.is_null:
        record["n"] = True
    return record


class VersionRecords:
    """Version methods of ``Index`` (see there for locking and durability);
    ``Index`` provides the attributes declared here."""

    _db: Rdict
    _lock: object

    if TYPE_CHECKING:
        def _batch(self) -> Batch: ...
        def _write(self, batch: Batch, sync: bool = True) -> None: ...
        def _apply(self, batch: Batch, ledger: Ledger) -> None: ...
        def _next_seq(self, batch: Batch) -> int: ...
        def _pending(self, batch: Batch, record: dict[str, object]) -> None: ...
        def _scan(self, start: bytes, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...
        def _bury(self, batch: Batch, ledger: Ledger, old: ObjectMeta) -> None: ...

    # -- the bucket's status -------------------------------------------------

    def _status(self, bucket: str) -> str | None:
        raw = self._db.get(bkey(bucket))
        if raw is None:
            raise NoSuchBucket(BucketName=bucket)
        return BucketInfo.from_bytes(raw).versioning

    # -- finding versions ----------------------------------------------------

    def _versions(self, bucket: str, key: str) -> Iterator[Found]:
        """The key's noncurrent versions and delete markers, newest first."""
        prefix = vkey(bucket, key)
        for raw_key, raw in self._scan(prefix, prefix):
            yield raw_key, ObjectMeta.from_bytes(raw)

    def _find(self, bucket: str, key: str, version: str) -> Found | None:
        """The version ``version`` (an id or "null") of the key, current or not."""
        raw = self._db.get(okey(bucket, key))
        if raw is not None:
            meta = ObjectMeta.from_bytes(raw)
            if meta.is_null if version == NULL else meta.version == version:
                return okey(bucket, key), meta
        vseq = vseq_of(version)
        if vseq is None:
            return next(((k, m) for k, m in self._versions(bucket, key) if m.is_null), None)
        raw = self._db.get(vkey(bucket, key, vseq))
        return (vkey(bucket, key, vseq), ObjectMeta.from_bytes(raw)) if raw is not None else None

    def find_vseq(self, bucket: str, key: str, vseq: int) -> Found | None:
        """The version first written with sequence ``vseq`` (0: a version
        from before versions were kept), current or not: the flusher's and
        the compactor's way to a version that may have stopped being current."""
        raw = self._db.get(okey(bucket, key))
        if raw is not None:
            meta = ObjectMeta.from_bytes(raw)
            if meta.vseq == vseq:
                return okey(bucket, key), meta
        raw = self._db.get(vkey(bucket, key, vseq))
        return (vkey(bucket, key, vseq), ObjectMeta.from_bytes(raw)) if raw is not None else None

    def get_version(self, bucket: str, key: str, version: str) -> ObjectMeta | None:
        found = self._find(bucket, key, version)
        return found[1] if found is not None else None

    def latest_marker(self, bucket: str, key: str) -> ObjectMeta | None:
        """The delete marker that is the key's latest version, if it is one
        (asked only once the key has no current version: a read's miss)."""
        newest = next(self._versions(bucket, key), None)
        return newest[1] if newest is not None and newest[1].delete_marker else None

    def versions_of(self, bucket: str, key: str) -> list[ObjectMeta]:
        """Every version of the key, current first."""
        current = self._db.get(okey(bucket, key))
        rest = [meta for _, meta in self._versions(bucket, key)]
        return [ObjectMeta.from_bytes(current), *rest] if current is not None else rest

    def iter_versions(self, bucket: str | None = None) -> Iterator[ObjectMeta]:
        """Every noncurrent version and delete marker (of ``bucket``)."""
        start = vkey(bucket) if bucket is not None else b"V"
        for _, raw in self._scan(start, start):
            yield ObjectMeta.from_bytes(raw)

    def has_versions(self, bucket: str) -> bool:
        return next(self._scan(vkey(bucket), vkey(bucket)), None) is not None

    # -- moving versions -----------------------------------------------------

    def _demote(self, batch: Batch, old: ObjectMeta) -> None:
        """``old`` stops being current and stays, bytes and manifest kept."""
        batch.put(vkey(old.bucket, old.key, old.vseq), old.to_bytes())

    def _drop_null(self, batch: Batch, ledger: Ledger, bucket: str, key: str) -> ObjectMeta | None:
        """Remove the key's noncurrent null version (a Suspended bucket's
        new null version replaces it); the removed record, if any."""
        for raw_key, meta in self._versions(bucket, key):
            if meta.is_null:
                batch.delete(raw_key)
                self._kill(batch, ledger, meta)
                return meta
        return None

    def _kill(self, batch: Batch, ledger: Ledger, meta: ObjectMeta) -> None:
        """A version deleted for good: its extents die, its manifest is no
        longer pinned, and a tombstone tells the capacity tier."""
        ledger.release(meta.chunks)
        ledger.unpin(meta)
        self._pending(batch, _tombstone(meta))

    def _promote(self, batch: Batch, bucket: str, key: str, removed: bytes) -> None:
        """The latest version (``removed``, its key: the current version or
        a delete marker) was deleted: the newest remaining one becomes
        current, unless it is a delete marker (then none is)."""
        newest = next(((k, m) for k, m in self._versions(bucket, key) if k != removed), None)
        if newest is not None and not newest[1].delete_marker:
            batch.delete(newest[0])
            batch.put(okey(bucket, key), newest[1].to_bytes())

    # -- versioned deletes ---------------------------------------------------

    def _delete_locked(
        self, bucket: str, key: str, status: str | None, version: str | None,
        conditions: WriteConditions | None, batch: Batch, ledger: Ledger,
    ) -> Deletion:
        """One DELETE, added to ``batch`` (the caller holds the lock and
        writes the batch): without ``version``, the key's removal (a bucket
        never versioned) or a new delete marker; with it, that version's."""
        raw = self._db.get(okey(bucket, key))
        current = ObjectMeta.from_bytes(raw) if raw is not None else None
        if version is not None:
            return self._delete_version(bucket, key, version, batch, ledger)
        if conditions:
            conditions.check(current, key)
        if status is None:
            if current is None:
                return Deletion()
            batch.delete(okey(bucket, key))
            self._bury(batch, ledger, current)
            return Deletion(gone=(current,))
        seq = self._next_seq(batch)
        marker = ObjectMeta(bucket, key, 0, "", now_ms(), seq, vseq=seq,
                            version=new_version(status, seq), delete_marker=True)
        gone: list[ObjectMeta] = []
        if current is not None:
            batch.delete(okey(bucket, key))
            if kept_as_noncurrent(status, current):
                self._demote(batch, current)
            else:
                self._kill(batch, ledger, current)
                gone.append(current)
        if status == SUSPENDED:
            dropped = self._drop_null(batch, ledger, bucket, key)
            if dropped is not None:
                gone.append(dropped)
        batch.put(vkey(bucket, key, seq), marker.to_bytes())
        # A delete marker is a version: its manifest goes to the capacity tier.
        batch.put(seqkey(b"F", seq), label(bucket, key, vseq=seq))
        return Deletion(shown(marker.version), True, tuple(gone))

    def _delete_version(self, bucket: str, key: str, version: str, batch: Batch, ledger: Ledger) -> Deletion:
        found = self._find(bucket, key, version)
        if found is None:
            return Deletion(version)  # S3 answers 204 with the id asked for
        raw_key, meta = found
        batch.delete(raw_key)
        self._kill(batch, ledger, meta)
        if raw_key == okey(bucket, key) or self._db.get(okey(bucket, key)) is None:
            self._promote(batch, bucket, key, raw_key)
        return Deletion(version, meta.delete_marker, (meta,))

    def delete_object(
        self, bucket: str, key: str, conditions: WriteConditions | None = None, version: str | None = None
    ) -> Deletion:
        """DeleteObject (``tiering/model/versions.py`` for what each status does);
        ``conditions`` (If-Match) are checked under the lock, atomically
        with the delete, against the current version."""
        with self._lock:
            batch, ledger = self._batch(), Ledger()
            deletion = self._delete_locked(bucket, key, self._status(bucket), version, conditions, batch, ledger)
            if deletion.gone or deletion.marker:
                self._apply(batch, ledger)
                self._write(batch)
            return deletion

    def delete_objects(self, bucket: str, targets: list[tuple[str, str | None]]) -> list[Deletion]:
        """DeleteObjects: (key, version or None) each, answered in order. In
        a bucket never versioned with no version named, one synced batch for
        all; otherwise one per target (a target may move a version another
        one names)."""
        with self._lock:
            status = self._status(bucket)
            if status is None and all(version is None for _, version in targets):
                batch, ledger = self._batch(), Ledger()
                seen: set[str] = set()
                out = []
                for key, _ in targets:
                    out.append(Deletion() if key in seen else
                               self._delete_locked(bucket, key, None, None, None, batch, ledger))
                    seen.add(key)
                if any(d.gone for d in out):
                    self._apply(batch, ledger)
                    self._write(batch)
                return out
            results = []
            for key, version in targets:
                batch, ledger = self._batch(), Ledger()
                deletion = self._delete_locked(bucket, key, status, version, None, batch, ledger)
                if deletion.gone or deletion.marker:
                    self._apply(batch, ledger)
                    self._write(batch)
                results.append(deletion)
            return results

    def retag_version(self, bucket: str, key: str, version: str, tags: dict[str, str]) -> ObjectMeta | None:
        """PutObjectTagging with a versionId: a new record of that version
        (new seq, so its manifest is written again), current or not; None
        when there is no such version or it is a delete marker."""
        with self._lock:
            found = self._find(bucket, key, version)
            if found is None or found[1].delete_marker:
                return None
            raw_key, old = found
            batch, ledger = self._batch(), Ledger()
            seq = self._next_seq(batch)
            meta = replace(old, tags=tags, seq=seq, manifest=None)
            batch.put(raw_key, meta.to_bytes())
            batch.put(seqkey(b"F", seq), label(bucket, key, vseq=meta.vseq))
            ledger.unpin(old)
            self._apply(batch, ledger)
            self._write(batch)
            return meta

    def set_versioning(self, bucket: str, status: str) -> BucketInfo:
        """PutBucketVersioning: the bucket's new status, in its record and in
        a bucket event for the capacity tier (so recovery restores it)."""
        with self._lock:
            raw = self._db.get(bkey(bucket))
            if raw is None:
                raise NoSuchBucket(BucketName=bucket)
            info = replace(BucketInfo.from_bytes(raw), versioning=status)
            batch = self._batch()
            batch.put(bkey(bucket), info.to_bytes())
            self._pending(batch, bucket_event(info))
            self._write(batch)
            return info

    # -- ListObjectVersions --------------------------------------------------

    def list_versions(
        self, bucket: str, prefix: str = "", delimiter: str = "", key_marker: str = "",
        version_marker: str = "", max_keys: int = 1000,
    ) -> VersionPage:
        """One page of every version and delete marker, in key order and
        newest first within a key, after (key_marker, version_marker);
        keys holding ``delimiter`` past the prefix roll up into common
        prefixes. Current versions and older ones are two key ranges
        (``O``, ``V``) walked side by side."""
        page = VersionPage()
        walk = _Walk(self._db, bucket, prefix)
        walk.seek(max(prefix, key_marker))
        count = 0
        while (key := walk.key()) is not None:
            if delimiter and (cut := key.find(delimiter, len(prefix))) >= 0:
                common = key[: cut + len(delimiter)]
                if common > key_marker:
                    if count == max_keys:
                        page.truncated = True
                        break
                    page.prefixes.append(common)
                    page.next_key, page.next_version = common, None
                    count += 1
                walk.seek_past(common)
                continue
            versions = walk.take(key)
            if key == key_marker:
                if not version_marker:
                    continue
                ids = [shown(m.version) for m in versions]
                versions = versions[ids.index(version_marker) + 1:] if version_marker in ids else []
                latest_skipped = True
            else:
                latest_skipped = False
            for position, meta in enumerate(versions):
                if count == max_keys:
                    page.truncated = True
                    return page
                # The first version of a key is its latest: the current one,
                # or a delete marker (a newer data version would be current).
                page.entries.append(_entry(meta, position == 0 and not latest_skipped))
                page.next_key, page.next_version = key, shown(meta.version)
                count += 1
        return page


def _entry(meta: ObjectMeta, latest: bool) -> VersionEntry:
    return VersionEntry(
        meta.key, shown(meta.version), latest, meta.delete_marker, meta.size, meta.etag,
        meta.last_modified_ms, meta.checksum.algorithm if meta.checksum else None,
    )


class _Walk:
    """The keys of a bucket under a prefix that have a current version, a
    noncurrent one, or both, in order: two rocksdict iterators side by side."""

    def __init__(self, db: Rdict, bucket: str, prefix: str) -> None:
        self._obase, self._vbase = okey(bucket), vkey(bucket)
        self._oscope, self._vscope = self._obase + prefix.encode(), self._vbase + prefix.encode()
        self._o, self._v = db.iter(), db.iter()

    def seek(self, key: str) -> None:
        self._o.seek(self._obase + key.encode())
        self._v.seek(self._vbase + key.encode())

    def seek_past(self, common: str) -> None:
        self.seek(successor(common))

    def _okey(self) -> str | None:
        if self._o.valid() and (raw := self._o.key()).startswith(self._oscope):
            return raw[len(self._obase):].decode()
        return None

    def _vkey(self) -> str | None:
        if self._v.valid() and (raw := self._v.key()).startswith(self._vscope):
            return raw[len(self._vbase):-9].decode()
        return None

    def key(self) -> str | None:
        found = [k for k in (self._okey(), self._vkey()) if k is not None]
        return min(found) if found else None

    def take(self, key: str) -> list[ObjectMeta]:
        """Every version of ``key`` (the walk's next key), current first;
        the walk moves past them."""
        versions = []
        if self._okey() == key:
            versions.append(ObjectMeta.from_bytes(self._o.value()))
            self._o.next()
        while self._vkey() == key:
            versions.append(ObjectMeta.from_bytes(self._v.value()))
            self._v.next()
        return versions
