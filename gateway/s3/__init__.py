"""The S3 wire protocol, apart from authentication: what a request and an
answer look like on the wire.

Owns: the request and response types of the raw-ASGI data plane
(``http.py``), the one table from failure to S3 code and status
(``errors.py``), the headers S3 gives meaning to (``headers.py``: ranges,
dates, metadata), all S3 XML (``xml.py``), request bodies
(``body.py``: framing, digests, lengths) with the aws-chunked decoder
(``chunked.py``), and the streaming tar writer of batch answers
(``tar.py``).

May import: nothing else of gateway/; tiering's errors and types.
"""
