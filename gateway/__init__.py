"""tierstore's gateway: the S3 and admin HTTP front of a node, and the
trainer-side client.

Top level: the S3 data plane's application (``app.py``) and operation
table (``routes.py``), the process's root object (``node.py``), opening
the node's storage (``storage.py``), process start-up (``server.py``),
``python -m gateway`` (``__main__.py``) and the version (``version.py``).
Everything else lives in rooms, each a package whose docstring says what it
owns and what it may import: ``client`` (runs inside a training job,
imports nothing of the server), ``config``, ``s3`` (the wire protocol),
``auth``, ``observability``, ``serving``, ``handlers``, ``admin``,
``workers`` and ``cli``. tests/unit/test_layers.py holds the directions.

This package imports nothing itself: ``import gateway.client`` loads the
client alone.
"""
