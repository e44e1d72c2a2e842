"""The S3 object model: what an object, a request and a read are, as S3
states them, whoever stores the bytes.

Owns: conditional requests (``conditions.py``), additional checksums and
the digests computed over a body (``checksums.py``, ``digests.py``), what a
client hands in with a body (``inputs.py``), bucket and key names
(``names.py``), tags (``tags.py``), bucket versioning (``versions.py``) and
the rules of multipart uploads (``uploads.py``).

May import: only the foundation modules of ``tiering`` (``errors``,
``meta``, ``settings``, ``pool``, ``files``, ``jobs``, ``memo``) and
``packer``. Nothing here touches the index, the hot tier or a store.
"""
