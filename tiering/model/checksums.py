"""S3 additional checksums: the ``x-amz-checksum-*`` family.

S3 lets a client ask for one extra checksum per object besides the MD5 ETag:
CRC32, CRC32C, CRC64NVME, SHA1 or SHA256. Values travel base64-encoded, in a
header or an aws-chunked trailer, of the big-endian digest bytes.

Multipart uploads report the object checksum in one of two ways:

* COMPOSITE: hash of the concatenated binary part checksums, suffixed with
  ``-N`` (N = number of parts). Works for every algorithm.
* FULL_OBJECT: the checksum of the whole object, as if uploaded in one PUT.
  Only CRCs can do this without re-reading the data, because a CRC of a
  concatenation can be computed from the CRCs and lengths of its pieces.

CRC32 uses zlib (the same polynomial as gzip); CRC64NVME the CRT, which
botocore itself uses; CRC32C ``packer.crc`` (the CRT's or google-crc32c's,
by length: see there why), the same values as the clients compute.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from collections.abc import Callable
from typing import Final

from awscrt import checksums as crt

from packer.crc import crc32c
from tiering.errors import InvalidArgument, InvalidRequest

ALGORITHMS: tuple[str, ...] = ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256")
FULL_OBJECT_CAPABLE = {"CRC32", "CRC32C", "CRC64NVME"}

_HEADER_PREFIX: Final = "x-amz-checksum-"

# Digest length in bytes; decode_digest rejects any other length, as S3 does.
DIGEST_SIZE: Final[dict[str, int]] = {
    "CRC32": 4,
    "CRC32C": 4,
    "CRC64NVME": 8,
    "SHA1": 20,
    "SHA256": 32,
}

# (update(data, previous) -> crc, combine(crc1, crc2, len2) -> crc) per CRC.
_CRC: Final[dict[str, tuple[Callable[..., int], Callable[[int, int, int], int]]]] = {
    "CRC32": (zlib.crc32, crt.combine_crc32),
    "CRC32C": (crc32c, crt.combine_crc32c),
    "CRC64NVME": (crt.crc64nvme, crt.combine_crc64nvme),
}

_SHA: Final[dict[str, Callable[[], hashlib._Hash]]] = {
    "SHA1": hashlib.sha1,
    "SHA256": hashlib.sha256,
}

_BY_HEADER: Final[dict[str, str]] = {_HEADER_PREFIX + a.lower(): a for a in ALGORITHMS}


def _check(algorithm: str) -> str:
    if algorithm not in DIGEST_SIZE:
        raise InvalidArgument(f"Unsupported checksum algorithm: {algorithm}")
    return algorithm


def header_name(algorithm: str) -> str:
    """``"CRC32"`` -> ``"x-amz-checksum-crc32"``."""
    return _HEADER_PREFIX + _check(algorithm).lower()


def algorithm_from_header(name: str) -> str | None:
    """Inverse of :func:`header_name` for a lower-case header name, else None."""
    return _BY_HEADER.get(name)


class Hasher:
    """Incremental checksum of one algorithm.

    Not locked: one request's body is hashed by one thread at a time, which
    is how the PUT path uses it (the hashlib objects release the GIL on big
    updates but are not meant to be shared).
    """

    __slots__ = ("_crc", "_sha", "_update", "algorithm")

    def __init__(self, algorithm: str) -> None:
        self.algorithm = _check(algorithm)
        self._crc = 0
        crc = _CRC.get(algorithm)
        self._update = crc[0] if crc else None
        self._sha = None if crc else _SHA[algorithm]()

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._update is not None:
            self._crc = self._update(data, self._crc)
        else:
            assert self._sha is not None
            self._sha.update(data)

    def digest(self) -> bytes:
        """Big-endian digest bytes (4 for CRC32/C, 8 for CRC64NVME)."""
        if self._sha is not None:
            return self._sha.digest()
        return self._crc.to_bytes(DIGEST_SIZE[self.algorithm], "big")

    def b64(self) -> str:
        """The digest as S3 sends it in headers and XML."""
        return base64.b64encode(self.digest()).decode("ascii")


def new_hasher(algorithm: str) -> Hasher:
    """A fresh :class:`Hasher`; InvalidArgument for an unknown algorithm."""
    return Hasher(algorithm)


def decode_digest(algorithm: str, b64value: str) -> bytes:
    """Decode a client-supplied checksum value into digest bytes.

    S3 answers a value that is not base64 of the right length with 400
    InvalidRequest "Value for x-amz-checksum-crc32 header is invalid." (not
    InvalidDigest, which is Content-MD5's error), so that is what we raise.
    """
    size = DIGEST_SIZE[_check(algorithm)]
    try:
        raw = binascii.a2b_base64(b64value.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raw = None
    if raw is None or len(raw) != size:
        raise InvalidRequest(f"Value for {header_name(algorithm)} header is invalid.")
    return raw


def combine_full_object(algorithm: str, parts: list[tuple[bytes, int]]) -> bytes:
    """CRC of the concatenated parts, from (part digest, part length) pairs.

    This is how a FULL_OBJECT multipart checksum is produced without reading
    the parts again. An empty list gives the CRC of the empty string (0).
    """
    crc = _CRC.get(_check(algorithm))
    if crc is None:
        raise InvalidRequest(
            f"The FULL_OBJECT checksum type cannot be used with the "
            f"{algorithm.lower()} checksum algorithm."
        )
    combine = crc[1]
    size = DIGEST_SIZE[algorithm]
    total = 0
    for i, (digest, length) in enumerate(parts):
        if len(digest) != size or length < 0:
            raise InvalidArgument(f"part {i}: bad {algorithm} digest or length")
        value = int.from_bytes(digest, "big")
        total = value if i == 0 else combine(total, value, length)
    return total.to_bytes(size, "big")


def composite(algorithm: str, part_digests: list[bytes]) -> str:
    """COMPOSITE multipart checksum: ``base64(hash(d1 + d2 + ...))-N``."""
    hasher = new_hasher(algorithm)
    for digest in part_digests:
        hasher.update(digest)
    return f"{hasher.b64()}-{len(part_digests)}"
