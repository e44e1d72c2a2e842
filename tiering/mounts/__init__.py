"""Mounted buckets: existing S3 data read through the hot tier (``buckets.py``),
the source bucket's client (``source.py``), listing pages kept for a while
(``listing_cache.py``) and multipart uploads passed through (``uploads.py``)."""
