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

import contextlib
import hashlib
import html
import re
import ssl
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import quote, unquote_plus, urlsplit

import aiohttp
from botocore.exceptions import ClientError
from yarl import URL

from tiering import pool
from tiering.capacity.http_get import ConnectionBudget, HttpGetPool
from tiering.capacity.s3_answers import BadBody, http_date, parse_content_range
from tiering.capacity.sigv4 import (
    EMPTY_SHA256,
    credential_scope,
    signature,
    signing_key,
    string_to_sign,
)
from tiering.capacity.store import Into, pour

# An S3 error document's two fields; read with a pattern, not an XML parser,
# from at most the first few KiB of a body the store (or a proxy) sent.
_CODE = re.compile(rb"<Code>([^<]{1,256})</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]{0,2048})</Message>")
_ERROR_PREFIX = 8192
# Bytes asked of a botocore body at a time when it is read as it arrives.
_BODY_PIECE = 256 * 1024

# Asked once a GET's answer (under 300) has its head: (status, its
# Content-Range or None) -> where its body goes, or None to collect it whole.
BodyTo = Callable[[int, str | None], Into | None]


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
        budget: ConnectionBudget | None = None,
    ) -> None:
        """``tls``: how an https endpoint is verified (default: the system's CAs).
        ``budget``: open connections counted with other getters' (not
        through a proxy, where aiohttp keeps ``connections`` of its own)."""
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
        self._proxy = env_proxy(parts.scheme, parts.hostname)
        # Without a proxy, GETs go over connections of our own (http_get.py).
        self._http: HttpGetPool | None = None
        self._address = (parts.hostname, parts.port or default_port)
        self._https = parts.scheme == "https"
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self._budget = budget

    async def start(self) -> None:
        if self._proxy is None:
            if self._http is None:
                tls = None
                if self._https:
                    tls = self._tls if isinstance(self._tls, ssl.SSLContext) else ssl.create_default_context()
                self._http = HttpGetPool(*self._address, tls=tls, connections=self._connections,
                                         connect_timeout=self._connect_timeout, read_timeout=self._read_timeout,
                                         budget=self._budget)
            return
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections, ttl_dns_cache=60, ssl=self._tls),
                timeout=self._timeout,
                auto_decompress=False,
                # The proxy from the environment is looked up once (env_proxy);
                # aiohttp's trust_env would do it per request, in a thread,
                # and read ~/.netrc each time: 250 us of CPU per GET here.
                trust_env=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            )

    async def close(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            http.close()
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def get_object(
        self, *, Bucket: str, Key: str, Range: str, IfMatch: str | None = None,  # noqa: N803  botocore's names
        extra: Mapping[str, str] | None = None, ChecksumMode: str | None = None,  # noqa: N803
    ) -> dict[str, Any]:
        """``extra`` headers go out unsigned (not ``x-amz-*`` ones: S3 wants
        those signed). ``ChecksumMode="ENABLED"``: the store is asked for the
        object's checksum (``ChecksumCRC32`` ... in the answer, where it has one)."""
        status, received, data = await self._get_object(Bucket, Key, Range, IfMatch, extra,
                                                        ChecksumMode == "ENABLED")
        answer = _described(received)
        answer["Body"] = _Body(data)
        answer["ResponseMetadata"] = {"HTTPStatusCode": status}
        return answer

    async def get_headed(
        self, *, Bucket: str, Key: str, Range: str, ChecksumMode: str | None = None,  # noqa: N803  botocore's names
        extra: Mapping[str, str] | None = None,
    ) -> tuple[Mapping[str, str], bytes]:
        """As ``get_object``, the answer's headers as they came (names in
        lower case) instead of botocore's fields, and the body: a mounted
        object's cold read describes it from them (``source_object``), with
        no botocore-shaped answer made in between."""
        _, received, data = await self._get_object(Bucket, Key, Range, None, extra, ChecksumMode == "ENABLED")
        if type(received) is not dict:  # aiohttp's, through a proxy: names as sent
            received = {name.lower(): value for name, value in received.items()}
        return received, data

    async def get_bytes(
        self, *, Bucket: str, Key: str, Range: str, IfMatch: str | None = None,  # noqa: N803  botocore's names
        extra: Mapping[str, str] | None = None,
    ) -> bytes:
        """As ``get_object``, the body alone: nothing of the answer's headers
        is described (a peer's piece of a known version needs none)."""
        return (await self._get_object(Bucket, Key, Range, IfMatch, extra, False))[2]

    async def get_into(self, *, Bucket: str, Key: str, Range: str, body_to: BodyTo,  # noqa: N803
                       IfMatch: str | None = None) -> bytes | None:  # noqa: N803
        """A ranged GET whose body goes, as it arrives, into the ``Into``
        that ``body_to`` names once the answer's head is in (None: the body
        is returned whole instead). An answer of 300 or more raises
        ClientError, as ``get_object`` does (412 for an ``IfMatch`` that
        does not hold)."""
        if self._session is None and self._http is None:
            raise RuntimeError("the capacity getter is not started")
        path = self._path(Bucket, Key)
        headers = self.sign(path, "", Range, IfMatch, await self._keys(), time.gmtime())
        if self._http is not None:
            status, _, data = await self._http.get(
                path, headers, on_head=lambda status, received: body_to(status, received.get("content-range")))
        else:
            assert self._session is not None
            url = URL(self._origin + path, encoded=True)
            async with self._session.get(url, headers=headers, allow_redirects=False,
                                         proxy=self._proxy) as response:
                status = response.status
                into = body_to(status, response.headers.get("Content-Range")) if status < 300 else None
                if into is None:
                    data = await response.read()
                else:
                    data = None
                    async for piece in response.content.iter_any():
                        pour(into, piece)
        if status >= 300:
            raise _refused(status, data or b"", "GetObject")
        return data

    async def _get_object(self, bucket: str, key: str, byte_range: str, if_match: str | None,
                          extra: Mapping[str, str] | None,
                          checksum_mode: bool) -> tuple[int, Mapping[str, str], bytes]:
        if self._session is None and self._http is None:
            raise RuntimeError("the capacity getter is not started")
        path = self._path(bucket, key)
        headers = self.sign(path, "", byte_range, if_match, await self._keys(), time.gmtime(),
                            checksum_mode=checksum_mode)
        if extra:
            headers.update(extra)
        return await self._get(path, "", headers, "GetObject")

    async def list_objects_v2(
        self, *, Bucket: str, Prefix: str = "", MaxKeys: int = 1000, StartAfter: str = "",  # noqa: N803
        Delimiter: str = "", ContinuationToken: str = "",
    ) -> dict[str, Any]:
        """One ListObjectsV2 page in botocore's shape (``Contents`` with Key,
        Size, ETag and LastModified as a datetime; ``CommonPrefixes``;
        ``IsTruncated``; ``NextContinuationToken``). botocore parses a page
        of 1,000 keys on the event loop in tens of milliseconds (its XML
        model and a dateutil parse per key), stalling every read meanwhile;
        this parses it in the thread pool, with the standard library."""
        if self._session is None and self._http is None:
            raise RuntimeError("the capacity getter is not started")
        params = {"list-type": "2", "encoding-type": "url", "max-keys": str(MaxKeys), "prefix": Prefix}
        for name, value in (("start-after", StartAfter), ("delimiter", Delimiter),
                            ("continuation-token", ContinuationToken)):
            if value:
                params[name] = value
        query = "&".join(f"{quote(n, safe='-_.~')}={quote(v, safe='-_.~')}" for n, v in sorted(params.items()))
        path = self._path(Bucket)
        headers = self.sign(path, query, None, None, await self._keys(), time.gmtime())
        _, _, data = await self._get(path, query, headers, "ListObjectsV2")
        return await pool.run(parse_listing, data)

    async def post(self, *, Bucket: str, query: str, body: bytes,  # noqa: N803  botocore's names
                   extra: Mapping[str, str] | None = None) -> bytes:
        """``POST /Bucket?query`` (``query`` canonical, e.g. ``batch=``) with
        a small ``body``, signed: the answer's body (ClientError as a GET's)."""
        if self._session is None and self._http is None:
            raise RuntimeError("the capacity getter is not started")
        path = self._path(Bucket)
        headers = self.sign(path, query, None, None, await self._keys(), time.gmtime(),
                            method="POST", payload=hashlib.sha256(body).hexdigest())
        headers["content-length"] = str(len(body))
        if extra:
            headers.update(extra)
        return (await self._get(path, query, headers, "POST", method="POST", body=body))[2]

    async def _get(self, path: str, query: str, headers: dict[str, str], operation: str,
                   method: str = "GET", body: bytes = b"") -> tuple[int, Mapping[str, str], bytes]:
        """One GET (or another ``method`` with a small ``body``): its
        status, headers and whole body; an answer of 300 or more raises
        botocore's ClientError with the error document's code."""
        target = path + (f"?{query}" if query else "")
        received: Mapping[str, str]
        if self._http is not None:
            # The framing checked by the parser.
            status, received, data = await self._http.get(target, headers, method, body)
            length = None
        else:
            assert self._session is not None
            url = URL(self._origin + target, encoded=True)
            async with self._session.request(method, url, headers=headers, data=body or None,
                                             allow_redirects=False, proxy=self._proxy) as response:
                data = await response.read()
                status = response.status
                received = response.headers
                length = received.get("Content-Length")
        assert data is not None
        if status >= 300:
            raise _refused(status, data, operation)
        if length is not None and length.isdigit() and int(length) != len(data):
            raise aiohttp.ClientPayloadError(f"body of {len(data)} bytes, Content-Length {length}")
        return status, received, data

    def _path(self, bucket: str, key: str | None = None) -> str:
        """The request path of ``bucket`` (or of its object ``key``), encoded."""
        path = f"{self._base_path}/{quote(bucket, safe='')}"
        return path if key is None else f"{path}/{quote(key, safe='/-_.~')}"

    def sign(self, path: str, query: str, byte_range: str | None, if_match: str | None, keys: Keys,
             now: time.struct_time, method: str = "GET", payload: str = EMPTY_SHA256,
             checksum_mode: bool = False) -> dict[str, str]:
        """The headers of one signed GET of ``path`` (already percent-encoded)
        with ``query`` (canonical: names sorted, names and values encoded);
        or of another ``method`` whose body's SHA-256 is ``payload``;
        ``checksum_mode``: with ``x-amz-checksum-mode: ENABLED``."""
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", now)
        date = amz_date[:8]
        headers = {"host": self._host}
        if if_match is not None:
            headers["if-match"] = if_match
        if byte_range is not None:
            headers["range"] = byte_range
        if checksum_mode:
            headers["x-amz-checksum-mode"] = "ENABLED"
        headers["x-amz-content-sha256"] = payload
        headers["x-amz-date"] = amz_date
        if keys.token:
            headers["x-amz-security-token"] = keys.token
        signed = ";".join(headers)  # inserted in sorted order
        canonical_headers = "".join(f"{name}:{' '.join(value.split())}\n" for name, value in headers.items())
        canonical = f"{method}\n{path}\n{query}\n{canonical_headers}\n{signed}\n{payload}"
        scope = credential_scope(date, self._region)
        key = signing_key(keys.secret_key, date, self._region)
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={keys.access_key}/{scope}, SignedHeaders={signed}, "
            f"Signature={signature(key, string_to_sign(amz_date, scope, canonical))}"
        )
        return headers


