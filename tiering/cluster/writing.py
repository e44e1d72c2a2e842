"""Which buckets this node may write segments for, and how it names them.

The flusher and the compactor ask this, never the cluster directly: a
gateway alone writes every bucket into mixed segments named from its
index's counter (``SoleWriter``); one of several writes only the buckets
whose write lease it holds, one bucket per segment, named in that lease's
term (``tiering.cluster.cluster.Cluster``).
"""

from __future__ import annotations

from typing import Protocol

from tiering import pool
from tiering.index.db import Index


class Writing(Protocol):
    per_bucket: bool  # True: a segment holds one bucket's data and records

    def may_write(self, bucket: str) -> bool:
        """True while this node may write segments for ``bucket``."""
        ...

    def check(self, bucket: str, segment: str | None = None) -> None:
        """Raise NotWriter or ServiceUnavailable unless ``may_write``, and,
        given ``segment``, unless the lease is still in the term that named
        it (a lease lost and taken again has a new term)."""
        ...

    async def name(self, bucket: str) -> str:
        """A new segment name for data of ``bucket``."""
        ...

    def compactable(self, segment: str) -> bool:
        """True if this node may rewrite or delete ``segment``."""
        ...

    def bucket_of(self, segment: str) -> str | None:
        """The bucket a per-bucket segment holds (None: mixed)."""
        ...

    def committed(self, bucket: str, segment: str) -> None:
        """``segment`` of ``bucket`` is committed: the other nodes may
        follow it (told once per flush, not per segment)."""
        ...

    def deleted(self, bucket: str, count: int) -> None:
        """Compaction deleted ``count`` segments of ``bucket`` from the store."""
        ...


class SoleWriter:
    """A gateway alone over its capacity store: it writes everything."""

    per_bucket = False

    def __init__(self, index: Index) -> None:
        self._index = index

    def may_write(self, bucket: str) -> bool:
        return True

    def check(self, bucket: str, segment: str | None = None) -> None:
        return None

    async def name(self, bucket: str) -> str:
        return await pool.run(self._index.new_segment_name)

    def compactable(self, segment: str) -> bool:
        return True

    def bucket_of(self, segment: str) -> str | None:
        return None

    def committed(self, bucket: str, segment: str) -> None:
        return None  # nobody follows

    def deleted(self, bucket: str, count: int) -> None:
        return None
