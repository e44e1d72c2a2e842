"""The capacity tier: immutable named objects (segments) in an object store.

``store.py`` holds the contract (``CapacityStore``); ``open_capacity`` picks
a backend from a URL:

- ``file:///abs/dir``: ``LocalDirStore`` (``local.py``), files under a
  directory (the embedded default, and the reference backend for the
  contract tests);
- ``s3://bucket[/prefix]``: ``S3Store`` (``s3.py``) over aiobotocore (AWS
  S3, MinIO, Ceph RGW), imported only when asked for; its code table
  (``s3_answers.py``), lean ranged GETs (``s3_get.py``, ``http_get.py``,
  signed with ``sigv4.py``) and streamed multipart uploads
  (``s3_upload.py``).

``layout.py`` names segments in the store and reads their footers.

May import: the foundation modules of ``tiering`` (``errors``, ``meta``,
``settings``, ``pool``, ``files``) and ``packer``; nothing of the index or
the hot tier: a store knows names and bytes only.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from tiering.capacity.local import LocalDirStore
from tiering.capacity.store import TMP_PREFIX, CapacityStats, CapacityStore, CapacityUpload

__all__ = ["TMP_PREFIX", "CapacityStats", "CapacityStore", "CapacityUpload", "LocalDirStore", "open_capacity"]


def open_capacity(
    url: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    concurrency: int = 8,
    connections: int = 16,
    part_size: int = 8 * 1024 * 1024,
) -> CapacityStore:
    """The store named by ``url`` (not started yet).

    ``file:///abs/dir`` ignores the S3 settings; ``s3://bucket[/prefix]``
    uses them (``endpoint`` for MinIO/Ceph, credentials from the standard
    botocore chain when the keys are None)."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        # RFC 8089: file://host/path, percent-encoded; only the local host.
        path = unquote(parts.path)
        if (
            parts.netloc not in ("", "localhost")
            or not os.path.isabs(path)
            or parts.query
            or parts.fragment
        ):
            raise ValueError(f"capacity URL {url!r}: expected file:///absolute/dir")
        return LocalDirStore(path)
    if parts.scheme == "s3":
        if not parts.netloc or "@" in parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"capacity URL {url!r}: expected s3://bucket or s3://bucket/prefix")
        from tiering.capacity.s3 import S3Store

        return S3Store(
            parts.netloc,
            parts.path,
            endpoint=endpoint,
            region=region,
            access_key=access_key,
            secret_key=secret_key,
            concurrency=concurrency,
            connections=connections,
            part_size=part_size,
        )
    raise ValueError(f"capacity URL {url!r}: expected file:///dir or s3://bucket[/prefix]")
