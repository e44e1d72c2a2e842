"""The whole-object check of mounted reads (tiering.mounts.checks.whole)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from tiering.errors import CapacityError
from tiering.mounts.checks import whole

DATA = b"training sample " * 1000
ETAG = hashlib.md5(DATA).hexdigest()


def damaged(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def check(first: bytes, etag: str, later: list[bytes]) -> tuple[bytes, int]:
    """whole's answer and how many times it fetched again."""
    fetches = iter(later)
    count = 0

    async def again() -> bytes:
        nonlocal count
        count += 1
        return next(fetches)

    return asyncio.run(whole(first, etag, again)), count


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


@pytest.mark.parametrize("etag", ["abc-3", f"{ETAG}-2", "", "W/x"])
def test_multipart_and_foreign_etags_are_not_checked(etag: str) -> None:
    assert check(damaged(DATA, 0), etag, []) == (damaged(DATA, 0), 0)