def env_proxy(scheme: str, host: str) -> str | None:
    """The proxy that HTTP_PROXY / HTTPS_PROXY (and NO_PROXY) name for
    ``host`` over ``scheme``, as botocore honours them; None for none."""
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    return proxy


def _described(headers: Mapping[str, str]) -> dict[str, Any]:
    """The object's description in an answer's headers, under botocore's
    names: what a mounted bucket's cold read keeps of the object (its
    ETag, time, type and stored headers) comes from its one ranged GET.
    ``headers``' names are lower case, or it is case-insensitive."""
    answer: dict[str, Any] = {field: headers[name] for name, field in _FIELDS.items() if name in headers}
    modified = headers.get("last-modified")
    if modified is not None:
        with contextlib.suppress(TypeError, ValueError):
            answer["LastModified"] = http_date(modified)
    answer["Metadata"] = {name[len(META):].lower(): value for name, value in headers.items()
                          if name.lower().startswith(META)}
    return answer


# Answer headers -> botocore's field names ("Expires" raw, as botocore's ExpiresString).
_FIELDS = {
    "content-range": "ContentRange", "etag": "ETag", "content-type": "ContentType",
    "cache-control": "CacheControl", "content-disposition": "ContentDisposition",
    "content-encoding": "ContentEncoding", "content-language": "ContentLanguage",
    "x-amz-website-redirect-location": "WebsiteRedirectLocation", "expires": "ExpiresString",
    "x-amz-checksum-crc32": "ChecksumCRC32", "x-amz-checksum-crc32c": "ChecksumCRC32C",
    "x-amz-checksum-crc64nvme": "ChecksumCRC64NVME", "x-amz-checksum-sha1": "ChecksumSHA1",
    "x-amz-checksum-sha256": "ChecksumSHA256", "x-amz-checksum-type": "ChecksumType",
}
META = "x-amz-meta-"  # user metadata headers' prefix


