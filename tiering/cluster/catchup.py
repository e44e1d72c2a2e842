"""Taking a bucket over: before a node that has just taken a bucket's lease
acknowledges a write, it applies every segment of the bucket's earlier
terms (and of term 0), seals each of those terms at the last segment it
applied, and deletes the uploads that landed after a seal. ``Cluster``
(``cluster.py``) calls it with its own apply and close steps, which
following shares.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tiering import pool
from tiering.capacity import CapacityStore
from tiering.capacity.layout import list_segments, segment_path
from tiering.cluster.terms import LEGACY, Seals, Terms, term_prefix
from tiering.index.db import Index
from tiering.index.keys import FOLLOW_CLOSED

log = logging.getLogger("tierstore.cluster")


@dataclass(frozen=True, slots=True)
class Earlier:
    """Where a bucket's earlier terms are read, recorded and sealed."""

    capacity: CapacityStore
    index: Index
    terms: Terms
    seals: Seals


async def catch_up(
    of: Earlier,
    bucket: str,
    term: int,
    apply: Callable[[str, int], Awaitable[None]],
    close: Callable[[int, str | None, bool], Awaitable[bool]],
) -> None:
    """Apply every segment of term 0 and of ``bucket``'s terms before
    ``term`` (we hold the lease: no valid one can appear any more), seal
    each, and delete the uploads that landed after a seal."""
    await of.terms.refresh()
    earlier = [LEGACY] + [t for t in of.terms.of(bucket) if t < term]
    points = await pool.run(of.index.follow_points)
    for ended in earlier:
        seal = await of.seals.get(ended)
        last = points.get(ended, "")
        if last == FOLLOW_CLOSED:  # applied: only late uploads can be left to remove
            last = seal or ""
        late = []
        async for name, size in list_segments(of.capacity, last, term_prefix(ended)):
            if seal is not None and name > seal:
                late.append(name)
                continue
            await apply(name, size)
            last = name
        complete = seal is not None  # sealed before the listing
        if seal is None:
            seal = await of.seals.write(ended, last)
        for name in late:
            if ended != LEGACY:  # term 0's late segments may be any bucket's: left alone
                log.info("removing segment %s, written after term %d was sealed", name, ended)
                await of.capacity.delete(segment_path(name))
        await close(ended, of.terms.bucket(ended), complete)
