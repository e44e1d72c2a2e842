"""CRC32C, and the checksum over an extent's stored bytes.

Segments written with footer version 3 or later carry CRC32C (the
Castagnoli polynomial), which this CPU computes with its own instructions:
about 0.16 ms per 8 MiB against 2.0 ms for zlib's CRC32, so a 256 MiB
object costs 5 ms of checking on each flush and each cold read instead of
65 ms. Older segments carry zlib's CRC32 and are read as they are. Both are
32-bit CRCs: each catches every error burst up to 32 bits.

Two libraries compute CRC32C with the CPU's instruction, and differ in the
GIL. The CRT (awscrt) lets it go for all but the shortest calls; google-crc32c
holds it. Letting it go is right for a long buffer (other threads run
meanwhile) and wrong for a short one: taking the GIL back waits for
whichever thread took it, up to the interpreter's switch interval. Beside
a thread busy in Python, a 64 KiB CRC took 610 us of wall time through
the CRT and 4.2 us through google-crc32c (alone about 1.4-2.2 and 2.5-4.9
us: google-crc32c is the slower alone). In the gateway the fills' writer
computes one for every cached piece while the event loop runs, and each
time waited for the loop to give the GIL back. So CRCs of less than
``HOLD_BELOW`` bytes (at most about 10-20 us of work, what a thread may
keep the event loop waiting) hold the GIL, longer ones (and views, which
google-crc32c does not take) let it go.

``running`` carries a CRC over consecutive pieces: the CRC of ``a + b`` is
``crc32c(b, crc32c(a))``.
"""

from __future__ import annotations

import zlib

import google_crc32c
from awscrt.checksums import crc32c as _crc32c_released

HOLD_BELOW = 256 * 1024
# Without its compiled extension google-crc32c computes in Python: far
# slower than letting the GIL go.
_HOLDS = google_crc32c.implementation == "c"


def crc32c(data: bytes | bytearray | memoryview, running: int = 0) -> int:
    """The CRC32C of ``data`` after ``running``; the GIL held for short
    ``bytes`` (google-crc32c takes no other type)."""
    if _HOLDS and type(data) is bytes and len(data) < HOLD_BELOW:
        return google_crc32c.extend(running, data)  # type: ignore[no-any-return]
    return _crc32c_released(data, running)


def extent_crc(data: bytes | bytearray | memoryview, crc32c_kind: bool, running: int = 0) -> int:
    """The CRC of ``data``: CRC32C if ``crc32c_kind``, else zlib's CRC32."""
    return crc32c(data, running) if crc32c_kind else zlib.crc32(data, running)
