"""Byte counts: the binary units and the parser for sizes such as ``512M``."""

from __future__ import annotations

import re
from decimal import Decimal

MiB = 1024**2
GiB = 1024**3

_SIZE = re.compile(r"(?P<num>\d+(?:\.\d+)?)\s*(?:(?P<unit>[KMGT])(?:I?B)?|B)?", re.IGNORECASE)
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Parse a byte count: ``"512M"`` -> 536870912.

    Accepts a plain integer or a number with a binary K/M/G/T suffix
    (1K = 1024), optionally followed by ``B`` or ``iB``; case does not matter.
    Fractions are allowed when they come to a whole number of bytes (``1.5G``).
    """
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"invalid size {text!r}: expected a number of bytes with an optional "
            "K, M, G or T suffix (binary, 1K = 1024), e.g. 512M or 64G"
        )
    value = Decimal(match["num"]) * _UNIT[(match["unit"] or "").upper()]
    if value != value.to_integral_value():
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)
