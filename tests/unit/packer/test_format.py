from __future__ import annotations

import json
import random
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import zstandard
from awscrt.checksums import crc32c as crt_crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer import codec
from packer.crc import HOLD_BELOW, crc32c, extent_crc
from packer.errors import CorruptData, FormatError, UnsupportedVersion
from packer.format import (
    FOOTER_VERSION,
    HEADER_SIZE,
    MAGIC,
    TRAILER_MAGIC,
    TRAILER_SIZE,
    EntryRef,
    Footer,
    SegmentEncoder,
    Tombstone,
    check_header,
    decode_entry,
    decode_footer,
    decode_segment,
    footer_range,
)
from packer.ranges import ByteRange

# --- building segments -------------------------------------------------------


@dataclass
class Piece:
    bucket: str
    key: str
    seq: int
    part: int
    data: bytes
    compress: bool = True
    upload: str | None = None
    meta: dict[str, Any] | None = None


@dataclass
class Built:
    segment: bytes
    refs: list[EntryRef]
    pieces: list[Piece]
    tombstones: list[Tombstone] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)


def build(
    pieces: list[Piece],
    tombstones: Sequence[Tombstone] = (),
    records: Sequence[dict[str, Any]] = (),
    segment_id: str = "seg-1",
    created_ms: int = 1_700_000_000_000,
) -> Built:
    encoder = SegmentEncoder(segment_id, created_ms)
    assert (encoder.segment, encoder.created_ms, encoder.size) == (segment_id, created_ms, 0)
    out = [encoder.header()]
    refs = []
    for i, piece in enumerate(pieces):
        ref, stored = encoder.add(
            piece.bucket, piece.key, piece.seq, piece.part, piece.data,
            compress=piece.compress, upload=piece.upload, meta=piece.meta,
        )
        assert ref.offset == encoder.size - len(stored)
        refs.append(ref)
        out.append(stored)
        # Interleave tombstones and records with entries: order among kinds is free.
        if i < len(tombstones):
            t = tombstones[i]
            encoder.add_tombstone(t.bucket, t.key, t.seq, t.version, t.null)
    for t in tombstones[len(pieces):]:
        encoder.add_tombstone(t.bucket, t.key, t.seq, t.version, t.null)
    for record in records:
        encoder.add_record(record)
    assert encoder.entries == refs
    out.append(encoder.finish())
    return Built(b"".join(out), refs, list(pieces), list(tombstones), list(records))


def small_segment() -> Built:
    """A few hundred bytes with every kind of content: compressed, raw and empty
    entries, an upload piece with metadata, a tombstone and a record."""
    return build(
        [
            Piece("b", "photos/cat.jpg", 3, 0, b"meow " * 40, meta={"etag": "abc", "size": 200}),
            Piece("b", "blob", 4, 0, random.Random(1).randbytes(70)),
            Piece("b", "empty", 5, 0, b""),
            Piece("b", "big", 0, 2, b"0123456789" * 9, compress=False, upload="u-1"),
        ],
        [Tombstone("b", "gone", 2)],
        [{"kind": "manifest", "key": "big", "parts": [1, 2]}],
    )


# --- strategies --------------------------------------------------------------

names = st.text(max_size=12)
counts = st.integers(0, 2**53)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)


@st.composite
def datas(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["binary", "repeated", "random"]))
    if kind == "binary":
        return draw(st.binary(max_size=300))
    if kind == "repeated":
        return draw(st.binary(min_size=1, max_size=16)) * draw(st.integers(1, 400))
    return random.Random(draw(st.integers(0, 2**32))).randbytes(draw(st.integers(0, 3000)))


pieces_strategy = st.builds(
    Piece,
    bucket=names,
    key=names,
    seq=counts,
    part=st.integers(0, 10_000),
    data=datas(),
    compress=st.booleans(),
    upload=st.none() | names,
    meta=st.none() | json_objects,
)
tombstones_strategy = st.builds(Tombstone, bucket=names, key=names, seq=counts) | st.builds(
    Tombstone, bucket=names, key=names, seq=counts, version=counts, null=st.booleans()
)


