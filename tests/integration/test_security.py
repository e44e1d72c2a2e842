"""Authentication and secrets of a real gateway process.

- Every S3 operation the gateway routes (``gateway.routes.TABLE``, plus the
  variants that rename an operation and a few refused sub-resources and
  methods) is sent with each kind of bad credentials: none, a wrong secret,
  an unknown key, a presigned URL that expired or that was signed for
  another method, path or query, and SigV2 equivalents. Each answer is 403
  with S3's code, and afterwards a valid client finds nothing created,
  deleted or overwritten. test_errors.py and test_sigv2.py hold the single
  cases; this is the matrix.
- A presigned URL works until X-Amz-Expires runs out and not after; a
  lifetime above 604800 s is refused as S3 refuses it.
- Every route of the admin app, hidden ones included, refuses the S3 secret,
  the access key and near misses of the admin token (test_admin.py covers no
  token, a wrong one and Basic auth); only the probes and the schema pages
  answer without it.
- A gateway with distinctive secrets (S3 secret key, admin token, capacity
  secret key, a mount's secret key), logging at debug level with a JSON
  access log, serves good and failing requests; no secret appears in its
  log, in any response seen, or in the CLI's output.
- The admin API listens on loopback unless configured otherwise.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock
from urllib.parse import urlsplit

import boto3
import httpx
import pytest
from botocore.auth import HmacV1Auth, HmacV1QueryAuth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from gateway import routes
from gateway.admin import build_admin_app
from gateway.cli import app as cli_app
from gateway.config import Config
from gateway.metrics import Metrics
from tests.conftest import assert_consistent, make_client
from tests.integration.s3raw import REGION, check_error_parts, sign
from tests.servers import ACCESS_KEY, ADMIN_TOKEN, SECRET_KEY, Gateway, free_port

WRONG_SECRET = "not-the-secret-key"
UNKNOWN_KEY = "AKIDNOSUCHKEY0000000"
PUBLIC_ADMIN_ROUTES = {
    # Probes: load balancers and orchestrators call them without secrets;
    # they say "ok" or which check failed, nothing about the data.
    ("GET", "/health"), ("GET", "/ready"),
    # The schema and its two viewers describe the API; they hold no data.
    ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc"),
}


# -- the S3 route matrix ------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The state the matrix must leave alone."""

    bucket: str  # holds "k" and an open multipart upload of "mp"
    empty: str  # an empty bucket, the target of DeleteBucket
    new_bucket: str  # must never come to exist
    upload_id: str
    part_etag: str


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


def _sub_query(sub: str | None, method: str, t: Target) -> list[tuple[str, str]]:
    if sub is None:
        return []
    if sub == "uploadId":  # UploadPart names a part; Complete, Abort and ListParts do not
        upload = [("uploadId", t.upload_id)]
        return [("partNumber", "2"), *upload] if method == "PUT" else upload
    if sub == "partNumber":
        return [("partNumber", "1")]
    return [(sub, "")]


def _calls(t: Target) -> list[Call]:
    """Every routed operation, built from the operation table, plus the
    operations a header or argument selects and some the gateway refuses."""
    acl = b'<AccessControlPolicy><AccessControlList/></AccessControlPolicy>'
    complete = (f"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{t.part_etag}</ETag>"
                "</Part></CompleteMultipartUpload>").encode()
    bodies = {
        ("bucket", "PUT", "acl"): acl, ("object", "PUT", "acl"): acl,
        ("bucket", "POST", "delete"): b"<Delete><Object><Key>k</Key></Object></Delete>",
        ("object", "PUT", None): b"overwritten", ("object", "PUT", "uploadId"): b"part two",
        ("object", "POST", "uploadId"): complete,
    }
    calls = []
    for (kind, method, sub), route in routes.TABLE.items():
        path = {"service": "/", "bucket": f"/{t.bucket}", "object": f"/{t.bucket}/k"}[kind]
        if (kind, method) == ("bucket", "PUT") and sub is None:
            path = f"/{t.new_bucket}"
        elif (kind, method) == ("bucket", "DELETE"):
            path = f"/{t.empty}"
        elif kind == "object" and sub == "uploadId":
            path = f"/{t.bucket}/mp"
        calls.append(Call(route.op, method, path, _sub_query(sub, method, t),
                          body=bodies.get((kind, method, sub), b"")))
    copy = {"x-amz-copy-source": f"/{t.bucket}/k"}
    calls += [
        Call("ListObjectsV2", "GET", f"/{t.bucket}", [("list-type", "2")]),
        Call("CopyObject", "PUT", f"/{t.bucket}/copied", headers=copy),
        Call("UploadPartCopy", "PUT", f"/{t.bucket}/mp", [("partNumber", "3"), ("uploadId", t.upload_id)],
             headers=copy),
        Call("PutObject(new key)", "PUT", f"/{t.bucket}/created", body=b"new"),
        Call("GetBucketTagging", "GET", f"/{t.bucket}", [("tagging", "")]),
        Call("PutObjectTagging", "PUT", f"/{t.bucket}/k", [("tagging", "")],
             body=b"<Tagging><TagSet/></Tagging>"),
        Call("DeleteBucketPolicy", "DELETE", f"/{t.bucket}", [("policy", "")]),
        Call("PATCH", "PATCH", f"/{t.bucket}/k", body=b"x"),
    ]
    return calls


