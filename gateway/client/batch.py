"""Client helpers for batch reads (docs/batch.md); no torch needed.

Many small objects in one request: ``get_batch`` yields ``(key, bytes)`` in
the order asked, streaming; ``BatchDataset`` is a map-style data set whose
``__getitems__`` (what PyTorch's DataLoader calls for a whole batch when a
data set has it) reads a DataLoader batch with one request;
``virtual_shards`` writes manifests of keys and returns presigned
``?batch`` URLs, which WebDataset (or curl) reads as tar shards::

    from gateway.client.batch import get_batch, virtual_shards
    for key, data in get_batch("train", keys):
        ...
    dataset = wds.WebDataset(virtual_shards("train", keys, per_shard=256))

The endpoint and the key pair come from the arguments, else from the usual
AWS environment (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, the
botocore credential chain and region), which ``eval "$(tierstore env)"``
sets.

The requests go over the standard library's ``http.client``, keep-alive
connections kept per thread, and a member is read off the response in one
copy, straight into the bytes handed out: a quarter of the client CPU
per sample that httpx took (docs/batch.md), CPU a training job's loaders
need for themselves.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import botocore.session
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

# The name prefix of a key's error member in a batch answer; the server's own is
# tiering.model.archive.ERRORS (tests/unit/gateway/test_client_room.py ties them).
ERRORS = "__errors__/"
MANIFESTS = "__manifests__/"  # where ``virtual_shards`` writes its manifests by default


class BatchError(Exception):
    """A key of a batch that could not be read: ``code`` is its S3 error code."""

    def __init__(self, key: str, code: str) -> None:
        super().__init__(f"{key}: {code}")
        self.key = key
        self.code = code


class BatchCut(Exception):
    """The tar stream ended before its end blocks: the gateway cut it (a key
    failed after streaming began with ``on_error="fail"``), or the
    connection broke."""


class RequestFailed(Exception):
    """The gateway answered a batch request with an S3 error."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code


