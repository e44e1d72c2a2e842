"""How the tiers behave: sizes, delays, thresholds. One frozen object,
built by the gateway from its configuration."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class TierSettings:
    hot_size: int = 64 * 1024 * MiB
    # Free bytes the hot tier leaves on its filesystem: eviction starts below
    # it and writes that would go below it are refused (0: no floor; the
    # gateway always sets one, tiering/hot/space.py).
    free_floor: int = 0
    # Bytes kept preallocated for the index to open and write on a full disk
    # (0: none; tiering/index/room.py).
    index_reserve: int = 0
    small_object_size: int = 4 * MiB  # at most this: packed into shared segments
    part_size: int = 8 * MiB  # larger objects are split into extents of this size
    segment_size: int = 64 * MiB  # target size of a packed segment
    flush_delay: float = 5.0  # longest a write waits before the flusher packs it
    compression: bool = True  # zstd per extent, kept only where it saves space
    compression_level: int = 3
    # Small cached pieces share append-only log files instead of a file
    # each (tiering/hot/logs.py); off only where a test needs files of their own.
    cache_logs: bool = True
    high_watermark: float = 0.90  # evict cached extents above this fraction of hot_size
    low_watermark: float = 0.80  # ... down to this one
    compact_threshold: float = 0.5  # rewrite segments whose live fraction falls below
    compact_interval: float = 60.0  # seconds between compaction passes
    # Large capacity-tier GETs (extents over 1 MiB, runs of neighbours) in
    # flight per node, and the pieces one read fetches ahead of the one it sends.
    fetch_concurrency: int = 8
    # Small capacity-tier GETs (extents of at most 1 MiB: small objects) in
    # flight per node. Many readers of small objects each wait one store
    # round trip, so they need many GETs at once; 64 of 1 MiB hold at most
    # 64 MiB, as 8 large ones of 8 MiB do.
    small_gets: int = 64
    # Decoded object records kept in memory (``tiering/index/record_cache.py``),
    # about 1 KiB each: a hot GET whose record is kept is answered on the
    # event loop, without a trip to the thread pool.
    record_cache: int = 100_000

    @property
    def store_connections(self) -> int:
        """Connections a store client keeps: every GET the reader lets
        through at once, and room for uploads and listings beside them."""
        return self.small_gets + 2 * self.fetch_concurrency
    write_through: bool = False  # the policy a new bucket gets
    # How long a write-through PUT waits for the flush: below the 60 s read
    # timeout of botocore and most S3 clients, so they see the 503.
    write_through_timeout: float = 50.0
    # Scale-out (tiering/cluster/cluster.py): with a node id, this node is one of
    # several over the same capacity store, the writer of the buckets whose
    # write lease it holds; without one, the only node.
    node_id: str | None = None
    lease_ttl: float = 30.0  # seconds a write lease lasts unless renewed
    lease_idle: float = 0.0  # seconds without a write after which a lease is given up (0: never)
    follow_interval: float = 2.0  # the least time between two rounds of following the other writers
    # Seconds between conditional reads of the follow head and the identities
    # document: what finds a change whose push was lost (tiering/cluster/head.py).
    follow_fallback: float = 30.0
    # With a node id: this node's S3 endpoint in the node registry
    # (tiering/cluster/members.py), which it then joins and follows. None: no
    # registry (the only gateway, or fixed --peers).
    advertise_url: str | None = None
    # Seconds between this node's heartbeats in the registry, and between its
    # listings of it (each jittered by 10%): a crash is seen by every node
    # within 2 heartbeats + 5 s + one listing (45 s by default). The listing
    # is the slower: its cost grows with the registry (a request per 1,000
    # nodes), a heartbeat's does not (tiering/cluster/members.py).
    heartbeat_interval: float = 10.0
    members_interval: float = 20.0