def parse_listing(body: bytes) -> dict[str, Any]:
    """Blocking: a ListObjectsV2 answer (``encoding-type=url``) as botocore
    shapes it, keys and prefixes decoded. Read with patterns over the
    document's simple elements, not an XML tree: a page of 1,000 keys in
    about 3 ms instead of ElementTree's 16 (which holds the GIL throughout,
    slowing the event loop's reads meanwhile)."""
    if b"<ListBucketResult" not in body[:1024]:
        raise aiohttp.ClientPayloadError(f"not a listing: {body[:200]!r}")
    contents: list[dict[str, Any]] = []
    for block in _CONTENTS.finditer(body):
        fields = {name: value for name, value in _ELEMENT.findall(block[1])}
        modified = fields.get(b"LastModified")
        contents.append({
            "Key": unquote_plus(_text(fields.get(b"Key", b""))),
            "Size": int(fields.get(b"Size") or 0),
            "ETag": _text(fields.get(b"ETag", b"")),
            "LastModified": datetime.fromisoformat(modified.decode()) if modified else None,
        })
    answer: dict[str, Any] = {
        "Contents": contents,
        "CommonPrefixes": [{"Prefix": unquote_plus(_text(p))} for p in _COMMON_PREFIX.findall(body)],
        "IsTruncated": (truncated := _TRUNCATED.search(body)) is not None and truncated[1] == b"true",
    }
    if (token := _NEXT_TOKEN.search(body)) is not None:
        answer["NextContinuationToken"] = _text(token[1])
    return answer