@st.composite
def segments(draw: st.DrawFn) -> Built:
    return build(
        draw(st.lists(pieces_strategy, max_size=6)),
        draw(st.lists(tombstones_strategy, max_size=4)),
        draw(st.lists(json_objects, max_size=3)),
        segment_id=draw(names),
        created_ms=draw(counts),
    )


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_decodes(built: Built) -> Footer:
    footer, raws = decode_segment(built.segment)
    assert footer.entries == tuple(built.refs)
    assert raws == [piece.data for piece in built.pieces]
    assert footer.tombstones == tuple(built.tombstones)
    assert list(footer.records) == [json.loads(json.dumps(r)) for r in built.records]
    assert footer.data_end == HEADER_SIZE + sum(ref.stored for ref in built.refs)
    return footer


# --- round trips -------------------------------------------------------------


@FAST
@given(segments())
def test_round_trip(built: Built) -> None:
    footer = assert_decodes(built)
    segment, size = built.segment, len(built.segment)

    wanted = footer_range(size, segment[-TRAILER_SIZE:])
    assert wanted == ByteRange(footer.data_end, size)
    assert decode_footer(segment[wanted.start : wanted.end], size) == footer
    assert decode_footer(segment, size) == footer  # extra leading bytes are fine

    for ref, piece in zip(footer.entries, built.pieces, strict=True):
        assert decode_entry(ref, segment[ref.range.start : ref.range.end]) == piece.data
        assert ref.raw == len(piece.data)
        if not piece.compress:
            assert ref.codec == codec.NONE


def test_small_segment_round_trips() -> None:
    built = small_segment()
    assert 200 < len(built.segment) < 1000
    assert [ref.codec for ref in built.refs] == [codec.ZSTD, codec.NONE, codec.NONE, codec.NONE]
    footer = assert_decodes(built)
    assert footer.segment == "seg-1"
    assert footer.created_ms == 1_700_000_000_000
    assert footer.entries[0].meta == {"etag": "abc", "size": 200}
    assert footer.entries[3].upload == "u-1"
    assert built.segment.startswith(MAGIC) and built.segment.endswith(TRAILER_MAGIC)


def test_empty_segment_round_trips() -> None:
    built = build([])
    footer = assert_decodes(built)
    assert footer.entries == () and footer.data_end == HEADER_SIZE


def test_large_extents_take_the_probe_path() -> None:
    noise = random.Random(7).randbytes(300_000)
    text = b"".join(b"line %d of a log file\n" % i for i in range(20_000))
    built = build([Piece("b", "noise", 1, 0, noise), Piece("b", "text", 1, 0, text)])
    assert [ref.codec for ref in built.refs] == [codec.NONE, codec.ZSTD]
    assert_decodes(built)


def test_meta_and_records_are_returned_as_json_would() -> None:
    encoder = SegmentEncoder("s")
    encoder.header()
    ref, _ = encoder.add("b", "k", 1, 0, b"x", meta={"parts": (1, 2), "n": None})
    assert ref.meta == {"parts": [1, 2], "n": None}
    with pytest.raises((TypeError, ValueError)):
        encoder.add_record({"bad": object()})
    with pytest.raises(ValueError):
        encoder.add_record({"nan": float("nan")})
    with pytest.raises(TypeError):
        encoder.add_record(["not", "a", "dict"])  # type: ignore[arg-type]


def test_add_stored_copies_without_recompressing() -> None:
    source = small_segment()
    encoder = SegmentEncoder("copy")
    out = [encoder.header()]
    for ref in reversed(source.refs):
        stored = source.segment[ref.range.start : ref.range.end]
        copy, emitted = encoder.add_stored(
            ref.bucket, ref.key, ref.seq, ref.part, stored, ref.raw, ref.codec, ref.crc,
            upload=ref.upload, meta=ref.meta, crc32c=ref.crc32c,
        )
        assert emitted == stored and copy.codec == ref.codec and copy.crc == ref.crc
        out.append(emitted)
    out.append(encoder.finish())
    _, raws = decode_segment(b"".join(out))
    assert raws == [piece.data for piece in reversed(source.pieces)]

    ref = source.refs[0]
    stored = bytearray(source.segment[ref.range.start : ref.range.end])
    stored[0] ^= 1
    encoder = SegmentEncoder("copy")
    encoder.header()
    with pytest.raises(CorruptData):
        encoder.add_stored(
            ref.bucket, ref.key, ref.seq, ref.part, stored, ref.raw, ref.codec, ref.crc, crc32c=True
        )