def _v4_presigned(call: Call, endpoint: str, *, secret: str = SECRET_KEY, method: str | None = None,
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


def _v2_header(call: Call, endpoint: str, access_key: str, secret: str) -> dict[str, str]:
    request = AWSRequest(method=call.method, url=call.url(endpoint), headers=dict(call.headers),
                         data=call.body)
    HmacV1Auth(Credentials(access_key, secret)).add_auth(request)
    return dict(request.headers.items())


def _v2_presigned(call: Call, endpoint: str, access_key: str, secret: str, expires: int) -> str:
    request = AWSRequest(method=call.method, url=call.url(endpoint), headers=dict(call.headers))
    HmacV1QueryAuth(Credentials(access_key, secret), expires=expires).add_auth(request)
    return request.url


Send = Callable[[httpx.Client, Call, str], httpx.Response]


def _header_v4(access_key: str, secret: str) -> Send:
    def send(client: httpx.Client, call: Call, endpoint: str) -> httpx.Response:
        headers, _, _ = sign(call.method, call.url(endpoint), call.headers, call.body,
                             access_key=access_key, secret_key=secret)
        return client.request(call.method, call.url(endpoint), headers=headers, content=call.body)
    return send


def _url(make: Callable[[Call, str], str]) -> Send:
    def send(client: httpx.Client, call: Call, endpoint: str) -> httpx.Response:
        return client.request(call.method, make(call, endpoint), headers=call.headers, content=call.body)
    return send


def _sigv2(access_key: str, secret: str) -> Send:
    def send(client: httpx.Client, call: Call, endpoint: str) -> httpx.Response:
        headers = _v2_header(call, endpoint, access_key, secret)
        return client.request(call.method, call.url(endpoint), headers=headers, content=call.body)
    return send


def _other_method(call: Call) -> str:
    return "PUT" if call.method in ("GET", "HEAD") else "GET"


def _other_path(call: Call) -> str:
    return call.path + ("other" if call.path.endswith("/") else "-other")


def _other_query(call: Call) -> str:
    # Signed without the operation's sub-resource (as if someone added
    # ?delete to a URL presigned for a plain POST), or with a parameter
    # the request then leaves out.
    return "" if call.query else "x-id=Other"


BAD_AUTH: dict[str, tuple[Send, str]] = {
    "unsigned": (_url(lambda c, e: c.url(e)), "AccessDenied"),
    "v4-wrong-secret": (_header_v4(ACCESS_KEY, WRONG_SECRET), "SignatureDoesNotMatch"),
    "v4-unknown-key": (_header_v4(UNKNOWN_KEY, SECRET_KEY), "InvalidAccessKeyId"),
    "v4-presigned-expired": (_url(lambda c, e: _v4_presigned(
        c, e, when=datetime.now(UTC) - timedelta(hours=1), expires=60)), "AccessDenied"),
    "v4-presigned-other-method": (_url(lambda c, e: _v4_presigned(c, e, method=_other_method(c))),
                                  "SignatureDoesNotMatch"),
    "v4-presigned-other-path": (_url(lambda c, e: _v4_presigned(c, e, path=_other_path(c))),
                                "SignatureDoesNotMatch"),
    "v4-presigned-other-query": (_url(lambda c, e: _v4_presigned(c, e, query=_other_query(c))),
                                 "SignatureDoesNotMatch"),
    "v4-presigned-wrong-secret": (_url(lambda c, e: _v4_presigned(c, e, secret=WRONG_SECRET)),
                                  "SignatureDoesNotMatch"),
    "v2-wrong-secret": (_sigv2(ACCESS_KEY, WRONG_SECRET), "SignatureDoesNotMatch"),
    "v2-unknown-key": (_sigv2(UNKNOWN_KEY, SECRET_KEY), "InvalidAccessKeyId"),
    "v2-presigned-wrong-secret": (_url(lambda c, e: _v2_presigned(c, e, ACCESS_KEY, WRONG_SECRET, 300)),
                                  "SignatureDoesNotMatch"),
    "v2-presigned-expired": (_url(lambda c, e: _v2_presigned(c, e, ACCESS_KEY, SECRET_KEY, -60)),
                             "AccessDenied"),
}


@pytest.fixture(scope="module")
def target(gateway: Gateway) -> Target:
    s3 = make_client(gateway.endpoint)
    tag = f"{os.getpid()}-{secrets.token_hex(3)}"
    t_bucket, empty = f"sec-matrix-{tag}", f"sec-empty-{tag}"
    for name in (t_bucket, empty):
        s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=t_bucket, Key="k", Body=b"original")
    upload_id = s3.create_multipart_upload(Bucket=t_bucket, Key="mp")["UploadId"]
    etag = s3.upload_part(Bucket=t_bucket, Key="mp", UploadId=upload_id, PartNumber=1,
                          Body=b"part one")["ETag"]
    return Target(t_bucket, empty, f"sec-new-{tag}", upload_id, etag)


