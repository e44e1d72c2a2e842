"""Reading the versioned segment format, sans-I/O: verify and decode.

The byte layout is documented, and defined, in packer/encoder.py, where it is
written. Nothing read is trusted: every length, crc, magic and version is
checked before it is used, and the footer's JSON field by field.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any, Final

from packer import codec as _codec
from packer.crc import extent_crc
from packer.encoder import (
    CRC32C_FOOTERS,
    HEADER_CRC_SPAN,
    HEADER_SIZE,
    HEADER_STRUCT,
    MAGIC,
    READABLE_FOOTERS,
    TRAILER_CRC_SPAN,
    TRAILER_MAGIC,
    TRAILER_SIZE,
    TRAILER_STRUCT,
    VERSION,
    bytes_view,
    footer_cap,
)
from packer.errors import CorruptData, UnsupportedVersion
from packer.footer import EntryRef, Footer, Tombstone
from packer.ranges import ByteRange

# An RLE block turns 4 bytes into at most 128 KiB: no zstd frame decodes to
# more than 32768x its size, so an entry claiming more is corrupt.
_ZSTD_MAX_RATIO: Final = 1 << 15


def check_header(data: bytes | memoryview) -> None:
    """Verify the first HEADER_SIZE bytes of ``data`` are a segment header."""
    view = bytes_view(data)
    if len(view) < HEADER_SIZE:
        raise CorruptData(f"segment header truncated: {len(view)} bytes")
    magic, version, flags, crc = HEADER_STRUCT.unpack_from(view)
    if magic != MAGIC:
        raise CorruptData("not a segment: bad header magic")
    if zlib.crc32(view[:HEADER_CRC_SPAN]) != crc:
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
    view = bytes_view(tail)
    if len(view) < TRAILER_SIZE:
        raise ValueError(f"need the last {TRAILER_SIZE} bytes of the segment, got {len(view)}")
    if len(view) > segment_size:
        raise ValueError(f"tail of {len(view)} bytes is longer than the segment ({segment_size})")
    trailer = view[len(view) - TRAILER_SIZE :]
    footer_length, data_end, footer_crc, version, flags, crc, magic = TRAILER_STRUCT.unpack_from(trailer)
    if magic != TRAILER_MAGIC:
        raise CorruptData("segment trailer magic missing (truncated or not a segment)")
    if zlib.crc32(trailer[:TRAILER_CRC_SPAN]) != crc:
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
    view = bytes_view(tail)
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
    if declared > footer_cap(len(stored)):
        raise CorruptData(f"segment footer claims {declared} bytes from {len(stored)}")
    raw = _codec.decode(_codec.ZSTD, stored, declared)
    try:
        document = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CorruptData(f"segment footer is not JSON: {exc}") from exc
    return _footer_from_json(document, trailer.data_end)


def decode_entry(ref: EntryRef, stored: bytes | memoryview) -> bytes:
    """Verify one extent's stored bytes against ``ref`` and decode them."""
    view = bytes_view(stored)
    if len(view) != ref.stored:
        raise CorruptData(f"extent of {len(view)} bytes, expected {ref.stored}")
    if extent_crc(view, ref.crc32c) != ref.crc:
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


def _entry_from_json(value: object, crc32c: bool) -> EntryRef:
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
        crc32c=crc32c,
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
    crc32c = version >= CRC32C_FOOTERS
    entries = tuple(_entry_from_json(e, crc32c) for e in _get(obj, "entries", list))
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
