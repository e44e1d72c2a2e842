"""The versioned segment format and its encoder, sans-I/O.

A segment is one immutable object in the capacity store::

    offset 0          header   16 bytes
    offset 16         entries  the stored bytes of each extent, back to back
    offset data_end   footer   zstd frame of a JSON document describing the entries
    size - 36         trailer  36 bytes

All integers are big-endian. The header's, the trailer's and the footer's
checksums are ``zlib.crc32``; an entry's is CRC32C from footer version 3 on
(packer/crc.py).

Header (16 bytes)::

    0   8  magic   b"TSSEG\\x00\\r\\n" (NUL and CR LF catch text-mode mangling, as PNG's does)
    8   2  version u16 = 1
    10  2  flags   u16 = 0 (any other value: UnsupportedVersion)
    12  4  crc32 of bytes [0, 12)

Footer: the zstd frame (with its content size) of compact, key-sorted, ASCII
JSON ``{"v": 2, "segment": id, "created_ms": int, "entries": [...],
"tombstones": [...], "records": [...]}``. Each entry is an object with
``bucket key seq part offset stored raw codec crc`` and, when set, ``upload``
and ``meta``; ``crc`` is the CRC of the entry's stored bytes: CRC32C in
footer version 3, which this encoder writes, zlib's CRC32 in versions 1
and 2 (the kind is the footer's, so a reader that knows only versions 1
and 2 refuses a version 3 segment rather than failing its CRCs). A tombstone
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
read of a generous tail (``decode_footer`` accepts extra leading bytes). The
reading side is packer/decoder.py; the records a footer decodes to are
packer/footer.py's; ``packer.format`` gathers the public names of all three.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any, Final

from packer import codec as _codec
from packer.crc import extent_crc
from packer.errors import CorruptData
from packer.footer import EntryRef, Tombstone

VERSION: Final = 1  # header and trailer layout
# The footer document: 2 added tombstones of one object version, 3 made
# every entry's crc a CRC32C.
FOOTER_VERSION: Final = 3
READABLE_FOOTERS: Final = (1, 2, 3)
CRC32C_FOOTERS: Final = 3  # the first footer version whose entries carry CRC32C
MAGIC: Final = b"TSSEG\x00\r\n"
TRAILER_MAGIC: Final = b"TSSEGEND"

HEADER_STRUCT: Final = struct.Struct(">8sHHI")
HEADER_CRC_SPAN: Final = 12
HEADER_SIZE: Final = HEADER_STRUCT.size

TRAILER_STRUCT: Final = struct.Struct(">QQIHHI8s")
TRAILER_CRC_SPAN: Final = 24
TRAILER_SIZE: Final = TRAILER_STRUCT.size

FOOTER_LEVEL: Final = 3
# Bounds on what a footer may decode to, so a hostile trailer or frame header
# cannot make the decoder allocate without limit: any footer up to 16 MiB, a
# larger one only if it compresses no better than 64x, and never over 256 MiB.
# Real footers (keys, offsets, crcs) compress 3-10x; the encoder refuses to
# write a footer the decoder would refuse.
MAX_FOOTER_RAW: Final = 256 * 1024 * 1024
_FOOTER_RAW_FLOOR: Final = 16 * 1024 * 1024
_FOOTER_MAX_RATIO: Final = 64


def _writes_crc32c() -> bool:
    """Whether the entries this encoder writes carry CRC32C: from the
    footer version it writes (read at the call, so that a test can write a
    segment as an older version did)."""
    return FOOTER_VERSION >= CRC32C_FOOTERS


def footer_cap(stored_length: int) -> int:
    """The most bytes a footer of ``stored_length`` stored bytes may decode to."""
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


def bytes_view(data: bytes | memoryview) -> bytes | memoryview:
    """``data`` as bytes, or as a memoryview of unsigned bytes (any other format cast)."""
    return data if isinstance(data, bytes) else memoryview(data).cast("B")


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
        return HEADER_STRUCT.pack(MAGIC, VERSION, 0, zlib.crc32(start))

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
        view = bytes_view(data)
        if compress:
            name, stored = _codec.encode(view, level=level)
        else:
            name, stored = _codec.NONE, bytes(view)
        crc = extent_crc(stored, _writes_crc32c())
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
        crc32c: bool = False,
    ) -> tuple[EntryRef, bytes]:
        """Append an already-encoded extent as is (compaction copies extents
        without recompressing); its ``crc`` (a CRC32C if ``crc32c``, else
        zlib's CRC32: the kind of the segment it comes from) is checked so
        corruption is not copied, and a CRC32 is replaced by the CRC32C this
        segment's entries carry."""
        self._require(_OPEN, "add an entry")
        stored = bytes(bytes_view(stored))
        if codec not in _codec.CODECS:
            raise ValueError(f"unknown codec {codec!r}")
        _check_count("raw", raw)
        if codec == _codec.NONE and raw != len(stored):
            raise ValueError(f"codec none needs raw == stored, got {raw} != {len(stored)}")
        if extent_crc(stored, crc32c) != crc:
            raise CorruptData(f"crc mismatch copying {bucket}/{key} seq {seq} part {part}")
        if crc32c != _writes_crc32c():
            crc = extent_crc(stored, _writes_crc32c())
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
            crc32c=_writes_crc32c(),
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
        if len(raw) > footer_cap(len(footer)):
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
