"""The versioned segment format, sans-I/O: its public names in one place.

Importers use it whole (``from packer import format as seg``). The format is
split by what each part owns:

- packer/encoder.py: the byte layout, documented byte by byte beside the code
  that writes it; its versions, magics, sizes and bounds; ``SegmentEncoder``.
- packer/decoder.py: reading it back, trusting nothing (``check_header``,
  ``footer_range``, ``decode_footer``, ``decode_entry``, ``decode_segment``).
- packer/footer.py: the records a footer holds (``EntryRef``, ``Tombstone``,
  ``Footer``).

Only this module imports all three; none of them imports it.
"""

from __future__ import annotations

from packer.decoder import (
    check_header,
    decode_entry,
    decode_footer,
    decode_segment,
    footer_range,
)
from packer.encoder import (
    FOOTER_LEVEL,
    FOOTER_VERSION,
    HEADER_SIZE,
    MAGIC,
    MAX_FOOTER_RAW,
    READABLE_FOOTERS,
    TRAILER_MAGIC,
    TRAILER_SIZE,
    VERSION,
    SegmentEncoder,
)
from packer.footer import EntryRef, Footer, Tombstone

__all__ = [
    "FOOTER_LEVEL",
    "FOOTER_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_FOOTER_RAW",
    "READABLE_FOOTERS",
    "TRAILER_MAGIC",
    "TRAILER_SIZE",
    "VERSION",
    "EntryRef",
    "Footer",
    "SegmentEncoder",
    "Tombstone",
    "check_header",
    "decode_entry",
    "decode_footer",
    "decode_segment",
    "footer_range",
]