def _pax_records(data: bytes) -> dict[str, str]:
    """``"<len> <keyword>=<value>\n"`` records (POSIX.1-2001 pax)."""
    out: dict[str, str] = {}
    at = 0
    while at < len(data):
        length = int(data[at:data.index(b" ", at)])
        keyword, _, value = data[data.index(b" ", at) + 1:at + length - 1].partition(b"=")
        out[keyword.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        at += length
    return out


ZERO_BLOCK = bytes(512)
CUT = (OSError, http.client.HTTPException)  # what a stream broken off raises


def read_tar(read: Callable[[int], bytes]) -> Iterator[tuple[str, bytes | BatchError]]:
    """``(name, bytes)`` per member of a batch's tar stream, in order
    (ustar, with pax ``path`` and ``size`` records, as the gateway writes
    it), taken off ``read(n)`` (a response's ``read``: at most ``n``
    bytes, fewer only at the end); ``(key, BatchError)`` for an error
    member; BatchCut if the stream ends before the archive's end blocks or
    the connection breaks. A member's bytes are read once, as they come."""
    pax: dict[str, str] = {}
    try:
        while True:
            header = _exactly(read, 512)
            if header == ZERO_BLOCK:
                return
            kind = header[156:157]
            size = int(pax["size"]) if "size" in pax else int(header[124:136].strip(b"\0 ") or b"0", 8)
            body = _exactly(read, size) if size else b""
            if size % 512:
                _exactly(read, -size % 512)
            if kind in (b"x", b"g"):  # extended headers: of the next member, or global (none here)
                pax = _pax_records(body) if kind == b"x" else pax
                continue
            name = pax.get("path") or header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            pax = {}
            if name.startswith(ERRORS):
                key = name[len(ERRORS):]
                yield key, BatchError(key, body.decode("ascii", "replace"))
            else:
                yield name, body
    except CUT as exc:
        raise BatchCut(f"the batch's tar stream was cut short: {exc}") from exc


def _exactly(read: Callable[[int], bytes], size: int) -> bytes:
    data = read(size)
    while len(data) < size:  # a chunked stream's read may stop at a chunk's end
        more = read(size - len(data))
        if not more:
            raise BatchCut("the batch's tar stream ended before its end blocks")
        data += more
    return data


class _Connections:
    """Keep-alive connections to one endpoint; the idle ones are kept per
    thread (a connection carries one response at a time, and a batch's
    response is read while the caller iterates) and per process: a
    DataLoader's workers are forked with the data set, and a connection
    the parent opened is the parent's (two processes reading one socket
    would each get pieces of the other's answers)."""

    IDLE = 4  # idle connections kept per thread, at most

    def __init__(self, endpoint: str, timeout: float) -> None:
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) endpoint: {endpoint!r}")
        self.origin = _origin(endpoint)
        self._kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        self._host, self._port = url.hostname, url.port
        self._timeout = timeout
        self._forked()

    def _forked(self) -> None:
        """Start afresh in this process: what was inherited is left alone."""
        self._pid = os.getpid()
        self._local = threading.local()
        self._all: set[http.client.HTTPConnection] = set()  # to close them all, whichever thread holds them
        self._lock = threading.Lock()

    def _idle(self) -> list[http.client.HTTPConnection]:
        if self._pid != os.getpid():
            self._forked()
        idle = getattr(self._local, "idle", None)
        if idle is None:
            idle = self._local.idle = []
        return idle

    def request(self, method: str, target: str, headers: dict[str, str] | None = None,
                body: bytes | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send a request and take its response's head: the connection is
        the caller's until :meth:`done` (or :meth:`drop`). A kept connection
        the server closed meanwhile is replaced."""
        idle = self._idle()
        while True:
            fresh = not idle
            conn = idle.pop() if idle else self._new()
            try:
                conn.request(method, target, body=body, headers=headers or {})
                return conn, conn.getresponse()
            except CUT:
                self.drop(conn)
                if fresh:
                    raise

    def call(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        """A request whose answer is read whole: its status and body."""
        conn, response = self.request(method, target, headers, body)
        try:
            data = response.read()
        except BaseException:
            self.drop(conn)
            raise
        self.done(conn, response)
        return response.status, data

    def _new(self) -> http.client.HTTPConnection:
        conn = self._kind(self._host, self._port, timeout=self._timeout)
        with self._lock:
            self._all.add(conn)
        return conn

    def done(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        """The response was read to its end: the connection is kept for the next request."""
        idle = self._idle()
        if response.will_close or len(idle) >= self.IDLE:
            self.drop(conn)
        else:
            idle.append(conn)

    def drop(self, conn: http.client.HTTPConnection) -> None:
        """Close a connection whose response was not read to its end (or failed)."""
        conn.close()
        with self._lock:
            self._all.discard(conn)

    def close(self) -> None:
        if self._pid != os.getpid():  # the parent's connections are the parent's to close
            self._forked()
            return
        with self._lock:
            conns, self._all = self._all, set()
        for conn in conns:
            conn.close()
        self._local = threading.local()


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _failed(status: int, data: bytes) -> RequestFailed:
    """The S3 error answer ``data`` as an exception."""
    text = data.decode("utf-8", "replace")
    code = text.split("<Code>", 1)[-1].split("</Code>", 1)[0] if "<Code>" in text else "Unknown"
    message = text.split("<Message>", 1)[-1].split("</Message>", 1)[0] if "<Message>" in text else text
    return RequestFailed(status, code, message)


class BatchClient:
    """Batch requests to one gateway, signed with one key pair."""

    def __init__(
        self,
        endpoint_url: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str | None = None,
        timeout: float = 120.0,
    ) -> None:
        session = botocore.session.get_session()
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if not endpoint:
            raise ValueError("no endpoint: pass endpoint_url or set AWS_ENDPOINT_URL (eval \"$(tierstore env)\")")
        self.endpoint = endpoint.rstrip("/")
        if access_key is not None and secret_key is not None:
            self._credentials = Credentials(access_key, secret_key)
        else:
            found = session.get_credentials()
            if found is None:
                raise ValueError("no credentials: pass access_key and secret_key or set AWS_ACCESS_KEY_ID")
            self._credentials = found
        self.region = region or session.get_config_variable("region") or "us-east-1"
        self._timeout = timeout
        self._conns = _Connections(self.endpoint, timeout)

    def close(self) -> None:
        self._conns.close()

    def __enter__(self) -> BatchClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _url(self, bucket: str, key: str = "") -> str:
        path = f"/{quote(bucket)}" + (f"/{quote(key, safe='/~')}" if key else "")
        return self.endpoint + path

    def _signed(self, method: str, url: str, body: bytes = b"") -> dict[str, str]:
        request = AWSRequest(method=method, url=url, data=body,
                             headers={"x-amz-content-sha256": hashlib.sha256(body).hexdigest()})
        S3SigV4Auth(self._credentials.get_frozen_credentials(), "s3", self.region).add_auth(request)
        return dict(request.headers.items())

    def get_batch(
        self, bucket: str, keys: Sequence[str], on_error: str = "skip"
    ) -> Iterator[tuple[str, bytes | BatchError]]:
        """``(key, bytes)`` per key, in order, as the tar streams in; a key
        that could not be read comes as ``(key, BatchError)`` (``skip``), or
        the call raises RequestFailed (``fail``: a missing key, before any
        member) or BatchCut (``fail``: a failure after streaming began)."""
        body = json.dumps({"keys": list(keys), "on_error": on_error}).encode()
        url = self._url(bucket) + "?batch="
        yield from self._members(self._conns, "POST", url, self._signed("POST", url, body), body)

    def read_url(self, url: str) -> Iterator[tuple[str, bytes | BatchError]]:
        """The members of a presigned ``?batch`` URL (see :meth:`virtual_shards`)."""
        if _origin(url) == self._conns.origin:
            yield from self._members(self._conns, "GET", url)
            return
        conns = _Connections(url, self._timeout)  # another endpoint's URL: a connection of its own
        try:
            yield from self._members(conns, "GET", url)
        finally:
            conns.close()

    @staticmethod
    def _members(conns: _Connections, method: str, url: str, headers: dict[str, str] | None = None,
                 body: bytes | None = None) -> Iterator[tuple[str, bytes | BatchError]]:
        parts = urlsplit(url)
        conn, response = conns.request(method, parts.path + ("?" + parts.query if parts.query else ""),
                                       headers, body)
        finished = False  # the response read to its end
        try:
            if response.status != 200:
                data = response.read()
                finished = True
                raise _failed(response.status, data)
            yield from read_tar(response.read)
            response.read()  # what follows the end blocks: nothing, or a chunked stream's last chunk
            finished = True
        finally:
            if finished:
                conns.done(conn, response)
            else:  # the caller stopped early, or the stream broke: the rest is not read
                conns.drop(conn)

    def put_manifest(self, bucket: str, key: str, keys: Sequence[str]) -> None:
        """Write a manifest object: the keys, one per line."""
        if any("\n" in k or "\r" in k for k in keys):
            raise ValueError("a manifest cannot list a key with a line break; use get_batch")
        body = "".join(f"{k}\n" for k in keys).encode("utf-8")
        url = self._url(bucket, key)
        status, data = self._conns.call("PUT", urlsplit(url).path, self._signed("PUT", url, body), body)
        if status != 200:
            raise _failed(status, data)

    def presign_batch(self, bucket: str, manifest: str, expires: int = 3600) -> str:
        """A presigned ``GET /{bucket}/{manifest}?batch`` URL, valid ``expires`` seconds."""
        request = AWSRequest(method="GET", url=self._url(bucket, manifest) + "?batch=")
        S3SigV4QueryAuth(self._credentials.get_frozen_credentials(), "s3", self.region,
                         expires=expires).add_auth(request)
        return str(request.url)

    def virtual_shards(
        self, bucket: str, keys: Sequence[str], per_shard: int, prefix: str = MANIFESTS,
        name: str = "shard", expires: int = 3600,
    ) -> list[str]:
        """Cut ``keys`` into shards of ``per_shard`` in order, write a manifest
        for each (``{prefix}{name}-NNNNNN``) and return their presigned
        ``?batch`` URLs: WebDataset reads each as a tar shard."""
        if per_shard < 1:
            raise ValueError("per_shard must be at least 1")
        urls = []
        for number, start in enumerate(range(0, len(keys), per_shard)):
            manifest = f"{prefix}{name}-{number:06d}"
            self.put_manifest(bucket, manifest, keys[start:start + per_shard])
            urls.append(self.presign_batch(bucket, manifest, expires))
        return urls


def get_batch(bucket: str, keys: Sequence[str], on_error: str = "skip",
              **client: Any) -> Iterator[tuple[str, bytes | BatchError]]:
    """``BatchClient(**client).get_batch(...)``: one request, closed at the end."""
    with BatchClient(**client) as batches:
        yield from batches.get_batch(bucket, keys, on_error)


def virtual_shards(bucket: str, keys: Sequence[str], per_shard: int, **options: Any) -> list[str]:
    """``BatchClient().virtual_shards(...)``; ``options`` go to either."""
    client_options = {k: options.pop(k) for k in ("endpoint_url", "access_key", "secret_key", "region")
                      if k in options}
    with BatchClient(**client_options) as batches:
        return batches.virtual_shards(bucket, keys, per_shard, **options)


class BatchDataset:
    """A map-style data set of a bucket's objects, ``keys[i]`` for index
    ``i``: ``__getitems__`` reads a whole DataLoader batch with one request
    (``transform(key, bytes)`` per sample, default the bytes). Any sampler
    of indices works, ``gateway.client.hints.HintedSampler`` included. A key that
    cannot be read raises (``on_error="fail"``). Picklable: each DataLoader
    worker opens its own connection on first use."""

    def __init__(
        self, bucket: str, keys: Sequence[str], transform: Callable[[str, bytes], Any] | None = None,
        **client: Any,
    ) -> None:
        self.bucket = bucket
        self.keys = keys
        self.transform = transform
        self._options = client
        self._client: BatchClient | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    def _batches(self) -> BatchClient:
        if self._client is None:
            self._client = BatchClient(**self._options)
        return self._client

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        keys = [self.keys[i] for i in indices]
        samples = []
        for key, data in self._batches().get_batch(self.bucket, keys, on_error="fail"):
            assert isinstance(data, bytes)  # errors raise with on_error="fail"
            samples.append(self.transform(key, data) if self.transform is not None else data)
        return samples
