"""tiering.model.checksums: known vectors, parity with botocore, CRC combination."""

from __future__ import annotations

import base64
import hashlib

import pytest
from botocore import httpchecksum as bc
from hypothesis import given, settings
from hypothesis import strategies as st

from tiering.errors import InvalidArgument, InvalidRequest
from tiering.model import checksums as ck

CHECK = b"123456789"

# Published "check" values of each CRC over b"123456789".
KNOWN = {
    "CRC32": 0xCBF43926,
    "CRC32C": 0xE3069283,
    "CRC64NVME": 0xAE8B14860A799888,
}

BOTOCORE = {
    "CRC32": bc.CrtCrc32Checksum,
    "CRC32C": bc.CrtCrc32cChecksum,
    "CRC64NVME": bc.CrtCrc64NvmeChecksum,
    "SHA1": bc.Sha1Checksum,
    "SHA256": bc.Sha256Checksum,
}


def one_shot(algorithm: str, data: bytes) -> bytes:
    h = ck.new_hasher(algorithm)
    h.update(data)
    return h.digest()


@pytest.mark.parametrize("algorithm", sorted(KNOWN))
def test_crc_check_values(algorithm: str) -> None:
    size = ck.DIGEST_SIZE[algorithm]
    assert one_shot(algorithm, CHECK) == KNOWN[algorithm].to_bytes(size, "big")


@pytest.mark.parametrize("algorithm", ck.ALGORITHMS)
def test_digest_sizes_and_empty_input(algorithm: str) -> None:
    empty = ck.new_hasher(algorithm).digest()
    assert len(empty) == ck.DIGEST_SIZE[algorithm]
    if algorithm in ck.FULL_OBJECT_CAPABLE:
        assert empty == bytes(len(empty))  # CRC of nothing is 0
    else:
        assert empty == hashlib.new(algorithm.lower()).digest()


def test_sha_vectors() -> None:
    assert one_shot("SHA1", b"abc").hex() == "a9993e364706816aba3e25717850c26c9cd0d89d"
    assert one_shot("SHA256", b"abc").hex() == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )


@pytest.mark.parametrize("algorithm", ck.ALGORITHMS)
@pytest.mark.parametrize("data", [b"", CHECK, bytes(range(256)) * 300])
def test_b64_matches_botocore(algorithm: str, data: bytes) -> None:
    theirs = BOTOCORE[algorithm]()
    theirs.update(data)
    ours = ck.new_hasher(algorithm)
    # Feed in uneven pieces, including memoryviews, to exercise the running state.
    view = memoryview(data)
    for start in range(0, len(data), 977):
        ours.update(view[start : start + 977])
    assert ours.b64() == theirs.b64digest()
    assert ours.digest() == theirs.digest()


@given(st.sampled_from(ck.ALGORITHMS), st.lists(st.binary(max_size=300), max_size=8))
def test_incremental_equals_one_shot(algorithm: str, pieces: list[bytes]) -> None:
    h = ck.new_hasher(algorithm)
    for p in pieces:
        h.update(p)
    assert h.digest() == one_shot(algorithm, b"".join(pieces))


def test_header_names_round_trip() -> None:
    assert ck.header_name("CRC32") == "x-amz-checksum-crc32"
    assert ck.header_name("CRC64NVME") == "x-amz-checksum-crc64nvme"
    for algorithm in ck.ALGORITHMS:
        assert ck.algorithm_from_header(ck.header_name(algorithm)) == algorithm
    assert ck.algorithm_from_header("x-amz-checksum-md5") is None
    assert ck.algorithm_from_header("x-amz-checksum-type") is None
    assert ck.algorithm_from_header("content-md5") is None