def _state(s3, t: Target) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """What a valid client sees of everything the matrix aims at."""
    listed = s3.list_objects_v2(Bucket=t.bucket).get("Contents", [])
    uploads = s3.list_multipart_uploads(Bucket=t.bucket).get("Uploads", [])
    return {
        "buckets": sorted(b["Name"] for b in s3.list_buckets()["Buckets"] if b["Name"].startswith("sec-")),
        "objects": sorted((o["Key"], o["ETag"], o["Size"]) for o in listed),
        "k": s3.get_object(Bucket=t.bucket, Key="k")["Body"].read(),
        "uploads": [(u["Key"], u["UploadId"]) for u in uploads],
        "parts": [(p["PartNumber"], p["ETag"]) for p in
                  s3.list_parts(Bucket=t.bucket, Key="mp", UploadId=t.upload_id).get("Parts", [])],
    }


@pytest.mark.parametrize("auth", list(BAD_AUTH))
def test_no_operation_runs_without_valid_credentials(gateway: Gateway, target: Target, auth: str) -> None:
    send, code = BAD_AUTH[auth]
    s3 = make_client(gateway.endpoint)
    before = _state(s3, target)
    buckets = before["buckets"]
    assert target.empty in buckets and target.new_bucket not in buckets  # type: ignore[operator]
    calls = _calls(target)
    assert len(calls) >= 30
    wrong = []
    with httpx.Client(timeout=30) as client:
        for call in calls:
            response = send(client, call, gateway.endpoint)
            try:
                check_error_parts(response.status_code, response.headers, response.content, 403,
                                  code, head=call.method == "HEAD")
            except AssertionError as exc:
                wrong.append(f"{call.label} {call.method} {call.path}?{call.query_string}: {exc}")
    assert not wrong, (f"{auth}: {len(wrong)} of {len(calls)} answers were not 403 {code}:\n"
                       + "\n".join(wrong))
    assert _state(s3, target) == before


# -- presigned URL lifetime -------------------------------------------------------------


