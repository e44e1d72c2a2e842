"""Batch reads: many objects of one bucket answered as one stream.

Owns: the batch of a bucket (``reads.py``: looked up, fetched ahead, read),
its members (``member.py``), hot batches laid out whole (``hot.py``) and
the cold extents fetched ahead of the member being sent (``ahead.py``).

May import: the foundation modules of ``tiering``, ``model``, ``index``,
``hot``, ``reads`` and ``prefetch`` (a member's turn moves the epoch
readers, as a GET of it would).
"""