def test_encoder_call_order_is_enforced() -> None:
    encoder = SegmentEncoder("s")
    with pytest.raises(RuntimeError):
        encoder.add("b", "k", 0, 0, b"x")
    with pytest.raises(RuntimeError):
        encoder.finish()
    encoder.header()
    with pytest.raises(RuntimeError):
        encoder.header()
    encoder.finish()
    for call in (
        lambda: encoder.add("b", "k", 0, 0, b"x"),
        lambda: encoder.add_tombstone("b", "k", 0),
        lambda: encoder.add_record({}),
        encoder.finish,
    ):
        with pytest.raises(RuntimeError):
            call()


def test_encoder_rejects_bad_fields() -> None:
    encoder = SegmentEncoder("s")
    encoder.header()
    with pytest.raises(ValueError):
        encoder.add("b", "k", -1, 0, b"x")
    with pytest.raises(ValueError):
        encoder.add("b", "k", True, 0, b"x")
    with pytest.raises(TypeError):
        encoder.add("b", b"k", 0, 0, b"x")  # type: ignore[arg-type]
    assert encoder.entries == [] and encoder.size == HEADER_SIZE


# --- corruption and truncation -----------------------------------------------


@FAST
@given(segments(), st.data())
def test_any_flipped_byte_is_detected(built: Built, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, len(built.segment) - 1))
    mask = data.draw(st.integers(1, 255))
    corrupt = bytearray(built.segment)
    corrupt[index] ^= mask
    with pytest.raises(FormatError):
        decode_segment(bytes(corrupt))


@FAST
@given(segments(), st.data())
def test_truncation_is_detected(built: Built, data: st.DataObject) -> None:
    length = data.draw(st.integers(0, len(built.segment) - 1))
    with pytest.raises(FormatError):
        decode_segment(built.segment[:length])


def test_every_flipped_byte_of_a_small_segment_is_detected() -> None:
    segment = small_segment().segment
    for index in range(len(segment)):
        for mask in (0x01, 0x80, 0xFF):
            corrupt = bytearray(segment)
            corrupt[index] ^= mask
            with pytest.raises(FormatError):
                decode_segment(bytes(corrupt))


def test_every_truncation_and_extension_of_a_small_segment_is_detected() -> None:
    segment = small_segment().segment
    for length in range(len(segment)):
        with pytest.raises(FormatError):
            decode_segment(segment[:length])
    for extra in (b"\x00", segment[-TRAILER_SIZE:]):
        with pytest.raises(FormatError):
            decode_segment(segment + extra)
        with pytest.raises(FormatError):
            decode_segment(extra + segment)


def test_decode_entry_checks_length_and_crc() -> None:
    built = small_segment()
    ref = built.refs[0]
    stored = built.segment[ref.range.start : ref.range.end]
    with pytest.raises(CorruptData):
        decode_entry(ref, stored[:-1])
    with pytest.raises(CorruptData):
        decode_entry(ref, stored[:-1] + bytes([stored[-1] ^ 1]))


# --- footer version 3: entries checked with CRC32C ---------------------------


def test_entries_are_written_with_crc32c() -> None:
    built = small_segment()
    footer, _ = decode_segment(built.segment)
    assert footer.entries == tuple(built.refs)
    for ref in built.refs:
        stored = built.segment[ref.range.start : ref.range.end]
        assert ref.crc32c and ref.crc == extent_crc(stored, True)
        assert ref.crc != zlib.crc32(stored) or not stored


