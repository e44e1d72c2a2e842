"""Byte ranges with an exclusive end.

HTTP speaks inclusive ``bytes=first-last``; the gateway converts once, at the
edge, and every layer below works with half-open ``[start, end)`` ranges.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ByteRange:
    """The half-open byte interval ``[start, end)``."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"bad byte range [{self.start}, {self.end})")

    @property
    def length(self) -> int:
        return self.end - self.start

    def intersect(self, other: ByteRange) -> ByteRange | None:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return ByteRange(start, end) if start < end else None


def split_over(sizes: list[int] | tuple[int, ...], wanted: ByteRange) -> Iterator[tuple[int, ByteRange]]:
    """Yield ``(index, range within piece)`` for each piece of a concatenation
    of pieces with the given sizes that overlaps ``wanted``, in order."""
    offset = 0
    for index, size in enumerate(sizes):
        piece = ByteRange(offset, offset + size)
        overlap = piece.intersect(wanted)
        if overlap is not None:
            yield index, ByteRange(overlap.start - offset, overlap.end - offset)
        offset += size
        if offset >= wanted.end:
            return
