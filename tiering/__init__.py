"""The namespace and the tiers, below the HTTP edge.

Rooms, each a subpackage whose docstring says what it owns and what it may
import (``tests/unit/test_layers.py`` holds the directions):

- ``model``: the S3 object model (conditions, checksums, names, versions,
  multipart rules): no I/O;
- ``capacity``: the capacity stores and the layout of segments in them;
- ``index``: the metadata index (rocksdict) and its records;
- ``hot``: the hot tier's files, descriptors and eviction;
- ``reads``: the read plan, extent fetches, read-ahead;
- ``cluster``: leases, terms, following, peers;
- ``maintenance``: flush, compaction, residency jobs, check, recovery;
- ``mounts``: existing S3 buckets read through;
- ``prefetch``: epoch hints and warm jobs;
- ``batch``: many objects as one stream;
- ``managed``: buckets this gateway lays out itself.

The foundation modules beside them are imported by every room: ``errors``
(the one exception hierarchy), ``meta`` (core value types), ``settings``,
``pool`` (the bounded thread pool), ``jobs``, ``files`` and ``memo``.
On top, ``objects`` is the object service the gateway calls, and ``node``
builds one node's tiering in one place.
"""