def test_crc32c_is_carried_over_pieces() -> None:
    data = random.Random(3).randbytes(100_000)
    running = extent_crc(data[:12_345], True)
    assert extent_crc(data[12_345:], True, running) == extent_crc(data, True)
    assert extent_crc(b"123456789", True) == 0xE3069283  # the CRC32C check value


def test_crc32c_is_the_same_whichever_library_computes_it() -> None:
    """Short bytes hold the GIL (google-crc32c), long ones and views let it
    go (the CRT): the same CRC either way, carried over pieces alike."""
    data = random.Random(4).randbytes(HOLD_BELOW + 1000)
    whole = crt_crc32c(data)
    for piece in (data, bytearray(data), memoryview(data)):
        assert crc32c(piece) == whole
    for cut in (0, 1, 65_536, HOLD_BELOW - 1, HOLD_BELOW):
        assert crc32c(data[cut:], crc32c(data[:cut])) == whole
        assert crc32c(memoryview(data)[cut:], crc32c(bytearray(data[:cut]))) == whole


def test_version_two_footers_are_checked_with_crc32() -> None:
    """A segment written before CRC32C (footer "v": 2) reads as it did: its
    entries' crcs are zlib's; the same crcs in a version 3 footer are wrong."""
    footer, raws = decode_segment(forge_json(valid_document(v=2), b"abc"))
    assert raws == [b"abc"] and not footer.entries[0].crc32c
    with pytest.raises(CorruptData):
        decode_segment(forge_json(valid_document(v=3), b"abc"))
    footer, raws = decode_segment(forge_json(valid_document(v=3, entry__crc=extent_crc(b"abc", True)), b"abc"))
    assert raws == [b"abc"] and footer.entries[0].crc32c


def test_a_crc32_entry_is_copied_with_its_crc32c() -> None:
    """Compaction copies an entry of an old segment: its CRC32 is checked,
    and the copy carries the CRC32C the new segment's entries carry."""
    old, _ = decode_segment(forge_json(valid_document(v=2), b"abc"))
    ref = old.entries[0]
    encoder = SegmentEncoder("copy")
    out = [encoder.header()]
    copy, stored = encoder.add_stored("b", "k", 1, 0, b"abc", 3, "none", ref.crc, crc32c=ref.crc32c)
    assert copy.crc32c and copy.crc == extent_crc(b"abc", True)
    out += [stored, encoder.finish()]
    footer, raws = decode_segment(b"".join(out))
    assert raws == [b"abc"] and footer.entries == (copy,)
    encoder = SegmentEncoder("copy")
    encoder.header()
    with pytest.raises(CorruptData):  # a CRC32 taken for a CRC32C is a mismatch
        encoder.add_stored("b", "k", 1, 0, b"abc", 3, "none", ref.crc, crc32c=True)


def test_short_tail_is_a_caller_error() -> None:
    built = small_segment()
    size = len(built.segment)
    wanted = footer_range(size, built.segment[-100:])  # a longer suffix is fine
    with pytest.raises(ValueError):
        decode_footer(built.segment[wanted.start + 1 :], size)
    with pytest.raises(ValueError):
        footer_range(size, built.segment[-TRAILER_SIZE + 1 :])


def test_wrong_segment_size_is_corrupt() -> None:
    built = small_segment()
    for size in (len(built.segment) - 1, len(built.segment) + 1, 10):
        with pytest.raises(CorruptData):
            footer_range(size, built.segment[-TRAILER_SIZE:])


def test_tiny_inputs() -> None:
    with pytest.raises(CorruptData):
        check_header(MAGIC)
    for data in (b"", MAGIC, header(), header() + TRAILER_MAGIC):
        with pytest.raises(CorruptData):
            decode_segment(data)


# --- hostile but well-checksummed input ---------------------------------------


def header(version: int = 1, flags: int = 0) -> bytes:
    start = struct.pack(">8sHH", MAGIC, version, flags)
    return start + struct.pack(">I", zlib.crc32(start))