_CONTENTS = re.compile(rb"<Contents>(.*?)</Contents>", re.DOTALL)
_ELEMENT = re.compile(rb"<(\w+)>([^<]*)</\1>")
_COMMON_PREFIX = re.compile(rb"<CommonPrefixes>\s*<Prefix>([^<]*)</Prefix>\s*</CommonPrefixes>")
_TRUNCATED = re.compile(rb"<IsTruncated>\s*(\w+)\s*</IsTruncated>")
_NEXT_TOKEN = re.compile(rb"<NextContinuationToken>([^<]*)</NextContinuationToken>")


def _text(raw: bytes) -> str:
    """An element's text: UTF-8, XML's entity and character references resolved."""
    text = raw.decode("utf-8")
    return html.unescape(text) if "&" in text else text


class RangeInto:
    """One ranged GET of ``[start, end)`` whose body goes into ``into`` as it
    arrives, as a ``fetch`` for ``S3Store.call``: each call (a retry after a
    failure mid-body too) asks for the bytes not landed yet, so a GET cut
    short resumes where it stopped. ``getter`` is a ``LeanGetter`` or
    botocore's client; ``past_end(size)`` is the error of an object that
    ends before ``end``. It is the ``Into`` the answers write to, counting
    what landed."""

    def __init__(self, getter: Any, bucket: str, key: str, start: int, end: int, into: Into,
                 past_end: Callable[[int], Exception], if_match: str | None = None) -> None:
        self._getter, self._bucket, self._key = getter, bucket, key
        self._if_match = if_match  # only bytes of this version (an ETag): a retry cannot mix two
        self._start, self._end = start, end
        self._into = into
        self._past_end = past_end
        self.at = start  # the next byte ``into`` is owed
        self._range: str | None = None  # the last answer's Content-Range

    def buffer(self) -> memoryview:
        return self._into.buffer()

    def landed(self, count: int) -> None:
        self._into.landed(count)
        self.at += count

    def _body_to(self, status: int, content_range: str | None) -> Into | None:
        """Itself for exactly the range asked for; anything else is
        collected, and judged once whole."""
        self._range = content_range
        if content_range:  # 206, or 200 from a store that says which range it sent (rclone)
            first, last, total = parse_content_range(content_range)
            if first == self.at and last == self._end - 1 and (total is None or total >= self._end):
                return self
        return None

    async def __call__(self) -> None:
        at, end = self.at, self._end
        asked = {"Bucket": self._bucket, "Key": self._key, "Range": f"bytes={at}-{end - 1}", "body_to": self._body_to,
                 "IfMatch": self._if_match}
        if isinstance(self._getter, LeanGetter):
            whole = await self._getter.get_into(**asked)
        else:
            whole = await botocore_get_into(self._getter, **asked)
        if whole is None:  # streamed: all of it, else retried from ``self.at``
            if self.at != end:
                raise BadBody(self.at - self._start, end - self._start)
        elif self._range:  # a range, not the one asked for
            total = parse_content_range(self._range)[2]
            if total is not None and total < end:
                raise self._past_end(total)
            raise BadBody(len(whole), end - at)
        elif len(whole) < end:  # 200: Range ignored (RFC 9110 allows it), the whole object
            raise self._past_end(len(whole))
        else:
            pour(self, memoryview(whole)[at:end])


