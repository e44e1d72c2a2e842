"""The versioned segment format, sans-I/O.

A segment is one immutable object in the capacity store::

    offset 0          header   16 bytes
    offset 16         entries  the stored bytes of each extent, back to back
    offset data_end   footer   zstd frame of a JSON document describing the entries
    size - 36         trailer  36 bytes

All integers are big-endian. Every checksum is ``zlib.crc32``.

Header (16 bytes)::

    0   8  magic   b"TSSEG\\x00\\r\\n" (NUL and CR LF catch text-mode mangling, as PNG's does)
    8   2  version u16 = 1
    10  2  flags   u16 = 0 (any other value: UnsupportedVersion)
    12  4  crc32 of bytes [0, 12)

Footer: the zstd frame (with its content size) of compact, key-sorted, ASCII
JSON ``{"v": 2, "segment": id, "created_ms": int, "entries": [...],
"tombstones": [...], "records": [...]}``. Each entry is an object with
``bucket key seq part offset stored raw codec crc`` and, when set, ``upload``
and ``meta``; ``crc`` is the crc32 of the entry's stored bytes. A tombstone
is ``bucket key seq`` and, from footer version 2 on, optionally ``version``
(the version sequence number of the one object version it deletes) and
``null`` (that version was the key's null version: every older null version
of the key is deleted too); without ``version`` it deletes the whole key.
Footer version 1 (no version fields) is read as before; the header and
trailer layouts did not change, so their version stays 1.

Trailer (36 bytes, the last of the segment)::

    0   8  footer length  u64 (stored, i.e. compressed)
    8   8  data end       u64 (offset where the footer starts)
    16  4  footer crc32   u32 of the stored footer bytes
    20  2  version        u16 = 1
    22  2  flags          u16 = 0
    24  4  crc32 of trailer bytes [0, 24), so a flipped length is never trusted
    28  8  magic          b"TSSEGEND"

Why every byte is covered: the header and trailer carry their own crc and
magic, the trailer's crc covers the footer, and the footer's entries must tile
``[16, data_end)`` exactly, each with the crc of its bytes; ``data_end +
footer length + 36`` must equal the segment size. A crc32 catches every error
burst up to 32 bits, so any single corrupted byte is always detected.

Access patterns: one extent is one ranged read of ``[offset, offset +
stored)`` verified by ``decode_entry``; the footer is found from the end with
one read of the trailer (``footer_range``) and one of the footer, or a single
read of a generous tail (``decode_footer`` accepts extra leading bytes).
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Final

from packer import codec as _codec
from packer.errors import CorruptData, UnsupportedVersion
from packer.ranges import ByteRange

VERSION: Final = 1  # header and trailer layout
FOOTER_VERSION: Final = 2  # the footer document; 2 added tombstones of one object version
READABLE_FOOTERS: Final = (1, 2)
MAGIC: Final = b"TSSEG\x00\r\n"
TRAILER_MAGIC: Final = b"TSSEGEND"

_HEADER: Final = struct.Struct(">8sHHI")
_HEADER_CRC_SPAN: Final = 12
HEADER_SIZE: Final = _HEADER.size

_TRAILER: Final = struct.Struct(">QQIHHI8s")
_TRAILER_CRC_SPAN: Final = 24
TRAILER_SIZE: Final = _TRAILER.size

FOOTER_LEVEL: Final = 3
# Bounds on what a footer may decode to, so a hostile trailer or frame header
# cannot make the decoder allocate without limit: any footer up to 16 MiB, a
# larger one only if it compresses no better than 64x, and never over 256 MiB.
# Real footers (keys, offsets, crcs) compress 3-10x; the encoder refuses to
# write a footer the decoder would refuse.
MAX_FOOTER_RAW: Final = 256 * 1024 * 1024
_FOOTER_RAW_FLOOR: Final = 16 * 1024 * 1024
_FOOTER_MAX_RATIO: Final = 64
# An RLE block turns 4 bytes into at most 128 KiB: no zstd frame decodes to
# more than 32768x its size, so an entry claiming more is corrupt.
_ZSTD_MAX_RATIO: Final = 1 << 15


def _footer_cap(stored_length: int) -> int:
    return min(MAX_FOOTER_RAW, max(_FOOTER_RAW_FLOOR, _FOOTER_MAX_RATIO * stored_length))


def _dumps(obj: object) -> str:
    # ASCII escapes let any Python str round-trip, lone surrogates included.
    return json.dumps(
        obj, separators=(",", ":"), sort_keys=True, ensure_ascii=True, allow_nan=False
    )


def _normalised(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as the decoder will return it (tuples become lists, ...); fails
    early, at the caller's add, if it is not JSON-able."""
    if not isinstance(obj, dict):
        raise TypeError(f"expected a dict, got {type(obj).__name__}")
    normalised: dict[str, Any] = json.loads(_dumps(obj))
    return normalised