def forge(
    footer_frame: bytes,
    data: bytes = b"",
    version: int = 1,
    flags: int = 0,
    head: bytes | None = None,
) -> bytes:
    """A segment whose every checksum is right, around whatever footer frame."""
    head = header() if head is None else head
    fields = struct.pack(
        ">QQIHH", len(footer_frame), len(head) + len(data), zlib.crc32(footer_frame), version, flags
    )
    trailer = fields + struct.pack(">I8s", zlib.crc32(fields), TRAILER_MAGIC)
    return head + data + footer_frame + trailer


def forge_json(document: object, data: bytes = b"") -> bytes:
    return forge(codec.compress(json.dumps(document).encode()), data)


def valid_document(**changes: object) -> dict[str, Any]:
    entry = {
        "bucket": "b", "key": "k", "seq": 1, "part": 0, "offset": HEADER_SIZE,
        "stored": 3, "raw": 3, "codec": "none", "crc": zlib.crc32(b"abc"),
    }  # fmt: skip
    document: dict[str, Any] = {
        "v": 1, "segment": "s", "created_ms": 0,
        "entries": [entry], "tombstones": [], "records": [],
    }  # fmt: skip
    for name, value in changes.items():
        target, _, leaf = name.rpartition("__")
        holder = entry if target == "entry" else document
        if value is ...:
            holder.pop(leaf)
        else:
            holder[leaf] = value
    return document


def test_forged_valid_segment_decodes() -> None:
    footer, raws = decode_segment(forge_json(valid_document(), b"abc"))
    assert raws == [b"abc"] and footer.entries[0].key == "k"


@pytest.mark.parametrize(
    "changes",
    [
        {"entries": ...},
        {"segment": 5},
        {"created_ms": -1},
        {"created_ms": 1.5},
        {"records": [1]},
        {"records": {}},
        {"tombstones": [{"bucket": "b", "key": "k"}]},
        {"tombstones": [{"bucket": "b", "key": "k", "seq": "1"}]},
        {"entry__seq": True},
        {"entry__seq": "1"},
        {"entry__key": ...},
        {"entry__key": None},
        {"entry__offset": HEADER_SIZE + 1},
        {"entry__offset": -5},
        {"entry__stored": 2, "entry__raw": 2},
        {"entry__stored": 4, "entry__raw": 4},
        {"entry__raw": 4},
        {"entry__codec": "lz4"},
        {"entry__codec": "zstd", "entry__raw": 10**9},
        {"entry__crc": 2**32},
        {"entry__upload": 7},
        {"entry__meta": [1]},
    ],
)
def test_malformed_footer_fields_are_corrupt(changes: dict[str, object]) -> None:
    with pytest.raises(CorruptData):
        decode_segment(forge_json(valid_document(**changes), b"abc"))


def test_overlapping_entries_are_corrupt() -> None:
    document = valid_document()
    document["entries"].append(dict(document["entries"][0]))
    with pytest.raises(CorruptData):
        decode_segment(forge_json(document, b"abcabc"))


@pytest.mark.parametrize(
    "frame",
    [
        codec.compress(b"not json"),
        codec.compress(b"[1, 2]"),
        codec.compress(b'{"v": 1, "segment": "s", "created_ms": NaN}'),
        codec.compress(b"\xff\xfe{}"),
        codec.compress(b"[" * 100_000 + b"]" * 100_000),
        b"not a zstd frame",
        b"",
        # A frame that does not declare its size.
        zstandard.ZstdCompressor(write_content_size=False).compress(b"{}"),
        # A frame header claiming 1 TiB: refused before any allocation.
        b"\x28\xb5\x2f\xfd\xe0" + (1 << 40).to_bytes(8, "little") + b"\x01\x00\x00",
    ],
)
def test_undecodable_footers_are_corrupt(frame: bytes) -> None:
    with pytest.raises(CorruptData):
        decode_segment(forge(frame))


