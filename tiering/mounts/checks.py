"""What a mounted object's bytes are checked against: the store's checksum
of the whole content where it sent one (``x-amz-checksum-*``, asked for with
checksum mode); else, on a mount with ``check_md5``, the source's ETag where
that is the MD5 of the content (a single-part upload); else their length
alone, as for every piece of a larger object. Used where bytes come in from
the source (``tiering/mounts/buckets.py``, ``pieces.py``); bytes a peer
sends were checked by the node that keeps them (``owners.py``).

Why the MD5 is not checked by default: it is the dearest part of a cold
miss of a small object (64 KiB of MD5 is 100-175 us of CPU here, against
about 2 us for a CRC32C the store sends), it guards only the hop between
the store and the gateway, and on that hop TLS (an https endpoint) already
authenticates every byte; S3 clients reading the store directly (boto3,
s3fs) do not check it either. A store reached over plain HTTP has only
TCP's checksum on that hop: ``check_md5`` is for it
(docs/configuration.md)."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from functools import partial

from tiering import pool
from tiering.errors import CapacityError
from tiering.model.checksums import new_hasher

WHOLE_ATTEMPTS = 3  # fetches of a whole object whose bytes do not match its checksum
# Bytes checked on the event loop rather than in the pool, per algorithm:
# what about 90 us of hashing covers here, about what the pool call costs
# the process by itself (a worker woken, its waits for the GIL, the result
# handed back: 6-7 context switches, docs/performance.md). MD5 runs at about
# 700 MB/s, SHA-1 and SHA-256 at 1.8, zlib's CRC32 at 4 GB/s, CRC32C and
# CRC64NVME (the CPU's own instructions, through awscrt) at about 45 GB/s.
# Larger bodies go to the pool, where the hashing runs beside the loop.
LOOP_MAX = {
    "MD5": 64 * 1024,
    "SHA1": 128 * 1024,
    "SHA256": 128 * 1024,
    "CRC32": 256 * 1024,
    "CRC32C": 2 * 1024 * 1024,
    "CRC64NVME": 2 * 1024 * 1024,
}


async def whole(data: bytes, etag: str, again: Callable[[], Awaitable[bytes]],
                checksum: tuple[str, str] | None = None, *, check_md5: bool) -> bytes:
    """A whole object's bytes, checked against ``checksum`` (algorithm,
    base64 value: the store's checksum of the whole content) if given, else
    with ``check_md5`` against its ETag when that looks like an MD5 (a
    single-part upload), else not at all (their length was). A
    mismatch is fetched again: bytes damaged on the way differ from one
    fetch to the next, while an ETag that is not the MD5 of the content
    (SSE-KMS, some S3 servers) mismatches the same bytes every time, and
    those bytes are the object's. CapacityError when every fetch came back
    different."""
    if checksum is not None:
        algorithm, expected = checksum
        digest_of: Callable[[bytes], str] = partial(_b64, algorithm)
    elif check_md5 and is_md5(etag):
        algorithm, expected, digest_of = "MD5", etag, md5
    else:
        return data
    seen: set[str] = set()
    for attempt in range(WHOLE_ATTEMPTS):
        if attempt:
            data = await again()
        digest = digest_of(data) if len(data) <= LOOP_MAX[algorithm] else await pool.run(digest_of, data)
        if digest == expected or digest in seen:
            return data
        seen.add(digest)
    what = "MD5 ETag" if algorithm == "MD5" else f"{algorithm} checksum"
    raise CapacityError(
        f"the source sent bytes that do not match the object's {what} {WHOLE_ATTEMPTS} times "
        "(corrupt in transit)"
    )


def is_md5(etag: str) -> bool:
    return len(etag) == 32 and all(c in "0123456789abcdef" for c in etag)


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _b64(algorithm: str, data: bytes) -> str:
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return hasher.b64()