def _bytes_view(data: bytes | memoryview) -> bytes | memoryview:
    return data if isinstance(data, bytes) else memoryview(data).cast("B")


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
    crc: int  # zlib.crc32 of the stored bytes
    upload: str | None = None  # id of the multipart upload the piece was written for
    meta: dict[str, Any] | None = None  # opaque JSON-able object metadata

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


# --- encoder ---------------------------------------------------------------

_NEW, _OPEN, _FINISHED = "new", "open", "finished"


def _check_name(what: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")


def _check_count(what: str, value: object) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{what} must be a non-negative int, got {value!r}")


class SegmentEncoder:
    """Builds one segment incrementally, without doing any I/O.

    Call ``header()`` once, then ``add``/``add_stored``/``add_tombstone``/
    ``add_record`` in any order, then ``finish()`` once. The caller writes the
    bytes each call returns, in order, wherever it likes (a buffer, a file, the
    parts of a multipart upload); their concatenation is the segment.
    """

    __slots__ = (
        "_created_ms",
        "_entries",
        "_offset",
        "_records",
        "_segment",
        "_state",
        "_tombstones",
    )

    def __init__(self, segment: str, created_ms: int = 0) -> None:
        _check_name("segment", segment)
        _check_count("created_ms", created_ms)
        self._segment = segment
        self._created_ms = created_ms
        self._state = _NEW
        self._offset = 0
        self._entries: list[EntryRef] = []
        self._tombstones: list[Tombstone] = []
        self._records: list[dict[str, Any]] = []

    @property
    def segment(self) -> str:
        return self._segment

    @property
    def created_ms(self) -> int:
        return self._created_ms

    @property
    def size(self) -> int:
        """Bytes emitted so far (header and entries)."""
        return self._offset

    @property
    def entries(self) -> list[EntryRef]:
        return list(self._entries)

    def _require(self, state: str, action: str) -> None:
        if self._state != state:
            raise RuntimeError(f"cannot {action}: segment encoder is {self._state}")

    def header(self) -> bytes:
        self._require(_NEW, "write the header")
        start = struct.pack(">8sHH", MAGIC, VERSION, 0)
        self._state = _OPEN
        self._offset = HEADER_SIZE
        return _HEADER.pack(MAGIC, VERSION, 0, zlib.crc32(start))

    def add(
        self,
        bucket: str,
        key: str,
        seq: int,
        part: int,
        data: bytes | memoryview,
        *,
        compress: bool = True,
        level: int = 3,
        upload: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> tuple[EntryRef, bytes]:
        """Encode ``data`` as the next entry; return it and the bytes to append."""
        self._require(_OPEN, "add an entry")
        view = _bytes_view(data)
        if compress:
            name, stored = _codec.encode(view, level=level)
        else:
            name, stored = _codec.NONE, bytes(view)
        crc = zlib.crc32(stored)
        return self._append(bucket, key, seq, part, stored, len(view), name, crc, upload, meta)

    def add_stored(
        self,
        bucket: str,
        key: str,
        seq: int,
        part: int,
        stored: bytes | memoryview,
        raw: int,
        codec: str,
        crc: int,
        upload: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> tuple[EntryRef, bytes]:
        """Append an already-encoded extent as is (compaction copies extents
        without recompressing); its crc is checked so corruption is not copied."""
        self._require(_OPEN, "add an entry")
        stored = bytes(_bytes_view(stored))
        if codec not in _codec.CODECS:
            raise ValueError(f"unknown codec {codec!r}")
        _check_count("raw", raw)
        if codec == _codec.NONE and raw != len(stored):
            raise ValueError(f"codec none needs raw == stored, got {raw} != {len(stored)}")
        if zlib.crc32(stored) != crc:
            raise CorruptData(f"crc mismatch copying {bucket}/{key} seq {seq} part {part}")
        return self._append(bucket, key, seq, part, stored, raw, codec, crc, upload, meta)

    def _append(
        self,
        bucket: str,
        key: str,
        seq: int,
        part: int,
        stored: bytes,
        raw: int,
        codec: str,
        crc: int,
        upload: str | None,
        meta: dict[str, Any] | None,
    ) -> tuple[EntryRef, bytes]:
        _check_name("bucket", bucket)
        _check_name("key", key)
        _check_count("seq", seq)
        _check_count("part", part)
        if upload is not None:
            _check_name("upload", upload)
        ref = EntryRef(
            bucket=bucket,
            key=key,
            seq=seq,
            part=part,
            offset=self._offset,
            stored=len(stored),
            raw=raw,
            codec=codec,
            crc=crc,
            upload=upload,
            meta=None if meta is None else _normalised(meta),
        )
        self._entries.append(ref)
        self._offset += len(stored)
        return ref, stored

    def add_tombstone(
        self, bucket: str, key: str, seq: int, version: int | None = None, null: bool = False
    ) -> None:
        self._require(_OPEN, "add a tombstone")
        _check_name("bucket", bucket)
        _check_name("key", key)
        _check_count("seq", seq)
        if version is not None:
            _check_count("version", version)
        self._tombstones.append(Tombstone(bucket, key, seq, version, bool(null) and version is not None))

    def add_record(self, record: dict[str, Any]) -> None:
        self._require(_OPEN, "add a record")
        self._records.append(_normalised(record))

    def finish(self) -> bytes:
        """Return the footer and trailer, the last bytes of the segment."""
        self._require(_OPEN, "finish")
        document = {
            "v": FOOTER_VERSION,
            "segment": self._segment,
            "created_ms": self._created_ms,
            "entries": [_entry_to_json(ref) for ref in self._entries],
            "tombstones": [_tombstone_to_json(t) for t in self._tombstones],
            "records": self._records,
        }
        raw = _dumps(document).encode("ascii")
        footer = _codec.compress(raw, FOOTER_LEVEL)
        if len(raw) > _footer_cap(len(footer)):
            raise ValueError(f"footer of {len(raw)} bytes exceeds what decoders accept")
        fields = struct.pack(">QQIHH", len(footer), self._offset, zlib.crc32(footer), VERSION, 0)
        self._state = _FINISHED
        return footer + fields + struct.pack(">I8s", zlib.crc32(fields), TRAILER_MAGIC)


def _tombstone_to_json(tomb: Tombstone) -> dict[str, Any]:
    obj: dict[str, Any] = {"bucket": tomb.bucket, "key": tomb.key, "seq": tomb.seq}
    if tomb.version is not None:
        obj["version"] = tomb.version
        if tomb.null:
            obj["null"] = True
    return obj


def _entry_to_json(ref: EntryRef) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "bucket": ref.bucket,
        "key": ref.key,
        "seq": ref.seq,
        "part": ref.part,
        "offset": ref.offset,
        "stored": ref.stored,
        "raw": ref.raw,
        "codec": ref.codec,
        "crc": ref.crc,
    }
    if ref.upload is not None:
        obj["upload"] = ref.upload
    if ref.meta is not None:
        obj["meta"] = ref.meta
    return obj


# --- decoder ---------------------------------------------------------------


def check_header(data: bytes | memoryview) -> None:
    """Verify the first HEADER_SIZE bytes of ``data`` are a segment header."""
    view = _bytes_view(data)
    if len(view) < HEADER_SIZE:
        raise CorruptData(f"segment header truncated: {len(view)} bytes")
    magic, version, flags, crc = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise CorruptData("not a segment: bad header magic")
    if zlib.crc32(view[:_HEADER_CRC_SPAN]) != crc:
        raise CorruptData("segment header crc mismatch")
    if version != VERSION:
        raise UnsupportedVersion(f"segment format version {version}, this code reads {VERSION}")
    if flags:
        raise UnsupportedVersion(f"segment header flags {flags:#x} not understood")


@dataclass(frozen=True, slots=True)
class _Trailer:
    footer_length: int
    data_end: int
    footer_crc: int


def _parse_trailer(tail: bytes | memoryview, segment_size: int) -> _Trailer:
    """Verify the last TRAILER_SIZE bytes of ``tail``, the end of a segment of
    ``segment_size`` bytes."""
    if segment_size < HEADER_SIZE + TRAILER_SIZE:
        raise CorruptData(f"segment of {segment_size} bytes is too small")
    view = _bytes_view(tail)
    if len(view) < TRAILER_SIZE:
        raise ValueError(f"need the last {TRAILER_SIZE} bytes of the segment, got {len(view)}")
    if len(view) > segment_size:
        raise ValueError(f"tail of {len(view)} bytes is longer than the segment ({segment_size})")
    trailer = view[len(view) - TRAILER_SIZE :]
    footer_length, data_end, footer_crc, version, flags, crc, magic = _TRAILER.unpack_from(trailer)
    if magic != TRAILER_MAGIC:
        raise CorruptData("segment trailer magic missing (truncated or not a segment)")
    if zlib.crc32(trailer[:_TRAILER_CRC_SPAN]) != crc:
        raise CorruptData("segment trailer crc mismatch")
    if version != VERSION:
        raise UnsupportedVersion(f"segment format version {version}, this code reads {VERSION}")
    if flags:
        raise UnsupportedVersion(f"segment trailer flags {flags:#x} not understood")
    if data_end < HEADER_SIZE or data_end + footer_length + TRAILER_SIZE != segment_size:
        raise CorruptData(
            f"segment lengths disagree: data end {data_end} + footer {footer_length}"
            f" + trailer {TRAILER_SIZE} != size {segment_size}"
        )
    return _Trailer(footer_length, data_end, footer_crc)


def footer_range(segment_size: int, trailer: bytes | memoryview) -> ByteRange:
    """Where footer and trailer lie, given the segment's last TRAILER_SIZE (or
    more) bytes: read that range and hand it to ``decode_footer``."""
    parsed = _parse_trailer(trailer, segment_size)
    return ByteRange(parsed.data_end, segment_size)


def decode_footer(tail: bytes | memoryview, segment_size: int) -> Footer:
    """Decode the footer from ``tail``, any suffix of the segment that holds
    footer and trailer. Raises ValueError if ``tail`` is too short for them
    (see ``footer_range``), FormatError if they are not valid."""
    view = _bytes_view(tail)
    trailer = _parse_trailer(view, segment_size)
    needed = trailer.footer_length + TRAILER_SIZE
    if len(view) < needed:
        raise ValueError(f"tail of {len(view)} bytes, footer and trailer need {needed}")
    stored = view[len(view) - needed : len(view) - TRAILER_SIZE]
    if zlib.crc32(stored) != trailer.footer_crc:
        raise CorruptData("segment footer crc mismatch")
    declared = _codec.content_size(stored)
    if declared is None:
        raise CorruptData("segment footer frame does not declare its size")
    if declared > _footer_cap(len(stored)):
        raise CorruptData(f"segment footer claims {declared} bytes from {len(stored)}")
    raw = _codec.decode(_codec.ZSTD, stored, declared)
    try:
        document = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CorruptData(f"segment footer is not JSON: {exc}") from exc
    return _footer_from_json(document, trailer.data_end)


def decode_entry(ref: EntryRef, stored: bytes | memoryview) -> bytes:
    """Verify one extent's stored bytes against ``ref`` and decode them."""
    view = _bytes_view(stored)
    if len(view) != ref.stored:
        raise CorruptData(f"extent of {len(view)} bytes, expected {ref.stored}")
    if zlib.crc32(view) != ref.crc:
        raise CorruptData(f"extent crc mismatch at offset {ref.offset}")
    return _codec.decode(ref.codec, stored, ref.raw)


def decode_segment(data: bytes | memoryview) -> tuple[Footer, list[bytes]]:
    """Verify a whole segment and return its footer and the raw bytes of every
    entry, in order."""
    view = memoryview(data).cast("B")  # slices below must not copy the extents
    if len(view) < HEADER_SIZE + TRAILER_SIZE:
        raise CorruptData(f"segment of {len(view)} bytes is too small")
    check_header(view)
    footer = decode_footer(view, len(view))
    # decode_footer checked that the entries tile [HEADER_SIZE, data_end), so
    # every data byte is under some entry's crc.
    raws = [decode_entry(ref, view[ref.offset : ref.offset + ref.stored]) for ref in footer.entries]
    return footer, raws


# --- footer JSON -> types, trusting nothing --------------------------------


def _reject_constant(name: str) -> None:
    raise CorruptData(f"segment footer holds {name}")


def _get(obj: dict[str, Any], name: str, kind: type) -> Any:
    if name not in obj:
        raise CorruptData(f"segment footer: missing {name!r}")
    value = obj[name]
    if type(value) is not kind:  # exact: bool is not an int here
        got = type(value).__name__
        raise CorruptData(f"segment footer: {name!r} is {got}, not {kind.__name__}")
    return value


def _get_count(obj: dict[str, Any], name: str) -> int:
    value: int = _get(obj, name, int)
    if value < 0:
        raise CorruptData(f"segment footer: {name!r} is negative")
    return value


def _get_optional(obj: dict[str, Any], name: str, kind: type) -> Any:
    if obj.get(name) is None:
        return None
    return _get(obj, name, kind)


def _dict(value: object, what: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise CorruptData(f"segment footer: {what} is not an object")
    return value


def _entry_from_json(value: object) -> EntryRef:
    obj = _dict(value, "entry")
    ref = EntryRef(
        bucket=_get(obj, "bucket", str),
        key=_get(obj, "key", str),
        seq=_get_count(obj, "seq"),
        part=_get_count(obj, "part"),
        offset=_get_count(obj, "offset"),
        stored=_get_count(obj, "stored"),
        raw=_get_count(obj, "raw"),
        codec=_get(obj, "codec", str),
        crc=_get_count(obj, "crc"),
        upload=_get_optional(obj, "upload", str),
        meta=_get_optional(obj, "meta", dict),
    )
    if ref.crc > 0xFFFFFFFF:
        raise CorruptData("segment footer: crc out of range")
    if ref.codec == _codec.NONE:
        if ref.raw != ref.stored:
            raise CorruptData("segment footer: uncompressed entry with raw != stored")
    elif ref.codec == _codec.ZSTD:
        if ref.raw > ref.stored * _ZSTD_MAX_RATIO:
            raise CorruptData("segment footer: entry raw length impossible for its stored length")
    else:
        raise CorruptData(f"segment footer: unknown codec {ref.codec!r}")
    return ref


def _tombstone_from_json(value: object, footer_version: int) -> Tombstone:
    obj = _dict(value, "tombstone")
    bucket, key, seq = _get(obj, "bucket", str), _get(obj, "key", str), _get_count(obj, "seq")
    if footer_version < 2:
        return Tombstone(bucket, key, seq)
    version = None if obj.get("version") is None else _get_count(obj, "version")
    null = bool(_get_optional(obj, "null", bool)) and version is not None
    return Tombstone(bucket, key, seq, version, null)


def _footer_from_json(document: object, data_end: int) -> Footer:
    obj = _dict(document, "document")
    version = _get(obj, "v", int)
    if version not in READABLE_FOOTERS:
        raise UnsupportedVersion(f"segment footer version {version}, this code reads {READABLE_FOOTERS}")
    entries = tuple(_entry_from_json(e) for e in _get(obj, "entries", list))
    position = HEADER_SIZE
    for ref in entries:
        if ref.offset != position:
            raise CorruptData(
                f"segment entries do not tile: entry at {ref.offset}, expected {position}"
            )
        position += ref.stored
    if position != data_end:
        raise CorruptData(f"segment entries end at {position}, footer starts at {data_end}")
    return Footer(
        segment=_get(obj, "segment", str),
        created_ms=_get_count(obj, "created_ms"),
        entries=entries,
        tombstones=tuple(_tombstone_from_json(t, version) for t in _get(obj, "tombstones", list)),
        records=tuple(_dict(r, "record") for r in _get(obj, "records", list)),
        data_end=data_end,
    )