@pytest.mark.parametrize("bad", ["MD5", "crc32", "XXHASH64", ""])
def test_unknown_algorithm_is_invalid_argument(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        ck.new_hasher(bad)
    with pytest.raises(InvalidArgument):
        ck.header_name(bad)


@pytest.mark.parametrize("algorithm", ck.ALGORITHMS)
def test_decode_digest_round_trip(algorithm: str) -> None:
    h = ck.new_hasher(algorithm)
    h.update(CHECK)
    assert ck.decode_digest(algorithm, h.b64()) == h.digest()


@pytest.mark.parametrize(
    ("algorithm", "value"),
    [
        ("CRC32", "short==="),  # not base64
        ("CRC32", "AAAA"),  # valid base64, 3 bytes
        ("CRC32", "AAAAAAAA"),  # valid base64, 6 bytes
        ("CRC32", "AAAAAA"),  # missing padding
        ("CRC32", "AAAAAA==AA"),  # data after padding
        ("CRC32", "AAA*AA=="),  # outside the alphabet
        ("CRC32", ""),
        ("CRC32", "AAAAAA==\u00e9"),  # not ASCII
        ("CRC64NVME", "AAAAAA=="),  # a CRC32-sized value
        ("SHA256", base64.b64encode(bytes(20)).decode()),  # a SHA1-sized value
    ],
)
def test_decode_digest_rejects_malformed(algorithm: str, value: str) -> None:
    # S3: 400 InvalidRequest "Value for x-amz-checksum-crc32 header is invalid."
    with pytest.raises(InvalidRequest) as info:
        ck.decode_digest(algorithm, value)
    assert info.value.message == f"Value for {ck.header_name(algorithm)} header is invalid."


def test_decode_digest_unknown_algorithm() -> None:
    with pytest.raises(InvalidArgument):
        ck.decode_digest("MD5", "AAAAAA==")


@settings(max_examples=200)
@given(
    st.sampled_from(sorted(ck.FULL_OBJECT_CAPABLE)),
    st.lists(st.binary(max_size=2000), max_size=10),
)
def test_combine_full_object_equals_hash_of_concatenation(
    algorithm: str, parts: list[bytes]
) -> None:
    pairs = [(one_shot(algorithm, p), len(p)) for p in parts]
    assert ck.combine_full_object(algorithm, pairs) == one_shot(algorithm, b"".join(parts))


def test_combine_full_object_large_parts() -> None:
    # Realistic multipart sizes: the combine must not depend on re-reading data.
    parts = [b"a" * (5 * 1024 * 1024), b"b" * (5 * 1024 * 1024 + 17), b"c" * 3]
    for algorithm in ck.FULL_OBJECT_CAPABLE:
        pairs = [(one_shot(algorithm, p), len(p)) for p in parts]
        assert ck.combine_full_object(algorithm, pairs) == one_shot(algorithm, b"".join(parts))


@pytest.mark.parametrize("algorithm", ["SHA1", "SHA256"])
def test_combine_full_object_refuses_sha(algorithm: str) -> None:
    with pytest.raises(InvalidRequest):
        ck.combine_full_object(algorithm, [(one_shot(algorithm, b"x"), 1)])


def test_combine_full_object_rejects_wrong_digest_size() -> None:
    with pytest.raises(InvalidArgument):
        ck.combine_full_object("CRC64NVME", [(bytes(4), 10)])


@pytest.mark.parametrize("algorithm", ck.ALGORITHMS)
def test_composite_format(algorithm: str) -> None:
    parts = [b"part one", b"part two", b"3"]
    digests = [one_shot(algorithm, p) for p in parts]
    value = ck.composite(algorithm, digests)
    b64, _, count = value.rpartition("-")
    assert count == "3"
    assert base64.b64decode(b64) == one_shot(algorithm, b"".join(digests))
    # The hash part alone decodes like any header value of this algorithm.
    assert len(ck.decode_digest(algorithm, b64)) == ck.DIGEST_SIZE[algorithm]


def test_composite_known_value() -> None:
    # CRC32 of the two 4-byte part checksums concatenated, computed by hand.
    d1, d2 = one_shot("CRC32", b"hello "), one_shot("CRC32", b"world")
    expected = base64.b64encode(one_shot("CRC32", d1 + d2)).decode()
    assert ck.composite("CRC32", [d1, d2]) == f"{expected}-2"
    assert ck.composite("SHA256", []) == base64.b64encode(hashlib.sha256().digest()).decode() + "-0"
