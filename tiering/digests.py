"""The digests computed over a body while it is written, wherever it goes."""

from __future__ import annotations

import hashlib

from tiering.checksums import Hasher, new_hasher


class Digests:
    """MD5 (the ETag), the client's requested checksum, and SHA-256 when the
    payload was signed: updated once per block, read after the body ends."""

    __slots__ = ("checksum", "md5", "sha256", "size")

    def __init__(self, checksum_algorithm: str | None = None, sha256: bool = False) -> None:
        self.md5 = hashlib.md5()
        self.checksum: Hasher | None = new_hasher(checksum_algorithm) if checksum_algorithm else None
        self.sha256 = hashlib.sha256() if sha256 else None
        self.size = 0

    def update(self, data: bytes | memoryview) -> None:
        self.md5.update(data)
        if self.checksum is not None:
            self.checksum.update(data)
        if self.sha256 is not None:
            self.sha256.update(data)
        self.size += len(data)
