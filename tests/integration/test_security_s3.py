"""S3 authentication of a real gateway process.

- Every S3 operation the gateway routes (``gateway.routes.TABLE``, plus the
  variants that rename an operation and a few refused sub-resources and
  methods) is sent with each kind of bad credentials: none, a wrong secret,
  an unknown key, a presigned URL that expired or that was signed for
  another method, path or query, and SigV2 equivalents. Each answer is 403
  with S3's code, and afterwards a valid client finds nothing created,
  deleted or overwritten. test_errors.py and test_sigv2.py hold the single
  cases; this is the matrix.
- A presigned URL works until X-Amz-Expires runs out and not after; a
  lifetime of 0 has expired at once and one above 604800 s is refused, as
  S3 answers them.

The admin API's token is in test_security_admin.py, secrets kept out of
logs and answers in test_security_secrets.py.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from botocore.exceptions import ClientError

from gateway import routes
from tests.conftest import make_client
from tests.integration.s3raw import check_error_parts, sign
from tests.integration.security_common import (
    UNKNOWN_KEY,
    WRONG_SECRET,
    Call,
    v2_header,
    v2_presigned,
    v4_presigned,
)
from tests.servers import ACCESS_KEY, SECRET_KEY, Gateway

# -- the S3 route matrix ------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The state the matrix must leave alone."""

    bucket: str  # holds "k" and an open multipart upload of "mp"
    empty: str  # an empty bucket, the target of DeleteBucket
    new_bucket: str  # must never come to exist
    upload_id: str
    part_etag: str


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
        headers = v2_header(call, endpoint, access_key, secret)
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
    "v4-presigned-expired": (_url(lambda c, e: v4_presigned(
        c, e, when=datetime.now(UTC) - timedelta(hours=1), expires=60)), "AccessDenied"),
    "v4-presigned-other-method": (_url(lambda c, e: v4_presigned(c, e, method=_other_method(c))),
                                  "SignatureDoesNotMatch"),
    "v4-presigned-other-path": (_url(lambda c, e: v4_presigned(c, e, path=_other_path(c))),
                                "SignatureDoesNotMatch"),
    "v4-presigned-other-query": (_url(lambda c, e: v4_presigned(c, e, query=_other_query(c))),
                                 "SignatureDoesNotMatch"),
    "v4-presigned-wrong-secret": (_url(lambda c, e: v4_presigned(c, e, secret=WRONG_SECRET)),
                                  "SignatureDoesNotMatch"),
    "v2-wrong-secret": (_sigv2(ACCESS_KEY, WRONG_SECRET), "SignatureDoesNotMatch"),
    "v2-unknown-key": (_sigv2(UNKNOWN_KEY, SECRET_KEY), "InvalidAccessKeyId"),
    "v2-presigned-wrong-secret": (_url(lambda c, e: v2_presigned(c, e, ACCESS_KEY, WRONG_SECRET, 300)),
                                  "SignatureDoesNotMatch"),
    "v2-presigned-expired": (_url(lambda c, e: v2_presigned(c, e, ACCESS_KEY, SECRET_KEY, -60)),
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
    get_url = v4_presigned(get, gateway.endpoint, when=start, expires=1)
    put_url = v4_presigned(put, gateway.endpoint, when=start, expires=1)
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
    assert httpx.get(v4_presigned(get, gateway.endpoint, expires=604800)).content == b"original"
    put = Call("PutObject", "PUT", f"/{target.bucket}/week", body=b"w")
    for call in (get, put):
        url = v4_presigned(call, gateway.endpoint, expires=604801)
        response = httpx.request(call.method, url, content=call.body)
        root = check_error_parts(response.status_code, response.headers, response.content, 400,
                                 "AuthorizationQueryParametersError")
        assert root is not None and "604800" in (root.findtext("Message") or "")
    with pytest.raises(ClientError):
        make_client(gateway.endpoint).head_object(Bucket=target.bucket, Key="week")


def test_x_amz_expires_zero_is_refused_as_expired(gateway: Gateway, target: Target) -> None:
    # S3 takes X-Amz-Expires from 1 to 604800 and answers 0 403 "Request has
    # expired" (s3-tests' test_object_raw_get_x_amz_expires_out_range_zero).
    # boto3 will not sign ExpiresIn=0 (awscrt asserts > 0), so botocore's
    # pure-Python signer does; signed for now and for 2 s ahead (within the
    # skew S3 allows), so that the URL is still inside its X-Amz-Date second
    # when it arrives.
    now = datetime.now(UTC)
    get = Call("GetObject", "GET", f"/{target.bucket}/k")
    put = Call("PutObject", "PUT", f"/{target.bucket}/zero", body=b"zero")
    for when in (now, now + timedelta(seconds=2)):
        for call in (get, put):
            url = v4_presigned(call, gateway.endpoint, when=when, expires=0)
            assert "X-Amz-Expires=0&" in url
            response = httpx.request(call.method, url, content=call.body)
            root = check_error_parts(response.status_code, response.headers, response.content, 403,
                                     "AccessDenied")
            assert root is not None and root.findtext("Message") == "Request has expired"
            assert root.findtext("X-Amz-Expires") == "0"
    with pytest.raises(ClientError):
        make_client(gateway.endpoint).head_object(Bucket=target.bucket, Key="zero")
