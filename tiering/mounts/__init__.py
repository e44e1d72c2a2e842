"""Mounted buckets: existing S3 data read through the hot tier.

Owns: the mounts and their reads (``buckets.py``), where each piece's
bytes come from (``pieces.py``: held, cached, arriving, fetched), mounted buckets as a
bucket backend (``backend.py``), the source bucket's client
(``source.py``), listing pages kept for a while (``listing_cache.py``),
background revalidation (``revalidate.py``) and multipart uploads passed
through to the source (``uploads.py``).

May import: the foundation modules of ``tiering``, ``model``,
``capacity``, ``index``, ``hot``, ``reads`` and ``cluster`` (peers).
"""
