"""Per-extent compression: zstd, only when it pays.

Training data is often already compressed (JPEG, PNG, parquet pages, tar.gz),
so the encoder first compresses a small probe and gives up early when it saves
too little; such data then costs a few hundred microseconds, not a full pass.

zstandard compressor and decompressor objects are not thread-safe and these
functions run in a thread pool, so each thread keeps its own, in a
``threading.local``; creating them per call would allocate a fresh context
(hundreds of KiB) per extent.

Frames carry no zstd checksum: the segment format checksums the stored bytes
of every extent, which also catches a flipped literal that would decode.
"""

from __future__ import annotations

import threading
from typing import Final

import zstandard

from packer.errors import CorruptData

NONE: Final = "none"
ZSTD: Final = "zstd"
CODECS: Final[frozenset[str]] = frozenset({NONE, ZSTD})

# Below this, a zstd frame header (>= 9 bytes) eats most of any saving.
MIN_COMPRESS_SIZE: Final = 64
# The probe: data whose first PROBE_SIZE bytes do not compress is stored as is.
# The head of a file is a fair sample for the formats we see (media, archives);
# a file compressible only past its head is stored raw, which is merely larger.
PROBE_SIZE: Final = 64 * 1024

_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    compressor = cache.get(level)
    if compressor is None:
        # write_content_size lets decode() check the length before allocating.
        compressor = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    decompressor: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def _as_bytes_view(data: bytes | memoryview) -> bytes | memoryview:
    # len() of a memoryview counts items, not bytes; normalise to unsigned bytes.
    return data if isinstance(data, bytes) else memoryview(data).cast("B")


def _saves(raw: int, stored: int, min_saving: float) -> bool:
    return raw - stored >= min_saving * raw


def compress(data: bytes | memoryview, level: int = 3) -> bytes:
    """One zstd frame of ``data``, with its content size; no pays-off check."""
    return _compressor(level).compress(_as_bytes_view(data))


def encode(data: bytes | memoryview, level: int = 3, min_saving: float = 0.05) -> tuple[str, bytes]:
    """Return ``(codec, stored bytes)`` for ``data``.

    ``ZSTD`` only when the frame saves at least ``min_saving`` of the raw
    length; otherwise ``NONE`` and the data unchanged.
    """
    view = _as_bytes_view(data)
    raw = len(view)
    if raw < MIN_COMPRESS_SIZE:
        return NONE, bytes(view)
    compressor = _compressor(level)
    if raw > PROBE_SIZE and not _saves(
        PROBE_SIZE, len(compressor.compress(view[:PROBE_SIZE])), min_saving
    ):
        return NONE, bytes(view)
    stored = compressor.compress(view)
    if _saves(raw, len(stored), min_saving):
        return ZSTD, stored
    return NONE, bytes(view)


def content_size(stored: bytes | memoryview) -> int | None:
    """The decoded size a zstd frame header declares, or None if it does not."""
    try:
        size = zstandard.frame_content_size(_as_bytes_view(stored))
    except zstandard.ZstdError as exc:
        raise CorruptData(f"bad zstd frame header: {exc}") from exc
    return None if size < 0 else size


def decode(codec: str, stored: bytes | memoryview, raw_length: int) -> bytes:
    """Return exactly ``raw_length`` decoded bytes or raise CorruptData."""
    view = _as_bytes_view(stored)
    if codec == NONE:
        if len(view) != raw_length:
            raise CorruptData(f"stored {len(view)} bytes, expected {raw_length}")
        # bytes are immutable: hand them on as they are (an extent is MiBs).
        return stored if type(stored) is bytes else bytes(view)
    if codec != ZSTD:
        raise CorruptData(f"unknown codec {codec!r}")
    # zstandard ignores max_output_size when the frame declares its size and
    # allocates whatever the header says, so a hostile header is refused here.
    declared = content_size(view)
    if declared is not None and declared != raw_length:
        raise CorruptData(f"zstd frame declares {declared} bytes, expected {raw_length}")
    try:
        # max_output_size=0 means "unbounded" to zstandard, hence the max(.., 1).
        raw = _decompressor().decompress(
            view, max_output_size=max(raw_length, 1), allow_extra_data=False
        )
    except zstandard.ZstdError as exc:
        raise CorruptData(f"zstd: {exc}") from exc
    if len(raw) != raw_length:
        raise CorruptData(f"decoded {len(raw)} bytes, expected {raw_length}")
    return raw
