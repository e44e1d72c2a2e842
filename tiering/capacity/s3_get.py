"""Ranged GETs to the capacity store, signed here, on kept-alive connections.

A cold read is one ranged GET, and botocore spends 2.5 to 3 ms of CPU on
each (its hooks, endpoint resolution, request and response models), three
times what the same GET costs on aiohttp with a cached SigV4 key. This is
that GET and nothing else: path-style addressing on a configured endpoint
(MinIO, Ceph RGW, any S3-compatible store), GET with Range and If-Match.
Everything else, and every request to AWS itself (region redirects,
virtual-hosted names), stays on botocore.

The answer has the shape of aiobotocore's ``get_object`` (``Body``,
``ContentRange``, ``ResponseMetadata``) and a refusal raises botocore's
``ClientError`` with the code and status of the store's error document, so
``S3Store._call`` applies one retry and error policy to both. Transport
failures surface as aiohttp errors, ``asyncio.TimeoutError`` or ``OSError``,
which that policy retries.
"""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

import aiohttp
from botocore.exceptions import ClientError
from yarl import URL

from tiering.sigv4 import EMPTY_SHA256, credential_scope, signature, signing_key, string_to_sign

# An S3 error document's two fields; read with a pattern, not an XML parser,
# from at most the first few KiB of a body the store (or a proxy) sent.
_CODE = re.compile(rb"<Code>([^<]{1,256})</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]{0,2048})</Message>")
_ERROR_PREFIX = 8192


class Keys(NamedTuple):
    """One frozen set of credentials: botocore's ReadOnlyCredentials has this shape."""

    access_key: str
    secret_key: str
    token: str | None


class _Body:
    """The bytes already read, behind the ``async with body: await body.read()``
    protocol of aiobotocore's streaming body."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aenter__(self) -> _Body:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def read(self) -> bytes:
        return self._data


class LeanGetter:
    """``get_object(Bucket=, Key=, Range=, IfMatch=)`` for one bucket on one endpoint."""

    def __init__(
        self,
        endpoint: str,
        region: str,
        keys: Callable[[], Awaitable[Keys]],
        *,
        connections: int,
        connect_timeout: float,
        read_timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``tls``: how an https endpoint is verified (default: the system's CAs)."""
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"capacity endpoint {endpoint!r} is not an http(s) URL")
        default_port = 443 if parts.scheme == "https" else 80
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        # What aiohttp sends as Host (the port only when not the scheme's
        # default) is what is signed: it is set explicitly below.
        self._host = host if parts.port in (None, default_port) else f"{host}:{parts.port}"
        self._origin = f"{parts.scheme}://{self._host}"
        self._base_path = parts.path.rstrip("/")
        self._region = region
        self._keys = keys
        self._connections = connections
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._tls: ssl.SSLContext | bool = True if tls is None else tls

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections, ttl_dns_cache=60, ssl=self._tls),
                timeout=self._timeout,
                auto_decompress=False,
                trust_env=True,  # HTTP(S)_PROXY and NO_PROXY, as botocore honours them
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def get_object(
        self, *, Bucket: str, Key: str, Range: str, IfMatch: str | None = None,  # noqa: N803  botocore's names
        extra: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """``extra`` headers go out unsigned (not ``x-amz-*`` ones: S3 wants those signed)."""
        if self._session is None:
            raise RuntimeError("the capacity getter is not started")
        path = f"{self._base_path}/{quote(Bucket, safe='')}/{quote(Key, safe='/-_.~')}"
        headers = self.sign(path, Range, IfMatch, await self._keys(), time.gmtime())
        if extra:
            headers.update(extra)
        async with self._session.get(URL(self._origin + path, encoded=True), headers=headers,
                                     allow_redirects=False) as response:
            data = await response.read()
            status = response.status
            content_range = response.headers.get("Content-Range")
            length = response.headers.get("Content-Length")
        if status >= 300:
            code, message = _error_fields(data)
            raise ClientError(
                {"Error": {"Code": code or str(status), "Message": message},
                 "ResponseMetadata": {"HTTPStatusCode": status}},
                "GetObject",
            )
        if length is not None and length.isdigit() and int(length) != len(data):
            raise aiohttp.ClientPayloadError(f"body of {len(data)} bytes, Content-Length {length}")
        answer: dict[str, Any] = {"Body": _Body(data), "ResponseMetadata": {"HTTPStatusCode": status}}
        if content_range is not None:
            answer["ContentRange"] = content_range
        return answer

    def sign(self, path: str, byte_range: str, if_match: str | None, keys: Keys, now: time.struct_time) -> dict[str, str]:
        """The headers of one signed GET of ``path`` (already percent-encoded)."""
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", now)
        date = amz_date[:8]
        headers = {"host": self._host}
        if if_match is not None:
            headers["if-match"] = if_match
        headers["range"] = byte_range
        headers["x-amz-content-sha256"] = EMPTY_SHA256
        headers["x-amz-date"] = amz_date
        if keys.token:
            headers["x-amz-security-token"] = keys.token
        signed = ";".join(headers)  # inserted in sorted order
        canonical_headers = "".join(f"{name}:{' '.join(value.split())}\n" for name, value in headers.items())
        canonical = f"GET\n{path}\n\n{canonical_headers}\n{signed}\n{EMPTY_SHA256}"
        scope = credential_scope(date, self._region)
        key = signing_key(keys.secret_key, date, self._region)
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={keys.access_key}/{scope}, SignedHeaders={signed}, "
            f"Signature={signature(key, string_to_sign(amz_date, scope, canonical))}"
        )
        return headers


def _error_fields(body: bytes) -> tuple[str, str]:
    """Code and Message of an S3 error document; empty when there is none
    (a HEAD-like empty body, a proxy's HTML page)."""
    head = body[:_ERROR_PREFIX]
    code, message = _CODE.search(head), _MESSAGE.search(head)
    return (code[1].decode("utf-8", "replace") if code else "",
            message[1].decode("utf-8", "replace") if message else "")
