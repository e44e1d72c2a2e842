"""Byte counts: the binary units, the parser for sizes such as ``512M`` and
the way sizes are shown back (``8.0 MiB``)."""

from __future__ import annotations

import re
from decimal import Decimal

MiB = 1024**2
GiB = 1024**3

_SIZE = re.compile(r"(?P<num>\d+(?:\.\d+)?)\s*(?:(?P<unit>[KMGT])(?:I?B)?|B)?", re.IGNORECASE)
NONE = "-"  # what stands for a size that is missing
_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")
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


def size(value: object) -> str:
    """Bytes in binary units, as sizes are given to the gateway: ``8.0 MiB``."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return NONE
    if abs(value) < 1024:
        return f"{value:g} B"
    for unit in _UNITS:
        value /= 1024
        if abs(value) < 1024 or unit == _UNITS[-1]:
            break
    return f"{value:.1f} {unit}"
