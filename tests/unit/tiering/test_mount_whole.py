"""The whole-object check of mounted reads (tiering.mounts.checks.whole)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from tiering.errors import CapacityError
from tiering.model.checksums import new_hasher
from tiering.mounts.checks import LOOP_MAX, whole
from tiering.mounts.source import whole_checksum

DATA = b"training sample " * 1000
ETAG = hashlib.md5(DATA).hexdigest()


def damaged(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def check(first: bytes, etag: str, later: list[bytes],
          checksum: tuple[str, str] | None = None, check_md5: bool = True) -> tuple[bytes, int]:
    """whole's answer and how many times it fetched again."""
    fetches = iter(later)
    count = 0

    async def again() -> bytes:
        nonlocal count
        count += 1
        return next(fetches)

    return asyncio.run(whole(first, etag, again, checksum, check_md5=check_md5)), count


def test_matching_bytes_are_taken_without_a_refetch() -> None:
    assert check(DATA, ETAG, []) == (DATA, 0)


def test_damaged_bytes_are_fetched_again() -> None:
    assert check(damaged(DATA, 5), ETAG, [damaged(DATA, 9), DATA]) == (DATA, 2)


def test_bytes_that_stay_damaged_are_an_error() -> None:
    with pytest.raises(CapacityError, match="corrupt"):
        check(damaged(DATA, 1), ETAG, [damaged(DATA, 2), damaged(DATA, 3)])


def test_an_etag_that_is_not_the_md5_accepts_bytes_seen_twice() -> None:
    """SSE-KMS and some servers: the ETag is not the content's MD5, and the
    same bytes come back every time."""
    kms_etag = "0" * 32
    assert check(DATA, kms_etag, [DATA]) == (DATA, 1)


def test_without_check_md5_an_md5_etag_is_not_checked() -> None:
    """A mount's default: bytes the store sends no checksum of are taken as
    they came (their length was checked), as a direct reader takes them."""
    assert check(damaged(DATA, 3), ETAG, [], check_md5=False) == (damaged(DATA, 3), 0)


def test_without_check_md5_the_stores_checksum_is_still_checked() -> None:
    checksum = ("CRC32C", b64("CRC32C", DATA))
    assert check(damaged(DATA, 4), ETAG, [DATA], checksum, check_md5=False) == (DATA, 1)


@pytest.mark.parametrize("etag", ["abc-3", f"{ETAG}-2", "", "W/x"])
def test_multipart_and_foreign_etags_are_not_checked(etag: str) -> None:
    assert check(damaged(DATA, 0), etag, []) == (damaged(DATA, 0), 0)


# --- the store's checksum of the whole content ---------------------------------


def b64(algorithm: str, data: bytes) -> str:
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return hasher.b64()


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"])
def test_a_store_checksum_is_checked_instead_of_the_md5(algorithm: str) -> None:
    checksum = (algorithm, b64(algorithm, DATA))
    assert check(DATA, "0" * 32, [], checksum) == (DATA, 0), "the MD5 ETag is not asked"
    assert check(damaged(DATA, 7), ETAG, [DATA], checksum) == (DATA, 1)
    with pytest.raises(CapacityError, match=f"{algorithm} checksum"):
        check(damaged(DATA, 1), ETAG, [damaged(DATA, 2), damaged(DATA, 3)], checksum)


def test_a_store_checksum_checks_objects_whose_etag_is_no_md5() -> None:
    checksum = ("CRC32", b64("CRC32", DATA))
    assert check(damaged(DATA, 0), "abc-1", [DATA], checksum) == (DATA, 1)


def test_large_bodies_are_checked_in_the_pool() -> None:
    data = bytes(range(256)) * (LOOP_MAX["CRC32"] // 256 + 1)
    assert check(data, ETAG, [], ("CRC32", b64("CRC32", data))) == (data, 0)
    assert check(damaged(data, 3), ETAG, [data], ("CRC32", b64("CRC32", data))) == (data, 1)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"x-amz-checksum-crc32": "AAAAAA=="}, ("CRC32", "AAAAAA==")),
        ({"x-amz-checksum-crc32": "AAAAAA==", "x-amz-checksum-crc64nvme": "AAAAAAAAAAA="},
         ("CRC64NVME", "AAAAAAAAAAA=")),
        ({"x-amz-checksum-sha256": "x=", "x-amz-checksum-crc32c": "y="}, ("CRC32C", "y=")),
        ({"x-amz-checksum-crc32": "AAAAAA==-3"}, None),  # composite: of the part checksums
        ({"x-amz-checksum-crc32": "AAAAAA==", "x-amz-checksum-type": "COMPOSITE"}, None),
        ({"x-amz-checksum-crc32": "AAAAAA==", "x-amz-checksum-type": "FULL_OBJECT"}, ("CRC32", "AAAAAA==")),
        ({"x-amz-checksum-crc32": ""}, None),
    ],
)
def test_which_store_checksum_is_taken(headers: dict[str, str], expected: tuple[str, str] | None) -> None:
    assert whole_checksum(headers) == expected
