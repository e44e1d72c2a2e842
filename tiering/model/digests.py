"""The digests computed over a body while it is written, wherever it goes."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable

from tiering import pool
from tiering.errors import BadDigest, IncompleteBody, PayloadHashMismatch
from tiering.meta import Checksum
from tiering.model import checksums
from tiering.model.checksums import Hasher, new_hasher
from tiering.model.inputs import Integrity

WRITE_BLOCK = 1024 * 1024  # body bytes gathered per pool call


class Digests:
    """MD5 (the ETag), the client's requested checksum, and SHA-256 when the
    payload was signed: updated once per block, read after the body ends."""

    __slots__ = ("checksum", "md5", "sha256", "size")

    def __init__(self, checksum_algorithm: str | None = None, sha256: bool = False) -> None:
        self.md5 = hashlib.md5()
        self.checksum: Hasher | None = new_hasher(checksum_algorithm) if checksum_algorithm else None
        self.sha256 = hashlib.sha256() if sha256 else None
        self.size = 0

    @classmethod
    def of(cls, integrity: Integrity) -> Digests:
        """The digests a write with ``integrity`` must compute."""
        return cls(integrity.checksum_algorithm, sha256=integrity.payload_sha256 is not None)

    def update(self, data: bytes | memoryview) -> None:
        self.md5.update(data)
        if self.checksum is not None:
            self.checksum.update(data)
        if self.sha256 is not None:
            self.sha256.update(data)
        self.size += len(data)


async def gather(
    body: AsyncIterator[bytes], consume: Callable[[bytes], Awaitable[object]], block: int = WRITE_BLOCK
) -> None:
    """Gather small network reads into blocks of ``block`` bytes so each
    hand-off (a pool call, an upload part) amortises its cost."""
    buffer = bytearray()
    async for piece in body:
        buffer += piece
        while len(buffer) >= block:
            await consume(bytes(buffer[:block]))
            del buffer[:block]
    if buffer:
        await consume(bytes(buffer))


async def ingest(
    body: AsyncIterator[bytes],
    integrity: Integrity,
    consume: Callable[[bytes], Awaitable[object]],
    *,
    block: int = WRITE_BLOCK,
    digests: Digests | None = None,
) -> tuple[Digests, Checksum | None]:
    """The one loop every write runs: ``body`` gathered into blocks, each
    hashed and given to ``consume``; then the length and the digests the
    client declared are checked (IncompleteBody, BadDigest, ...). A
    ``consume`` that hashes the block itself, in the same pool call as its
    write (a hot-tier writer), passes its ``digests``; otherwise each block
    is hashed in the pool first. Returns the digests and the checksum to
    store (None when the client asked for none)."""
    if digests is None:
        digests = hashing = Digests.of(integrity)

        async def step(data: bytes) -> None:
            await pool.run(hashing.update, data)
            await consume(data)
    else:
        step = consume  # type: ignore[assignment]
    await gather(body, step, block)
    check_size(digests, integrity)
    return digests, verify(digests, integrity)


def check_size(digests: Digests, integrity: Integrity) -> None:
    if integrity.expected_size is not None and digests.size != integrity.expected_size:
        raise IncompleteBody("You did not provide the number of bytes specified by the Content-Length HTTP header.")


def verify(writer: Digests, integrity: Integrity) -> Checksum | None:
    if integrity.payload_sha256 is not None and writer.sha256 is not None:
        if writer.sha256.hexdigest() != integrity.payload_sha256:
            raise PayloadHashMismatch(
                "The provided 'x-amz-content-sha256' header does not match what was computed."
            )
    if integrity.content_md5 is not None:
        if base64.b64encode(writer.md5.digest()).decode() != integrity.content_md5:
            raise BadDigest("The Content-MD5 you specified did not match what we received.")
    if writer.checksum is None:
        return None
    algorithm = writer.checksum.algorithm
    value = writer.checksum.b64()
    if integrity.checksum_value is not None:
        checksums.decode_digest(algorithm, integrity.checksum_value)
        if integrity.checksum_value != value:
            raise BadDigest(f"The {algorithm} you specified did not match the calculated checksum.")
    return Checksum(algorithm, value, "FULL_OBJECT")
