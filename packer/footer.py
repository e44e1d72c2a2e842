"""What a segment's footer records, as value types, sans-I/O.

The extents a segment holds (``EntryRef``), the deletions it records
(``Tombstone``) and the decoded footer itself (``Footer``). How they are laid
out in the footer's JSON is documented, and written, in packer/encoder.py;
packer/decoder.py turns that JSON back into these types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packer.ranges import ByteRange


@dataclass(frozen=True, slots=True)
class EntryRef:
    """Where one extent lies in a segment and how to verify and decode it."""

    bucket: str
    key: str
    # An object's piece: seq is the version's sequence number (0 when the body was
    # streamed into the segment before the version was committed and numbered) and
    # part the piece's index within the version. A piece written for a multipart
    # upload's part: seq is the upload part number (not an object sequence) and part
    # the piece's index within that part. The label stays once the upload completes;
    # a compaction copy keeps seq and part but not ``upload``.
    seq: int
    part: int
    offset: int  # byte offset of the stored bytes from the start of the segment
    stored: int  # stored length
    raw: int  # raw (decoded) length
    codec: str  # codec.NONE | codec.ZSTD
    crc: int  # CRC of the stored bytes: CRC32C if crc32c, else zlib.crc32 (packer/crc.py)
    upload: str | None = None  # id of the multipart upload the piece was written for
    meta: dict[str, Any] | None = None  # opaque JSON-able object metadata
    crc32c: bool = False  # set by the footer's version (3 and later), not stored per entry

    @property
    def range(self) -> ByteRange:
        """The bytes to read from the segment for this extent."""
        return ByteRange(self.offset, self.offset + self.stored)


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A deletion of ``(bucket, key, seq)`` recorded in a segment: of the
    whole key, or of one object ``version`` (its version sequence number;
    ``null``: the key's null version, and with it any older null version)."""

    bucket: str
    key: str
    seq: int
    version: int | None = None
    null: bool = False

    def kills(self, vseq: int, is_null: bool) -> bool:
        """Whether this tombstone deletes the object version ``vseq``
        (``is_null``: the key's null version); sequence order aside."""
        if self.version is None:
            return True
        if self.null and is_null:
            return vseq <= self.version
        return vseq == self.version


@dataclass(frozen=True, slots=True)
class Footer:
    """The decoded footer of a segment: what it holds and where."""

    segment: str
    created_ms: int
    entries: tuple[EntryRef, ...]
    tombstones: tuple[Tombstone, ...]
    records: tuple[dict[str, Any], ...]  # opaque JSON-able dicts from tiering
    data_end: int  # offset where the footer starts
