"""Read workers: more processes serving S3 on one port, one index writer.

Owns: a worker process (``worker.py``: hot GETs and HEADs answered in its
own process), the writer's side that starts, watches and stops them
(``supervisor.py``), the lookups the writer answers for them
(``lookup.py``) and the requests a worker passes on to the writer
(``forward.py``).

May import: ``app``, ``routes``, ``auth``, ``config``, ``handlers``,
``observability``, ``s3`` and ``serving``.
"""
