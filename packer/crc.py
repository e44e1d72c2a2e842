"""The checksum over an extent's stored bytes.

Segments written with footer version 3 or later carry CRC32C (the
Castagnoli polynomial), which this CPU computes with its own instructions:
about 0.16 ms per 8 MiB against 2.0 ms for zlib's CRC32, so a 256 MiB
object costs 5 ms of checking on each flush and each cold read instead of
65 ms. Older segments carry zlib's CRC32 and are read as they are. Both are
32-bit CRCs: each catches every error burst up to 32 bits.

``running`` carries a CRC over consecutive pieces: the CRC of ``a + b`` is
``extent_crc(b, kind, extent_crc(a, kind))``.
"""

from __future__ import annotations

import zlib

from awscrt.checksums import crc32c as _crc32c


def extent_crc(data: bytes | bytearray | memoryview, crc32c: bool, running: int = 0) -> int:
    """The CRC of ``data``: CRC32C if ``crc32c``, else zlib's CRC32."""
    return _crc32c(data, running) if crc32c else zlib.crc32(data, running)
