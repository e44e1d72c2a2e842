"""The index encoding of the namespace's records: round trips, and records
written by older (fewer fields) and newer (unknown fields) versions."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from tiering.meta import BucketInfo, Checksum, Chunk, Extent, ObjectMeta, Part, SegmentInfo, Upload

text = st.text(max_size=12)
count = st.integers(min_value=0, max_value=2**63 - 1)
extents = st.builds(Extent, text, count, count, count, text, st.integers(min_value=0, max_value=2**32 - 1))
chunks = st.builds(Chunk, count, st.none() | text, st.none() | extents)
checksums = st.none() | st.builds(Checksum, text, text, text)
headers = st.dictionaries(text, text, max_size=3)
objects = st.builds(
    ObjectMeta, text, text, count, text, count, count, text, headers, headers, checksums,
    st.lists(chunks, max_size=4).map(tuple), st.lists(count, max_size=4).map(tuple),
    st.none() | text, st.none() | text,
)


@settings(max_examples=200)
@given(objects)
def test_object_round_trip(meta: ObjectMeta) -> None:
    back = ObjectMeta.from_bytes(meta.to_bytes())
    assert back == meta
    assert type(back.chunks) is tuple and type(back.part_sizes) is tuple
    assert all(type(c) is Chunk and (c.extent is None or type(c.extent) is Extent) for c in back.chunks)


def test_other_records_round_trip() -> None:
    records = [
        BucketInfo("b", 1, "eu-west-1", True, False, 8 << 20, None),
        Upload("u1", "b", "k", 5, "text/plain", {"cache-control": "no"}, {"a": "b"}, "CRC32C", "COMPOSITE"),
        Part(3, 10, "e" * 32, 7, (Chunk(10, "f1"),), Checksum("SHA256", "x==")),
        SegmentInfo("s", 100, 90, 80, 2, 9),
    ]
    for record in records:
        assert type(record).from_bytes(record.to_bytes()) == record


def test_fields_unknown_to_this_version_are_ignored() -> None:
    meta = ObjectMeta("b", "k", 3, "e", 1, 2, chunks=(Chunk(3, extent=Extent("s", 0, 3, 3)),))
    plain = meta.to_plain()
    plain["storage_tier"] = "glacier"
    plain["chunks"][0]["extent"]["cipher"] = "aes"
    assert ObjectMeta.from_bytes(msgpack.packb(plain, use_bin_type=True)) == meta


def test_fields_an_older_version_did_not_write_take_their_defaults() -> None:
    plain = {"bucket": "b", "key": "k", "size": 0, "etag": "e", "last_modified_ms": 1, "seq": 2,
             "chunks": [{"size": 0, "file_id": "f"}]}
    meta = ObjectMeta.from_bytes(msgpack.packb(plain, use_bin_type=True))
    assert meta == ObjectMeta("b", "k", 0, "e", 1, 2, chunks=(Chunk(0, "f"),))
    assert meta.headers == {} and meta.part_sizes == () and meta.checksum is None
    assert plain["chunks"] == [{"size": 0, "file_id": "f"}]  # the input is not changed


def test_an_extent_recorded_before_crc32c_is_checked_with_crc32() -> None:
    """Records written before segments carried CRC32C have no ``crc32c``:
    their extents' crcs are zlib's CRC32, as their segments' footers say."""
    plain = {"segment": "s", "offset": 16, "stored": 3, "raw": 3, "codec": "none", "crc": 891568578}
    old = Extent.from_bytes(msgpack.packb(plain, use_bin_type=True))
    assert old == Extent("s", 16, 3, 3, "none", 891568578) and not old.crc32c
    new = Extent("s", 16, 3, 3, "none", 0x364B3FB7, crc32c=True)
    assert Extent.from_bytes(new.to_bytes()) == new
