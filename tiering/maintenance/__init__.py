"""The background work on the capacity tier, and the checks and repairs of
a node.

Owns: ``Tiers`` (``tiers.py``: the store, the extent reader, the flusher
and compactor, started and stopped together), the flusher (``flush.py``),
compaction (``compact.py``), their rounds that a cancelled caller does
not cut short and shutdown ends (``rounds.py``), building segments
(``segments.py``), evict and pin jobs (``residency.py``), free space kept
above the floor in the background and the index's reserve made again
(``space.py``), the data directory check (``fsck.py``) and rebuilding the
namespace from segment footers (``recover.py``).

May import: the foundation modules of ``tiering``, ``model``,
``capacity``, ``index``, ``hot``, ``reads`` and ``cluster``.
"""
