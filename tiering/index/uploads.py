"""The index's records of multipart uploads and their parts: an upload is
created, gets parts (each replacing any earlier part of its number), and is
aborted here; a Complete commits through ``Index.put_object``, which drops the
upload and its parts in the object's batch. Mixed into ``Index``, which owns
the database, its lock and the segment counters a replaced part releases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from tiering.errors import NoSuchBucket
from tiering.index.keys import bkey, gkey, label, pkey, seqkey, ukey
from tiering.index.tiers import Ledger
from tiering.meta import Part, SegmentInfo, Upload

if TYPE_CHECKING:
    from rocksdict import Rdict

    from tiering.index.record_cache import Batch


class UploadRecords:
    """Multipart-upload methods of ``Index`` (see there for locking and
    durability); ``Index`` provides the attributes declared here."""

    _db: Rdict
    _lock: object

    if TYPE_CHECKING:
        def _batch(self) -> Batch: ...
        def _write(self, batch: Batch, sync: bool = True) -> None: ...
        def _next_seq(self, batch: Batch) -> int: ...
        def _apply(self, batch: Batch, ledger: Ledger) -> None: ...
        def _scan(self, start: bytes, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...
        def _any_with_prefix(self, prefix: bytes) -> bool: ...

    # -- multipart uploads -------------------------------------------------

    def has_uploads(self, bucket: str) -> bool:
        """True while ``bucket`` has a multipart upload in progress."""
        return self._any_with_prefix(ukey(bucket))

    def create_upload(self, upload: Upload) -> None:
        with self._lock:
            if self._db.get(bkey(upload.bucket)) is None:
                raise NoSuchBucket(BucketName=upload.bucket)
            batch = self._batch()
            batch.put(ukey(upload.bucket, upload.key, upload.upload_id), upload.to_bytes())
            self._write(batch)

    def get_upload(self, bucket: str, key: str, upload_id: str) -> Upload | None:
        raw = self._db.get(ukey(bucket, key, upload_id))
        return Upload.from_bytes(raw) if raw is not None else None

    def put_part(self, upload: Upload, part: Part, segment: SegmentInfo | None = None) -> Part | None | bool:
        """Record a part (and the segment it was streamed into, if any);
        return the part it replaced, or False if the upload is gone
        (completed or aborted meanwhile)."""
        with self._lock:
            if self._db.get(ukey(upload.bucket, upload.key, upload.upload_id)) is None:
                return False
            raw = self._db.get(pkey(upload.upload_id, part.part_number))
            previous = Part.from_bytes(raw) if raw is not None else None
            batch = self._batch()
            batch.put(pkey(upload.upload_id, part.part_number), part.to_bytes())
            if segment is not None:
                batch.put(gkey(segment.name), segment.to_bytes())
            if any(c.file_id is not None for c in part.chunks):
                queued = label(upload.bucket, upload.key, upload.upload_id, part.part_number)
                batch.put(seqkey(b"F", self._next_seq(batch)), queued)
            if previous is not None:
                ledger = Ledger()
                ledger.release(previous.chunks)
                self._apply(batch, ledger)
            self._write(batch)
            return previous

    def list_parts(self, upload_id: str, after: int = 0, limit: int = 10_000) -> list[Part]:
        prefix = pkey(upload_id)
        parts = []
        for _, value in self._scan(pkey(upload_id, after + 1), prefix):
            if len(parts) == limit:
                break
            parts.append(Part.from_bytes(value))
        return parts

    def delete_upload(self, upload: Upload) -> list[Part] | None:
        """Remove an upload and its parts; return the parts (None if gone)."""
        with self._lock:
            if self._db.get(ukey(upload.bucket, upload.key, upload.upload_id)) is None:
                return None
            parts = self.list_parts(upload.upload_id)
            batch = self._batch()
            batch.delete(ukey(upload.bucket, upload.key, upload.upload_id))
            ledger = Ledger()
            for part in parts:
                batch.delete(pkey(upload.upload_id, part.part_number))
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
        base = ukey(bucket)
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

    def iter_uploads(self) -> Iterator[Upload]:
        for _, value in self._scan(b"U", b"U"):
            yield Upload.from_bytes(value)

    def iter_parts(self) -> Iterator[Part]:
        for _, value in self._scan(b"P", b"P"):
            yield Part.from_bytes(value)