async def botocore_get_into(client: Any, *, Bucket: str, Key: str, Range: str,  # noqa: N803
                           body_to: BodyTo, IfMatch: str | None = None) -> bytes | None:  # noqa: N803
    """``LeanGetter.get_into`` on botocore's client (AWS itself): the
    body read in pieces as they arrive, or whole."""
    condition = {"IfMatch": IfMatch} if IfMatch is not None else {}
    response = await client.get_object(Bucket=Bucket, Key=Key, Range=Range, **condition)
    into = body_to(int(response["ResponseMetadata"].get("HTTPStatusCode") or 0), response.get("ContentRange"))
    async with response["Body"] as body:
        if into is None:
            data: bytes = await body.read()
            return data
        while piece := await body.read(_BODY_PIECE):
            pour(into, piece)
    return None


def _refused(status: int, body: bytes, operation: str) -> ClientError:
    """botocore's ClientError for an answer of ``status`` (300 or more),
    with the code and message of its error document."""
    code, message = _error_fields(body)
    return ClientError(
        {"Error": {"Code": code or str(status), "Message": message},
         "ResponseMetadata": {"HTTPStatusCode": status}},
        operation,
    )


def _error_fields(body: bytes) -> tuple[str, str]:
    """Code and Message of an S3 error document; empty when there is none
    (a HEAD-like empty body, a proxy's HTML page)."""
    head = body[:_ERROR_PREFIX]
    code, message = _CODE.search(head), _MESSAGE.search(head)
    return (code[1].decode("utf-8", "replace") if code else "",
            message[1].decode("utf-8", "replace") if message else "")
