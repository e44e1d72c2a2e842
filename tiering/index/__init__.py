"""The metadata index: the node's source of truth, in rocksdict.

Owns: the ``Index`` (``db.py``) and the records mixed into it: object
versions (``versions.py``), multipart uploads (``uploads.py``), the
capacity tier's flush queue, segments and footers (``tiers.py``), node-local
mounts and pins (``local.py``); the key layout (``keys.py``), decoded
records kept in memory (``record_cache.py``), write generations shared with
read workers (``generations.py``), per-bucket layout settings and pins
(``bucket_settings.py``), and the index's room on disk: its reserve file,
the checks before each write, opening and reopening the database on a
full disk (``room.py``).

May import: the foundation modules of ``tiering`` and ``model``. The index
knows records (and its own reserve file), never the hot tier's files or
stores.
"""