def test_future_versions_are_unsupported() -> None:
    frame = codec.compress(json.dumps(valid_document(entries=[])).encode())
    with pytest.raises(UnsupportedVersion):
        decode_segment(forge(frame, head=header(version=2)))
    with pytest.raises(UnsupportedVersion):
        decode_segment(forge(frame, head=header(flags=1)))
    with pytest.raises(UnsupportedVersion):
        decode_segment(forge(frame, version=2))
    with pytest.raises(UnsupportedVersion):
        decode_segment(forge(frame, flags=4))
    with pytest.raises(UnsupportedVersion):
        decode_segment(forge_json(valid_document(v=4, entries=[])))


# --- footer version 2: tombstones of one object version ----------------------


def test_version_one_footers_still_decode() -> None:
    """A segment written before versioning (footer "v": 1, key tombstones
    only) reads as it did: its tombstones delete whole keys."""
    document = valid_document(tombstones=[{"bucket": "b", "key": "gone", "seq": 7}])
    footer, raws = decode_segment(forge_json(document, b"abc"))
    assert raws == [b"abc"]
    assert footer.tombstones == (Tombstone("b", "gone", 7),)
    assert footer.tombstones[0].version is None


def test_version_one_footers_ignore_version_fields() -> None:
    """Version fields mean nothing in a version-1 footer (none was ever
    written there): the tombstone stays a key tombstone."""
    document = valid_document(tombstones=[{"bucket": "b", "key": "k", "seq": 7, "version": 3, "null": True}])
    footer, _ = decode_segment(forge_json(document, b"abc"))
    assert footer.tombstones == (Tombstone("b", "k", 7),)


def test_version_tombstones_round_trip() -> None:
    encoder = SegmentEncoder("s", 0)
    out = [encoder.header()]
    encoder.add_tombstone("b", "k", 9, 5)
    encoder.add_tombstone("b", "k", 10, 6, null=True)
    encoder.add_tombstone("b", "whole", 11)
    encoder.add_tombstone("b", "x", 12, None, null=True)  # null without a version means nothing
    out.append(encoder.finish())
    footer, _ = decode_segment(b"".join(out))
    assert footer.tombstones == (
        Tombstone("b", "k", 9, 5), Tombstone("b", "k", 10, 6, True), Tombstone("b", "whole", 11),
        Tombstone("b", "x", 12),
    )
    frame = b"".join(out)[footer.data_end:-TRAILER_SIZE]
    document = json.loads(zstandard.ZstdDecompressor().decompress(frame))
    assert document["v"] == FOOTER_VERSION == 3
    assert document["tombstones"][0] == {"bucket": "b", "key": "k", "seq": 9, "version": 5}


@pytest.mark.parametrize(
    "tombstone",
    [
        {"bucket": "b", "key": "k", "seq": 1, "version": -1},
        {"bucket": "b", "key": "k", "seq": 1, "version": "5"},
        {"bucket": "b", "key": "k", "seq": 1, "version": True},
        {"bucket": "b", "key": "k", "seq": 1, "version": 5, "null": 1},
        {"bucket": "b", "key": "k", "seq": 1, "version": 5, "null": "yes"},
    ],
)
def test_malformed_version_tombstones_are_corrupt(tombstone: dict[str, Any]) -> None:
    with pytest.raises(CorruptData):
        decode_segment(forge_json(valid_document(v=2, tombstones=[tombstone]), b"abc"))


def test_what_a_tombstone_kills() -> None:
    whole = Tombstone("b", "k", 9)
    assert whole.kills(3, False) and whole.kills(0, True)
    one = Tombstone("b", "k", 9, 5)
    assert one.kills(5, False) and not one.kills(4, False) and not one.kills(6, False)
    null = Tombstone("b", "k", 9, 5, True)
    # A null version's tombstone also kills the older null versions it replaced.
    assert null.kills(5, True) and null.kills(2, True) and null.kills(0, True)
    assert not null.kills(6, True) and not null.kills(2, False)


def test_version_tombstone_arguments_are_checked() -> None:
    encoder = SegmentEncoder("s", 0)
    encoder.header()
    with pytest.raises(ValueError):
        encoder.add_tombstone("b", "k", 1, -1)