def test_a_presigned_url_works_until_it_expires(gateway: Gateway, target: Target) -> None:
    # Signed for a moment 2 s ahead (within the 15 min skew S3 allows) with
    # X-Amz-Expires=1: valid from now until that moment plus a second.
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    get = Call("GetObject", "GET", f"/{target.bucket}/k")
    put = Call("PutObject", "PUT", f"/{target.bucket}/late", body=b"late")
    get_url = _v4_presigned(get, gateway.endpoint, when=start, expires=1)
    put_url = _v4_presigned(put, gateway.endpoint, when=start, expires=1)
    assert "X-Amz-Expires=1&" in get_url
    response = httpx.get(get_url)
    assert (response.status_code, response.content) == (200, b"original")
    time.sleep(max(0.0, (start + timedelta(seconds=1) - datetime.now(UTC)).total_seconds()) + 1.0)
    for response in (httpx.get(get_url), httpx.put(put_url, content=b"late")):
        check_error_parts(response.status_code, response.headers, response.content, 403, "AccessDenied")
        assert b"Request has expired" in response.content
    with pytest.raises(ClientError):
        make_client(gateway.endpoint).head_object(Bucket=target.bucket, Key="late")


def test_x_amz_expires_above_a_week_is_refused(gateway: Gateway, target: Target) -> None:
    get = Call("GetObject", "GET", f"/{target.bucket}/k")
    assert httpx.get(_v4_presigned(get, gateway.endpoint, expires=604800)).content == b"original"
    put = Call("PutObject", "PUT", f"/{target.bucket}/week", body=b"w")
    for call in (get, put):
        url = _v4_presigned(call, gateway.endpoint, expires=604801)
        response = httpx.request(call.method, url, content=call.body)
        root = check_error_parts(response.status_code, response.headers, response.content, 400,
                                 "AuthorizationQueryParametersError")
        assert root is not None and "604800" in (root.findtext("Message") or "")
    with pytest.raises(ClientError):
        make_client(gateway.endpoint).head_object(Bucket=target.bucket, Key="week")


# -- the admin API's token ------------------------------------------------------------


class _NoS3:
    started = False
    service = None
    metrics = Metrics()


