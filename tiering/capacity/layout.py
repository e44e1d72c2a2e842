"""Where segments live in the capacity store: their names, their listing,
and how a segment's footer is read back.

Every part of the node that names a segment (the flusher and compactor that
write them, the reader that fetches extents, recovery and the followers that
read footers) names it here, so the store's layout is stated once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from packer import format as seg
from tiering.capacity.store import CapacityStore

SEGMENTS = "segments/"
_TAIL = 256 * 1024  # first guess at footer + trailer size


def segment_path(name: str) -> str:
    """The capacity-store name of a segment."""
    return SEGMENTS + name


async def list_segments(
    capacity: CapacityStore, after: str = "", prefix: str = ""
) -> AsyncIterator[tuple[str, int]]:
    """``(segment name, size)`` of the store's segments in name order, those
    after the segment ``after`` if given, those whose name starts with
    ``prefix`` (hex digits) if given."""
    after_path = segment_path(after) if after else ""
    async for path, size in capacity.list(SEGMENTS + prefix, after=after_path):
        yield path[len(SEGMENTS):], size


async def read_footer(capacity: CapacityStore, name: str) -> seg.Footer:
    """A segment's footer, in one ranged GET (two for very large footers)."""
    tail, size = await capacity.get_tail(segment_path(name), _TAIL)
    span = seg.footer_range(size, tail[-seg.TRAILER_SIZE:])
    if span.start < size - len(tail):
        tail = await capacity.get_range(segment_path(name), span.start, size)
    return seg.decode_footer(tail, size)
