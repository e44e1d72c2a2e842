"""The hot tier: object bytes in files on the node's local disk.

Owns: ``HotTier`` (``tier.py``: the byte budget, staged and cached files),
its start and stop (``restart.py``: the clean-shutdown marker, the sweep),
the free-space floor (``space.py``: the filesystem's free space as a
watermark, refusals by cause), writing staged files (``staged.py``),
eviction passes (``eviction.py``) and their order (``sieve.py``: SIEVE, or
an advisor's hints), descriptors kept open between reads
(``open_files.py``), and fills that cache bytes behind the answers that
carried them (``fills.py``).

May import: the foundation modules of ``tiering`` and ``model``. The hot
tier knows files, never the index or a store.
"""