@functools.cache
def _admin_routes() -> tuple[tuple[str, str], ...]:
    """Every (method, path) the admin app serves, from the app itself, so a
    route left out of the OpenAPI schema is found too. Routers included in
    routers are walked into (FastAPI keeps them as routes of their own)."""
    app = build_admin_app(Config(admin_token="unused"), _NoS3())

    def walk(routes: list[object]) -> Iterator[tuple[str, str]]:
        for route in routes:
            for method in getattr(route, "methods", None) or ():
                yield method, route.path  # type: ignore[attr-defined]
            included = getattr(route, "original_router", None)
            inner = getattr(route, "routes", None) or getattr(included, "routes", None)
            if inner:
                yield from walk(inner)

    return tuple(sorted(set(walk(app.routes))))


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def test_every_admin_route_is_in_the_schema_or_public(gateway: Gateway) -> None:
    with httpx.Client(base_url=gateway.admin_url, timeout=30) as admin:
        schema = admin.get("/openapi.json").json()
        documented = {(m.upper(), p) for p, ops in schema["paths"].items() for m in ops}
        served = {(m, re.sub(r":path\}", "}", p)) for m, p in _admin_routes() if m != "HEAD"}
        assert served - PUBLIC_ADMIN_ROUTES == documented - PUBLIC_ADMIN_ROUTES
        for method, path in sorted(PUBLIC_ADMIN_ROUTES):
            assert admin.request(method, path).status_code == 200, path
        # A method a path does not have gets no further than the method check,
        # and the 405 names every method the path has (RFC 9110, 15.5.6); a
        # concrete path goes before templated ones, as in OpenAPI (/jobs/flush
        # is the flush action, not GET /jobs/{job_id}).
        for path in sorted({p for _, p in served} - {p for _, p in PUBLIC_ADMIN_ROUTES}):
            url = _concrete(path)
            methods = {m for m, p in served if p == url} or {
                m for m, p in served if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", p), url)}
            for method in {"HEAD", "OPTIONS", "PUT", "PATCH", "POST"} - methods:
                response = admin.request(method, url)
                assert response.status_code == 405, (method, path, response.status_code)
                assert set(response.headers["allow"].split(", ")) == methods, (method, path, response.headers)


NEAR_MISSES = {
    "the S3 secret key": {"Authorization": f"Bearer {SECRET_KEY}"},
    "the S3 access key": {"Authorization": f"Bearer {ACCESS_KEY}"},
    "access key:secret key": {"Authorization": f"Bearer {ACCESS_KEY}:{SECRET_KEY}"},
    "a SigV4 header": {"Authorization": f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/20260101/us-east-1/s3/"
                                        "aws4_request, SignedHeaders=host, Signature=" + "0" * 64},
    "the token with a suffix": {"Authorization": f"Bearer {ADMIN_TOKEN}x"},
    "the token cut short": {"Authorization": f"Bearer {ADMIN_TOKEN[:-1]}"},
    "the token without a scheme": {"Authorization": ADMIN_TOKEN},
    "the token as Basic": {"Authorization": "Basic " + base64.b64encode(f"x:{ADMIN_TOKEN}".encode()).decode()},
    "the token elsewhere": {"X-Admin-Token": ADMIN_TOKEN, "X-Api-Key": ADMIN_TOKEN},
    "a bearer without a token": {"Authorization": "Bearer"},
}


@pytest.mark.parametrize("what", list(NEAR_MISSES))
def test_the_admin_api_takes_nothing_but_its_token(gateway: Gateway, what: str) -> None:
    headers = NEAR_MISSES[what]
    wrong = []
    with httpx.Client(timeout=30) as client:
        for method, path in _admin_routes():
            if path in {p for _, p in PUBLIC_ADMIN_ROUTES}:
                continue
            url = gateway.admin_url + _concrete(path)
            query = {"token": ADMIN_TOKEN, "access_token": ADMIN_TOKEN} if what == "the token elsewhere" else {}
            response = client.request(method, url, headers=headers, params=query)
            if response.status_code != 401 or response.json()["error"]["code"] != "Unauthorized" \
                    or not response.headers.get("www-authenticate", "").startswith("Bearer"):
                wrong.append(f"{method} {path}: {response.status_code} {response.text[:200]}")
    assert not wrong, f"with {what}:\n" + "\n".join(wrong)


def test_the_admin_token_opens_what_near_misses_do_not(gateway: Gateway) -> None:
    """The control for the test above: the same requests with the token pass."""
    response = httpx.get(f"{gateway.admin_url}/buckets", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 200 and "buckets" in response.json()


# -- secrets stay secret ----------------------------------------------------------------


@dataclass
class Secrets:
    s3: str = field(default_factory=lambda: "s3secret" + secrets.token_hex(12))
    admin: str = field(default_factory=lambda: "admintoken" + secrets.token_hex(12))
    capacity: str = field(default_factory=lambda: "capsecret" + secrets.token_hex(12))
    mount: str = field(default_factory=lambda: "mountsecret" + secrets.token_hex(12))

    def all(self) -> dict[str, str]:
        return {"S3 secret key": self.s3, "admin token": self.admin, "capacity secret key": self.capacity,
                "mount secret key": self.mount}

    def found_in(self, text: str) -> list[str]:
        return [name for name, value in self.all().items() if value in text]


class SecretGateway(Gateway):
    """A gateway whose secrets come from the environment, not its command line."""

    def __init__(self, data_dir: Path, keys: Secrets, extra_args: list[str]) -> None:
        super().__init__(data_dir, extra_args=extra_args)
        self.keys = keys

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(TIERSTORE_SECRET_KEY=self.keys.s3, TIERSTORE_ADMIN_TOKEN=self.keys.admin,
                   TIERSTORE_CAPACITY_SECRET_KEY=self.keys.capacity)
        return env


@dataclass
class Seen:
    """Every response body and header the test saw, and every CLI output."""

    texts: list[tuple[str, str]] = field(default_factory=list)

    def response(self, label: str, response: httpx.Response) -> httpx.Response:
        headers = "\n".join(f"{k}: {v}" for k, v in response.headers.items())
        self.texts.append((label, headers + "\n" + response.content.decode("utf-8", "replace")))
        return response

    def text(self, label: str, text: str) -> None:
        self.texts.append((label, text))


@pytest.fixture(scope="module")
def secret_gateway(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> Iterator[SecretGateway]:
    keys = Secrets()
    root = tmp_path_factory.mktemp("secrets")
    capacity = f"sec-cap-{os.getpid()}"
    source = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name=REGION)
    for name in (capacity, "sec-source"):
        source.create_bucket(Bucket=name)
    source.put_object(Bucket="sec-source", Key="data/a", Body=b"from the source")
    args = ["--access-log", "json", "--log-level", "debug", "--flush-delay", "3600",
            "--capacity", f"s3://{capacity}/tier", "--capacity-endpoint", moto_endpoint,
            "--capacity-access-key", "sec-capacity-access"]
    gw = SecretGateway(root / "data", keys, args).start()
    try:
        yield gw
    finally:
        gw.stop()
    assert_consistent(gw)


def _exercise_s3(gw: SecretGateway, seen: Seen) -> None:
    keys = gw.keys
    good = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=keys.s3, region_name=REGION)
    good.create_bucket(Bucket="sec-data")
    good.put_object(Bucket="sec-data", Key="a", Body=b"a" * 10_000)
    assert good.get_object(Bucket="sec-data", Key="a")["Body"].read() == b"a" * 10_000
    with httpx.Client(timeout=30) as client:
        for secret, access in ((WRONG_SECRET, ACCESS_KEY), (keys.s3, UNKNOWN_KEY)):
            for path in ("/sec-data/a", "/sec-data", "/"):
                headers, _, _ = sign("GET", gw.endpoint + path, access_key=access, secret_key=secret)
                seen.response(f"S3 GET {path} signed wrong", client.get(gw.endpoint + path, headers=headers))
        call = Call("GetObject", "GET", "/sec-data/a")
        seen.response("SigV2 wrong secret", client.get(gw.endpoint + call.path, headers=_v2_header(
            call, gw.endpoint, ACCESS_KEY, WRONG_SECRET)))
        presigned = _v2_presigned(call, gw.endpoint, ACCESS_KEY, keys.s3, 60)
        seen.response("SigV2 presigned", client.get(presigned))
        seen.response("SigV4 presigned, expired", client.get(_v4_presigned(
            call, gw.endpoint, secret=keys.s3, when=datetime.now(UTC) - timedelta(hours=1), expires=60)))
        for path in ("/sec-data/missing", "/no-such-bucket-here/k", "/sec-data/a?partNumber=7"):
            headers, _, _ = sign("GET", gw.endpoint + path, secret_key=keys.s3)
            seen.response(f"S3 GET {path}", client.get(gw.endpoint + path, headers=headers))
        seen.response("unsigned", client.get(gw.endpoint + "/sec-data/a"))


def _exercise_admin(gw: SecretGateway, moto_endpoint: str, seen: Seen) -> None:
    keys = gw.keys
    auth = {"Authorization": f"Bearer {keys.admin}"}
    with httpx.Client(base_url=gw.admin_url, timeout=60) as admin:
        def call(method: str, path: str, **kwargs: object) -> httpx.Response:
            answer = admin.request(method, path, headers=auth, **kwargs)  # type: ignore[arg-type]
            return seen.response(f"admin {method} {path}", answer)

        mount = {"name": "sec-mounted", "source": "s3://sec-source/data", "endpoint": moto_endpoint,
                 "access_key": "sec-mount-access", "secret_key": keys.mount}
        assert call("POST", "/mounts", json=mount).status_code == 201
        refused = [mount | {"name": "sec-missing", "source": "s3://no-such-source-bucket"},
                   mount | {"name": "sec-refused", "endpoint": f"http://127.0.0.1:{free_port()}"},
                   mount | {"name": "sec-bad", "endpoint": f"http://user:{keys.mount}@127.0.0.1:1"},
                   mount | {"name": "Bad_Name"}]
        for body in refused:
            assert call("POST", "/mounts", json=body).status_code in (400, 502), body["name"]
        assert call("GET", "/mounts").json()["mounts"][0]["secret_key"] == "***"
        for request in ("GET /mounts/sec-mounted", "GET /config", "GET /metrics", "GET /stats", "GET /tiers",
                        "GET /buckets", "GET /jobs", "GET /buckets/nope", "DELETE /mounts/nope",
                        "GET /objects/sec-data/a", "POST /jobs/flush?wait=true", "POST /jobs/evict?wait=true",
                        "POST /buckets", "GET /openapi.json", "GET /docs", "GET /health", "GET /ready"):
            call(*request.split())
        call("POST", "/buckets", json={"name": "x", "part_size": "lots"})
        for token in ("wrong", keys.s3):
            answer = admin.get("/config", headers={"Authorization": f"Bearer {token}"})
            seen.response("admin with a wrong token", answer)
        config = call("GET", "/config").json()
        assert config["admin_token"] == config["capacity_secret_key"] == "***"
        assert config["credentials"] == {ACCESS_KEY: "***"}


def _exercise_cli(gw: SecretGateway, seen: Seen) -> None:
    runner = CliRunner()
    env = {"TIERSTORE_ADMIN_TOKEN": gw.keys.admin, "TIERSTORE_ADMIN_URL": gw.admin_url}
    for args in (["status"], ["stats"], ["mounts"], ["buckets"], ["jobs"], ["pins"], ["epochs"],
                 ["where", "sec-data", "a"], ["status", "--token", "wrong"], ["where", "nope", "k"]):
        result = runner.invoke(cli_app, args, env=env)
        seen.text(f"tierstore {' '.join(args)} (exit {result.exit_code})", result.output)
    result = runner.invoke(cli_app, ["status", "--token", gw.keys.admin],
                           env={"TIERSTORE_ADMIN_URL": gw.admin_url})
    assert result.exit_code == 0, result.output
    seen.text("tierstore status --token", result.output)


def test_no_secret_appears_in_logs_answers_or_cli_output(secret_gateway: SecretGateway,
                                                         moto_endpoint: str) -> None:
    seen = Seen()
    _exercise_s3(secret_gateway, seen)
    _exercise_admin(secret_gateway, moto_endpoint, seen)
    mounted = boto3.client("s3", endpoint_url=secret_gateway.endpoint, aws_access_key_id=ACCESS_KEY,
                           aws_secret_access_key=secret_gateway.keys.s3, region_name=REGION)
    assert mounted.get_object(Bucket="sec-mounted", Key="a")["Body"].read() == b"from the source"
    _exercise_cli(secret_gateway, seen)
    keys = secret_gateway.keys
    leaks = [f"{label}: {names}" for label, text in seen.texts if (names := keys.found_in(text))]
    assert not leaks, "secrets in answers or CLI output:\n" + "\n".join(leaks)
    assert len(seen.texts) > 50

    secret_gateway.stop()  # every line written
    log = secret_gateway.log()
    assert '"op": "GetObject"' in log or '"op":"GetObject"' in log, log[-2000:]  # the JSON access log
    assert "DEBUG" in log, log[-2000:]
    leaked = [line for line in log.splitlines() if secret_gateway.keys.found_in(line)]
    assert not leaked, "secrets in the gateway log:\n" + "\n".join(leaked[:20])


# -- where the admin port listens ----------------------------------------------------------


def _listeners(port: int) -> list[str]:
    """Local addresses of the sockets listening on ``port`` (from /proc/net)."""
    found = []
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, _, state = line.split()[1:4]
            address, _, port_hex = local.partition(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.append(_address(address))
    return found


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # /proc/net prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)


def test_the_admin_api_binds_loopback_by_default(gateway: Gateway) -> None:
    assert (Config().admin_host, Config().host) == ("127.0.0.1", "127.0.0.1")
    if not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp to read listening sockets from")
    for port in (gateway.admin_port, gateway.port):
        assert _listeners(port) == ["127.0.0.1"], (port, _listeners(port))


def _non_loopback_addresses() -> list[str]:
    found = set()
    try:
        found.update(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET))
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: picks the outgoing interface, sends nothing
            found.add(probe.getsockname()[0])
        except OSError:
            pass
    return sorted(a for a in found if not a.startswith("127.") and a != "0.0.0.0")


def test_the_admin_port_refuses_other_addresses_of_the_machine(gateway: Gateway) -> None:
    addresses = _non_loopback_addresses()
    if not addresses:
        pytest.skip("this machine has no address but loopback")
    for address in addresses:
        for port in (gateway.admin_port, gateway.port):
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=5).close()
