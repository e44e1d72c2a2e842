"""Raw-request helpers for integration tests (imported by test modules, not a conftest).

``signed`` signs a raw request with botocore's own SigV4 signer (optionally
with another key pair, another clock or a declared payload hash that is not
the body's) and sends it with httpx; ``raw_http`` sends bytes exactly as
given (for paths httpx would re-encode); ``read_answer`` reads one response
off a raw socket. ``check_error`` asserts the shape
of an S3 error response; ``boto_error`` does the same for a boto3 call.
"""

from __future__ import annotations

import hashlib
import socket
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.client import HTTPConnection
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import httpx
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.conftest import make_client
from tests.servers import ACCESS_KEY, SECRET_KEY, Gateway

REGION = "us-east-1"


class _Auth(S3SigV4Auth):
    """botocore's S3 signer, with an optional declared payload hash."""

    def __init__(self, credentials: Credentials, payload_hash: str | None) -> None:
        super().__init__(credentials, "s3", REGION)
        self._payload_hash = payload_hash

    def payload(self, request: AWSRequest) -> str:
        if self._payload_hash is not None:
            return self._payload_hash
        return super().payload(request)


def sign(
    method: str,
    url: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    *,
    access_key: str = ACCESS_KEY,
    secret_key: str = SECRET_KEY,
    when: datetime | None = None,
    payload_hash: str | None = None,
) -> tuple[dict[str, str], _Auth, str]:
    """Signed headers for the request, the signer, and the signing timestamp."""
    request = AWSRequest(method=method, url=url, headers=dict(headers or {}), data=body)
    auth = _Auth(Credentials(access_key, secret_key), payload_hash)
    moment = (when or datetime.now(UTC)).astimezone(UTC).replace(tzinfo=None)
    with mock.patch("botocore.auth.get_current_datetime", return_value=moment):
        auth.add_auth(request)
    return dict(request.headers.items()), auth, request.context["timestamp"]


def chunk_signing_key(secret_key: str, date: str) -> bytes:
    import hmac

    key = hmac.new(("AWS4" + secret_key).encode(), date.encode(), hashlib.sha256).digest()
    for part in (REGION, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


class Sender:
    """Sends raw requests to one gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.endpoint = gateway.endpoint
        self.client = httpx.Client(timeout=30.0)

    def url(self, path: str) -> str:
        return self.endpoint + path

    def signed(self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"",
               **options: Any) -> httpx.Response:
        url = self.url(path)
        signed_headers, _, _ = sign(method, url, headers, body, **options)
        return self.client.request(method, url, headers=signed_headers, content=body)

    def unsigned(self, method: str, path: str, headers: dict[str, str] | None = None,
                 body: bytes = b"") -> httpx.Response:
        return self.client.request(method, self.url(path), headers=headers or {}, content=body)

    def raw_http(self, method: str, raw_target: str, headers: dict[str, str] | None = None,
                 body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        """The request line's target sent byte for byte (no re-encoding)."""
        parts = urlsplit(self.endpoint)
        conn = HTTPConnection(parts.hostname, parts.port, timeout=30)
        try:
            conn.putrequest(method, raw_target, skip_accept_encoding=True)
            for name, value in (headers or {}).items():
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def close(self) -> None:
        self.client.close()


@pytest.fixture(scope="session")
def http(gateway: Gateway) -> Iterator[Sender]:
    sender = Sender(gateway)
    try:
        yield sender
    finally:
        sender.close()


def check_error_parts(status: int, headers: Any, body: bytes, want_status: int, want_code: str | None,
                      *, head: bool = False) -> ET.Element | None:
    """Assert an S3 error answer: status, request id header, XML body."""
    assert status == want_status, (status, body[:2000])
    request_id = headers.get("x-amz-request-id")
    assert request_id, "every response carries x-amz-request-id"
    if head or want_status == 304:
        assert body == b"", body[:200]
        return None
    root = ET.fromstring(body)
    assert root.tag == "Error", body
    assert root.findtext("Code") == want_code, body
    assert root.findtext("Message"), body
    assert root.findtext("RequestId") == request_id, body
    return root


def check_error(resp: httpx.Response, status: int, code: str | None) -> ET.Element | None:
    return check_error_parts(resp.status_code, resp.headers, resp.content, status, code,
                             head=resp.request.method == "HEAD")


class RecordingClient:
    """A boto3 client that keeps the last raw HTTP response it parsed."""

    def __init__(self, endpoint: str) -> None:
        self.client = make_client(endpoint)
        self.last: dict[str, Any] | None = None
        self.client.meta.events.register("before-parse.s3", self._record)

    def _record(self, response_dict: dict[str, Any], **_: Any) -> None:
        self.last = response_dict

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@pytest.fixture(scope="session")
def s3r(gateway: Gateway) -> RecordingClient:
    return RecordingClient(gateway.endpoint)


def boto_error(client: RecordingClient, call: Callable[..., Any], status: int, code: str, *,
               head: bool = False, **kwargs: Any) -> ClientError:
    """Call a boto3 operation that must fail; check the raw error answer."""
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    err = info.value
    assert err.response["ResponseMetadata"]["HTTPStatusCode"] == status, err.response
    if not head:
        assert err.response["Error"]["Code"] == code, err.response
    raw = client.last
    assert raw is not None
    body = raw["body"] if isinstance(raw["body"], bytes) else b""
    check_error_parts(raw["status_code"], raw["headers"], body, status, code, head=head)
    return err


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def read_answer(sock: socket.socket, head_only: bool = False) -> Answer | None:
    """One HTTP response from ``sock`` (interim 1xx ones skipped); None if
    the server closed (or reset) the connection without one."""
    data = b""
    try:
        while True:
            while b"\r\n\r\n" not in data:
                piece = sock.recv(65536)
                if not piece:
                    return None
                data += piece
            head, _, data = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            if not lines[0].startswith("HTTP/1.1 1"):  # 100 Continue precedes the answer
                break
        body = data
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = 0 if head_only else int(headers.get("content-length", "0"))
        while len(body) < length:
            piece = sock.recv(65536)
            if not piece:
                break
            body += piece
    except ConnectionResetError:
        return None
    return Answer(int(lines[0].split(" ")[1]), headers, body[:length])
