"""Managed buckets: objects this gateway lays out itself, packed into
segments in the capacity tier.

Owns: managed buckets as a bucket backend (``backend.py``), taking bodies
in and committing them (``staging.py``) and multipart uploads
(``multipart.py``).

May import: the foundation modules of ``tiering``, ``model``,
``capacity``, ``index``, ``hot``, ``reads``, ``cluster`` and
``maintenance``.
"""
