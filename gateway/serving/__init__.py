"""Sockets and the HTTP servers on them, below the S3 application.

Owns: listening sockets and uvicorn servers run the gateway's way
(``listener.py``), the bounds on clients below the app (``client_bounds.py``:
request heads, body deadlines), hot bodies sent from their files by the
kernel (``sendfile.py``), and the tuning every serving process applies
before it serves (``process.py``: event loop, malloc, gc, descriptors).

May import: ``config`` and ``s3``.
"""
