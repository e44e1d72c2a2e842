"""What a mounted object's bytes are checked against: the source's ETag,
where that is the MD5 of the content (a single-part upload). Used where
bytes come in from the source (``tiering/mounts/buckets.py``); bytes a
peer sends were checked by the node that keeps them (``owners.py``)."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable

from tiering import pool
from tiering.errors import CapacityError

WHOLE_ATTEMPTS = 3  # fetches of a whole object whose bytes do not match its MD5 ETag
# Bytes hashed on the event loop rather than in the pool. MD5 runs at about
# 700 MB/s here: 64 KiB take ~90 us, about what the pool call costs the
# process by itself (a worker woken, its waits for the GIL, the result
# handed back: 6-7 context switches, docs/performance.md). Larger bodies
# go to the pool, where the hashing runs beside the loop on another core.
LOOP_MD5_MAX = 64 * 1024


async def whole(data: bytes, etag: str, again: Callable[[], Awaitable[bytes]]) -> bytes:
    """A whole object's bytes, checked against its ETag when that looks like
    an MD5 (a single-part upload). A mismatch is fetched again: bytes damaged
    on the way differ from one fetch to the next, while an ETag that is not
    the MD5 of the content (SSE-KMS, some S3 servers) mismatches the same
    bytes every time, and those bytes are the object's. CapacityError when
    every fetch came back different."""
    if not is_md5(etag):
        return data
    seen: set[str] = set()
    for attempt in range(WHOLE_ATTEMPTS):
        if attempt:
            data = await again()
        digest = md5(data) if len(data) <= LOOP_MD5_MAX else await pool.run(md5, data)
        if digest == etag or digest in seen:
            return data
        seen.add(digest)
    raise CapacityError(
        f"the source sent bytes that do not match the object's MD5 ETag {WHOLE_ATTEMPTS} times "
        "(corrupt in transit)"
    )


def is_md5(etag: str) -> bool:
    return len(etag) == 32 and all(c in "0123456789abcdef" for c in etag)


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()
