"""The lean HTTP clients of benchmarks/compare.py: one keep-alive connection
per thread, SigV4 by ``tests.integration.oracle.RawReader`` (a cached signing
key, a few lines of hashing) for the S3 servers, nothing for nginx.

boto3 spends about 4 ms of client CPU a request, which caps one Python
process near 200 objects/s on this machine: with it, every server would look
the same. These clients cost a tenth of that.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from http.client import HTTPConnection
from urllib.parse import quote
from xml.sax.saxutils import unescape

from _common import ACCESS_KEY, REGION, SECRET_KEY  # first: puts the repo root on sys.path
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.integration.oracle import RawReader

_KEY = re.compile(rb"<Key>([^<]*)</Key>")
_TOKEN = re.compile(rb"<NextContinuationToken>([^<]*)</NextContinuationToken>")


@dataclass(frozen=True)
class _Target:
    """What RawReader needs of a server: its port on 127.0.0.1."""

    port: int


class SignedClient:
    """GET and PUT with SigV4 (the benchmark's fixed keys), one connection
    per thread. Range and other unsigned headers may be added."""

    signed = True

    def __init__(self, port: int) -> None:
        self.port = port
        self._raw = RawReader(_Target(port), region=REGION)  # type: ignore[arg-type]

    def get(self, bucket: str, key: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        status, _, body = self._raw.request("GET", bucket, key, headers=headers)
        return status, body

    def put(self, bucket: str, key: str, data: bytes) -> int:
        return self._raw.request("PUT", bucket, key, data)[0]

    def post(self, bucket: str, query: str, data: bytes) -> tuple[int, bytes]:
        """``POST /{bucket}?{query}`` (names and values that need no escaping)."""
        status, _, body = self._raw.request("POST", bucket, "", data, query=query)
        return status, body


class PlainClient:
    """Unsigned GETs of /bucket/key (nginx serving files), one connection
    per thread."""

    signed = False

    def __init__(self, port: int) -> None:
        self.port = port
        self._local = threading.local()

    def get(self, bucket: str, key: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        path = "/" + bucket + "/" + quote(key, safe="/-_.~")
        for attempt in (1, 2):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = HTTPConnection("127.0.0.1", self.port, timeout=120)
            try:
                conn.request("GET", path, headers=headers or {})
                response = conn.getresponse()
                return response.status, response.read()
            except (ConnectionError, OSError):  # a keep-alive connection the server closed
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def list_keys(port: int, bucket: str, prefix: str, page: int = 1000) -> tuple[int, int]:
    """Every key under ``prefix``, by signed ListObjectsV2 pages of ``page``
    keys over one connection, bodies scanned for keys only; (keys, pages)."""
    signer = S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION)
    conn = HTTPConnection("127.0.0.1", port, timeout=300)
    keys = pages = 0
    params = {"list-type": "2", "max-keys": str(page), "prefix": prefix}
    try:
        while True:
            query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                             for k, v in sorted(params.items()))
            target = f"/{bucket}?{query}"
            request = AWSRequest(method="GET", url=f"http://127.0.0.1:{port}{target}")
            signer.add_auth(request)
            conn.request("GET", target, headers=dict(request.headers.items()))
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"list {bucket}/{prefix} on :{port}: {response.status} {body[:300]!r}")
            keys += len(_KEY.findall(body))
            pages += 1
            token = _TOKEN.search(body)
            if token is None:
                return keys, pages
            params["continuation-token"] = unescape(token.group(1).decode())
    finally:
        conn.close()
