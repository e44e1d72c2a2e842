"""What the security tests share: one S3 request (``Call``), its signing in
the ways the gateway accepts besides a SigV4 header (a SigV4 presigned URL
with a clock that can be moved, a SigV2 header, a SigV2 presigned URL), and
the wrong credentials they are signed with."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from unittest import mock
from urllib.parse import urlsplit

from botocore.auth import HmacV1Auth, HmacV1QueryAuth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.integration.s3raw import REGION
from tests.servers import ACCESS_KEY, SECRET_KEY

WRONG_SECRET = "not-the-secret-key"
UNKNOWN_KEY = "AKIDNOSUCHKEY0000000"


@dataclass(frozen=True)
class Call:
    """One S3 request: method, path, query (sub-resource first), headers, body."""

    label: str
    method: str
    path: str
    query: list[tuple[str, str]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def query_string(self) -> str:
        return "&".join(f"{k}={v}" if v else k for k, v in self.query)

    def url(self, endpoint: str, path: str | None = None, query: str | None = None) -> str:
        q = self.query_string if query is None else query
        return endpoint + (path if path is not None else self.path) + (f"?{q}" if q else "")


def v4_presigned(call: Call, endpoint: str, *, secret: str = SECRET_KEY, method: str | None = None,
                 path: str | None = None, query: str | None = None, when: datetime | None = None,
                 expires: int = 300) -> str:
    """A SigV4 query-signed URL for ``call``, its signature computed for
    ``call`` or for another method, path or query; botocore's pure-Python
    signer, so that its clock can be moved."""
    request = AWSRequest(method=method or call.method, url=call.url(endpoint, path, query),
                         headers=dict(call.headers))
    moment = (when or datetime.now(UTC)).astimezone(UTC).replace(tzinfo=None)
    with mock.patch("botocore.auth.get_current_datetime", return_value=moment):
        S3SigV4QueryAuth(Credentials(ACCESS_KEY, secret), "s3", REGION, expires=expires).add_auth(request)
    auth = [p for p in urlsplit(request.url).query.split("&") if p.startswith("X-Amz-")]
    sent = call.url(endpoint)
    return sent + ("&" if "?" in sent else "?") + "&".join(auth)


def v2_header(call: Call, endpoint: str, access_key: str, secret: str) -> dict[str, str]:
    """The headers of ``call`` signed with SigV2's Authorization header."""
    request = AWSRequest(method=call.method, url=call.url(endpoint), headers=dict(call.headers),
                         data=call.body)
    HmacV1Auth(Credentials(access_key, secret)).add_auth(request)
    return dict(request.headers.items())


def v2_presigned(call: Call, endpoint: str, access_key: str, secret: str, expires: int) -> str:
    """A SigV2 query-signed URL for ``call``, valid ``expires`` seconds from now."""
    request = AWSRequest(method=call.method, url=call.url(endpoint), headers=dict(call.headers))
    HmacV1QueryAuth(Credentials(access_key, secret), expires=expires).add_auth(request)
    return request.url
