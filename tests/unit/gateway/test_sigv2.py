"""SigV2 verification against what real clients send.

Requests are signed by botocore's own SigV2 signers (``HmacV1Auth`` and
``HmacV1QueryAuth``, and a default-config boto3 client's presigned URLs), then
fed to ``authenticate`` as the HTTP layer would see them; the S3 guide's
worked examples pin the canonical strings. No network.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from typing import Any
from urllib.parse import quote, urlsplit

import boto3
import pytest
from botocore.auth import HmacV1Auth, HmacV1QueryAuth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest, AWSResponse
from botocore.config import Config
from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.auth import sigv2
from gateway.auth.sigv4 import AuthContext, authenticate
from gateway.s3.errors import S3Error

AK = "AKIDTIERSTORETEST"
SECRET = "s3cr3t/KEY+with=odd chars ü"
ENDPOINT = "http://127.0.0.1:9100"
KEYS = {AK: SECRET}

Wire = tuple[str, str, str, dict[str, str]]


def _now() -> datetime:
    return datetime.now(UTC)


def _wire(request: AWSRequest | AWSPreparedRequest) -> Wire:
    """What the server sees: method, raw path, raw query, lower-cased headers
    (values stripped, as an HTTP parser delivers them)."""
    parts = urlsplit(request.url)
    headers = {
        k.lower(): (v.decode("latin-1") if isinstance(v, bytes) else v).strip()
        for k, v in request.headers.items()
    }
    headers.setdefault("host", parts.netloc)
    return request.method, parts.path, parts.query, headers


def _request(method: str, path: str, query: str = "", headers: dict[str, str] | None = None,
             body: bytes = b"") -> AWSRequest:
    url = ENDPOINT + path + (f"?{query}" if query else "")
    return AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))


def signed(method: str = "GET", path: str = "/bucket/key", query: str = "",
           headers: dict[str, str] | None = None, body: bytes = b"",
           secret: str = SECRET) -> Wire:
    """``Authorization: AWS AK:signature``, as boto3 with signature_version='s3' sends."""
    request = _request(method, path, query, headers, body)
    HmacV1Auth(Credentials(AK, secret)).add_auth(request)
    return _wire(request)


def presigned(method: str = "GET", path: str = "/bucket/key", query: str = "",
              headers: dict[str, str] | None = None, expires: int = 3600,
              secret: str = SECRET) -> Wire:
    """A query-auth URL, fetched by a browser: no headers but Host."""
    request = _request(method, path, query, headers)
    HmacV1QueryAuth(Credentials(AK, secret), expires=expires).add_auth(request)
    method, path, query, wire_headers = _wire(request)
    return method, path, query, {"host": wire_headers["host"]}


def auth(wire: Wire, now: datetime | None = None, host_bucket: str = "",
         keys: dict[str, str] = KEYS) -> AuthContext:
    method, path, query, headers = wire
    return authenticate(method, path, query, headers, keys.get, now or _now(), host_bucket)


def refused(wire: Wire, code: str, now: datetime | None = None) -> S3Error:
    with pytest.raises(S3Error) as caught:
        auth(wire, now)
    assert caught.value.code == code, caught.value
    return caught.value


def _query(wire: Wire, **replace: str) -> Wire:
    """The wire with query parameters replaced (values given encoded)."""
    method, path, query, headers = wire
    pairs = [p.partition("=") for p in query.split("&")]
    query = "&".join(f"{n}={replace.get(n, v)}" if sep else n for n, sep, v in pairs)
    return method, path, query, headers


# -- header auth -------------------------------------------------------------


def test_header_auth_returns_the_context() -> None:
    ctx = auth(signed("PUT", "/bucket/key", body=b"hello"))
    assert ctx == AuthContext(access_key=AK, payload_hash="UNSIGNED-PAYLOAD", signing_key=b"",
                              amz_date="", scope="", seed_signature="")


def test_content_headers_and_amz_headers_are_signed() -> None:
    md5 = base64.b64encode(b"0123456789abcdef").decode()
    wire = signed("PUT", "/bucket/key", body=b"x", headers={
        "Content-Type": "text/plain; charset=utf-8", "Content-MD5": md5,
        "X-Amz-Meta-Owner": "alice", "x-amz-meta-Note": "  two   spaces  ",
        "X-Amz-Storage-Class": "STANDARD", "X-Amz-Checksum-Crc32": "AAAAAA==",
    })
    auth(wire)
    method, path, query, headers = wire
    for name, value in [("content-type", "text/html"), ("content-md5", "x" + md5[1:]),
                        ("x-amz-meta-owner", "mallory"), ("x-amz-storage-class", "GLACIER")]:
        refused((method, path, query, {**headers, name: value}), "SignatureDoesNotMatch")
    refused((method, path, query, {**headers, "x-amz-acl": "public-read"}),
            "SignatureDoesNotMatch")  # every x-amz-* header is signed
    auth((method, path, query, {**headers, "user-agent": "other", "content-length": "1"}))


KEY_CASES = [
    "with space", "a+b", "100%", "50%25", "ünïcødé/日本語", "a//b", "k=v&x=y",
    "./dot/../segments", "q?h#f", "~tilde*star'quote", "trailing/", "emoji😀",
]


@pytest.mark.parametrize("key", KEY_CASES)
def test_odd_keys_verify_with_header_auth(key: str) -> None:
    auth(signed("PUT", "/bucket/" + quote(key, safe="/~"), body=b"x"))


@pytest.mark.parametrize("key", KEY_CASES)
def test_odd_keys_verify_presigned(key: str) -> None:
    auth(presigned("GET", "/bucket/" + quote(key, safe="/~")))


def test_path_sent_raw_but_signed_encoded_verifies() -> None:
    method, _, query, headers = signed("GET", "/bucket/a%2Bb%3Dc")
    auth((method, "/bucket/a+b=c", query, headers))


@pytest.mark.parametrize("query,canonical", [
    ("acl", "?acl"),
    ("uploads", "?uploads"),
    ("uploadId=abc%2Bdef%2F&partNumber=3", "?partNumber=3&uploadId=abc+def/"),
    ("versionId=v1&tagging", "?tagging&versionId=v1"),
    ("delete", "?delete"),
    ("list-type=2&prefix=a%2Fb&delimiter=%2F", ""),  # not sub-resources: unsigned
])
def test_sub_resources(query: str, canonical: str) -> None:
    assert sigv2._sub_resources(query) == canonical
    auth(signed("GET", "/bucket/key", query))
    auth(presigned("GET", "/bucket/key", query))


def test_tampered_sub_resource() -> None:
    method, path, query, headers = signed("PUT", "/bucket/key", "partNumber=1&uploadId=u1")
    refused((method, path, "partNumber=2&uploadId=u1", headers), "SignatureDoesNotMatch")
    refused((method, path, "partNumber=1&uploadId=u2", headers), "SignatureDoesNotMatch")
    refused((method, path, "partNumber=1&uploadId=u1&acl", headers), "SignatureDoesNotMatch")


@pytest.mark.parametrize("added", [
    "%61cl",  # "acl", encoded: the router decodes names
    "%75ploadId=u1&partNumber=1",
    "%72esponse-content-type=text%2Fhtml",
    "response-content-type=text%2Fhtml",
])
def test_added_sub_resource_is_refused(added: str) -> None:
    method, path, query, headers = presigned("PUT", "/bucket/key")
    refused((method, path, f"{query}&{added}", headers), "SignatureDoesNotMatch")
    method, path, query, headers = signed("PUT", "/bucket/key")
    refused((method, path, added, headers), "SignatureDoesNotMatch")


def test_sub_resource_value_read_as_the_router_reads_it() -> None:
    # '+' is a space to the router (parse_qsl): "a+b" is not the signed "a%2Bb".
    method, path, query, headers = signed("PUT", "/bucket/key", "partNumber=1&uploadId=a%2Bb")
    auth((method, path, query, headers))
    refused((method, path, "partNumber=1&uploadId=a+b", headers), "SignatureDoesNotMatch")


@pytest.mark.parametrize("name", sorted(sigv2.UNSIGNABLE))
def test_unsignable_sub_resources_are_refused(name: str) -> None:
    # SigV2 signers leave these out of the signature, so they would be free to add.
    error = refused(signed("GET", "/bucket/key", name), "InvalidRequest")
    assert "AWS4-HMAC-SHA256" in error.message
    refused(presigned("GET", "/bucket/key", f"{name}="), "InvalidRequest")


def test_every_routed_sub_resource_is_signed_or_refused() -> None:
    from gateway import routes

    assert routes.SUB_RESOURCES <= sigv2.SUB_RESOURCES | sigv2.UNSIGNABLE
    assert not sigv2.SUB_RESOURCES & sigv2.UNSIGNABLE


def test_response_overrides_are_signed() -> None:
    query = "response-content-type=text%2Fplain%3B%20charset%3Dutf-8&response-expires=0"
    auth(signed("GET", "/bucket/key", query))
    wire = presigned("GET", "/bucket/key", query)
    auth(wire)
    refused(_query(wire, **{"response-content-type": "text%2Fhtml"}), "SignatureDoesNotMatch")


def test_virtual_hosted_request() -> None:
    # botocore signs the bucket's path-style auth_path; the Host names the bucket.
    request = AWSRequest(method="GET", url="http://bucket.s3.local:9100/dir/key?acl")
    request.auth_path = "/bucket/dir/key"
    HmacV1Auth(Credentials(AK, SECRET)).add_auth(request)
    wire = _wire(request)
    auth(wire, host_bucket="bucket")
    with pytest.raises(S3Error) as caught:
        auth(wire)  # read as path style, it names another resource
    assert caught.value.code == "SignatureDoesNotMatch"


def test_x_amz_date_with_botocore_date() -> None:
    # botocore signs its Date header even beside an x-amz-date.
    auth(signed(headers={"X-Amz-Date": formatdate(usegmt=True)}))


def test_x_amz_date_with_empty_date_line() -> None:
    # The guide's rule: with x-amz-date, the Date line is empty.
    stamp = formatdate(usegmt=True)
    string_to_sign = f"GET\n\n\n\nx-amz-date:{stamp}\n/bucket/key"
    signature = sigv2._sign(SECRET, string_to_sign)
    auth(("GET", "/bucket/key", "", {"host": "h", "x-amz-date": stamp,
                                      "authorization": f"AWS {AK}:{signature}"}))


def test_presigned_content_type_and_amz_headers_travel_in_the_query() -> None:
    wire = presigned("PUT", "/bucket/key", headers={
        "Content-Type": "text/plain", "X-Amz-Meta-Owner": "alice"})
    assert "content-type=text%2Fplain" in wire[2] and "x-amz-meta-owner=alice" in wire[2]
    auth(wire)
    method, path, query, headers = wire
    auth((method, path, query, {**headers, "content-type": "text/plain"}))
    refused((method, path, query, {**headers, "content-type": "text/html"}),
            "SignatureDoesNotMatch")
    refused((method, path, query, {**headers, "x-amz-acl": "public-read"}),
            "SignatureDoesNotMatch")
    refused(_query(wire, **{"x-amz-meta-owner": "mallory"}), "SignatureDoesNotMatch")


def test_signature_with_unencoded_plus() -> None:
    # Some clients put the base64 signature in the query without encoding '+'.
    for attempt in range(50):  # find a signature with a '+' in it
        wire = presigned(query=f"versionId={attempt}")
        signature = dict(p.split("=", 1) for p in wire[2].split("&"))["Signature"]
        if "%2B" in signature:
            break
    else:
        pytest.skip("no signature with '+' in 50 tries")
    auth(_query(wire, Signature=signature.replace("%2B", "+")))


# -- boto3 (its default presigned URLs are SigV2 for a custom endpoint) -------


@pytest.fixture
def default_client() -> Iterator[Any]:
    client = boto3.client("s3", endpoint_url=ENDPOINT, region_name="us-east-1",
                          aws_access_key_id=AK, aws_secret_access_key=SECRET)
    yield client
    client.close()


@pytest.mark.parametrize("operation,params", [
    ("get_object", {"Key": "dir/a+b=c d ü.txt"}),
    ("get_object", {"Key": "k", "ResponseContentType": "text/plain",
                    "ResponseContentDisposition": 'attachment; filename="x y.txt"'}),
    ("get_object", {"Key": "k", "VersionId": "v+1"}),
    ("put_object", {"Key": "k", "ContentType": "application/json", "Metadata": {"a": "b c"}}),
    ("upload_part", {"Key": "k", "UploadId": "up/load+id==", "PartNumber": 7}),
    ("list_objects_v2", {"Prefix": "a b/"}),
])
def test_boto3_default_presigned_urls_verify(default_client: Any, operation: str,
                                             params: dict[str, Any]) -> None:
    url = default_client.generate_presigned_url(
        operation, Params={"Bucket": "bucket", **params}, ExpiresIn=600)
    parts = urlsplit(url)
    assert "AWSAccessKeyId=" in parts.query and "X-Amz-Algorithm" not in parts.query
    method = {"put_object": "PUT", "upload_part": "PUT"}.get(operation, "GET")
    assert auth((method, parts.path, parts.query, {"host": parts.netloc})).access_key == AK


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, *args: object, **kwargs: object) -> Iterator[bytes]:
        yield self.data


def test_boto3_sigv2_header_auth_requests_verify() -> None:
    """A client with signature_version='s3', its requests captured before they are sent."""
    sent: list[Wire] = []
    answers = {
        "uploads": b"<InitiateMultipartUploadResult><UploadId>u+1/=</UploadId>"
                   b"</InitiateMultipartUploadResult>",
        "delete": b"<DeleteResult></DeleteResult>",
        "list-type": b"<ListBucketResult></ListBucketResult>",
    }

    def capture(request: AWSRequest, **_: object) -> AWSResponse:
        sent.append(_wire(request))
        query = urlsplit(request.url).query
        body = next((v for k, v in answers.items() if k in query), b"")
        return AWSResponse(request.url, 200, {"ETag": '"etag"'}, _Body(body))

    client = boto3.client(
        "s3", endpoint_url=ENDPOINT, region_name="us-east-1", aws_access_key_id=AK,
        aws_secret_access_key=SECRET, config=Config(signature_version="s3"))
    client.meta.events.register("before-send.s3", capture)
    try:
        client.put_object(Bucket="bucket", Key="dir/a+b=c d ü.txt", Body=b"data",
                          ContentType="text/plain", Metadata={"owner": "alice"})
        client.get_object(Bucket="bucket", Key="x y", Range="bytes=0-9",
                          ResponseContentType="text/html")
        client.list_objects_v2(Bucket="bucket", Prefix="a/b c", Delimiter="/")
        upload = client.create_multipart_upload(Bucket="bucket", Key="mp")["UploadId"]
        client.upload_part(Bucket="bucket", Key="mp", UploadId=upload, PartNumber=1, Body=b"p")
        client.delete_objects(Bucket="bucket", Delete={"Objects": [{"Key": "a"}]})
        client.delete_object(Bucket="bucket", Key="x y")
    finally:
        client.close()
    assert len(sent) == 7
    for wire in sent:
        assert wire[3]["authorization"].startswith(f"AWS {AK}:")
        auth(wire)


# -- refusals ----------------------------------------------------------------


def test_wrong_secret() -> None:
    error = refused(signed(secret="not-the-secret"), "SignatureDoesNotMatch")
    assert error.status == 403
    assert error.fields["StringToSign"].startswith("GET\n\n\n")
    assert error.fields["StringToSign"].endswith("\n/bucket/key")
    refused(presigned(secret="not-the-secret"), "SignatureDoesNotMatch")


def test_unknown_access_key() -> None:
    for wire in (signed(), presigned()):
        with pytest.raises(S3Error) as caught:
            auth(wire, keys={})
        assert caught.value.code == "InvalidAccessKeyId" and caught.value.status == 403
        assert caught.value.fields["AWSAccessKeyId"] == AK


def test_presigned_expired() -> None:
    error = refused(presigned(expires=60), "AccessDenied", now=_now() + timedelta(seconds=120))
    assert error.message == "Request has expired"
    assert error.status == 403


def test_presigned_long_expiry_is_accepted() -> None:
    # SigV2 has no 7-day cap (that is X-Amz-Expires, SigV4 only).
    auth(presigned(expires=30 * 86400), now=_now() + timedelta(days=29))


@pytest.mark.parametrize("expires", ["soon", "-5", "1e9", "", "99999999999999999999999"])
def test_presigned_bad_expires(expires: str) -> None:
    wire = _query(presigned(), Expires=expires)
    if expires.isdigit():  # far in the future: valid, but the signature no longer matches
        refused(wire, "SignatureDoesNotMatch")
    else:
        refused(wire, "AccessDenied")


def test_presigned_missing_parameter() -> None:
    method, path, query, headers = presigned()
    query = "&".join(p for p in query.split("&") if not p.startswith("Expires="))
    refused((method, path, query, headers), "AccessDenied")


def test_presigned_tampered_path_and_method() -> None:
    method, path, query, headers = presigned()
    refused((method, "/bucket/other", query, headers), "SignatureDoesNotMatch")
    refused(("DELETE", path, query, headers), "SignatureDoesNotMatch")


@pytest.mark.parametrize("minutes", [-16, 16])
def test_clock_skew(minutes: int) -> None:
    error = refused(signed(), "RequestTimeTooSkewed", now=_now() + timedelta(minutes=minutes))
    assert error.status == 403
    refused(signed(headers={"X-Amz-Date": formatdate(usegmt=True)}), "RequestTimeTooSkewed",
            now=_now() + timedelta(minutes=minutes))


def test_small_skew_is_fine() -> None:
    auth(signed(), now=_now() + timedelta(minutes=14))


@pytest.mark.parametrize("date", [None, "yesterday"])
def test_missing_or_invalid_date(date: str | None) -> None:
    method, path, query, headers = signed()
    del headers["date"]
    if date is not None:
        headers["x-amz-date"] = date
    refused((method, path, query, headers), "AccessDenied")


def test_tampered_header_auth() -> None:
    method, path, query, headers = signed("PUT", "/bucket/key", body=b"x")
    refused((method, "/bucket/other", query, headers), "SignatureDoesNotMatch")
    refused(("DELETE", path, query, headers), "SignatureDoesNotMatch")
    later = formatdate((_now() + timedelta(seconds=5)).timestamp(), usegmt=True)
    refused((method, path, query, {**headers, "date": later}), "SignatureDoesNotMatch")


@pytest.mark.parametrize("value", ["AWS ", "AWS AKID", "AWS :sig", "AWS AKID:"])
def test_malformed_authorization(value: str) -> None:
    method, path, query, headers = signed()
    refused((method, path, query, {**headers, "authorization": value}), "InvalidArgument")


def test_header_and_query_auth_together() -> None:
    method, path, query, _ = presigned()
    refused((method, path, query, signed()[3]), "InvalidArgument")


def test_aws_chunked_is_refused() -> None:
    wire = signed("PUT", headers={"X-Amz-Content-SHA256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
                                  "Content-Encoding": "aws-chunked"})
    refused(wire, "InvalidRequest")


def test_signatures_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def compare_digest(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(sigv2.hmac, "compare_digest", compare_digest)
    auth(signed())
    refused(presigned(secret="not-the-secret"), "SignatureDoesNotMatch")
    assert len(calls) >= 2


# -- the S3 guide's worked examples ------------------------------------------
# ("Signing and authenticating REST requests"; the signatures were computed
# with the bucket "johnsmith", which later versions of the page renamed.)

DOC_KEYS = {"AKIAIOSFODNN7EXAMPLE": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}


def _doc(method: str, path: str, query: str, headers: dict[str, str], signature: str,
         now: datetime, host_bucket: str = "") -> AuthContext:
    headers = {**headers, "authorization": f"AWS AKIAIOSFODNN7EXAMPLE:{signature}"}
    return auth((method, path, query, headers), now, host_bucket, DOC_KEYS)


def _at(text: str) -> datetime:
    return datetime.strptime(text, "%d %b %Y %H:%M:%S").replace(tzinfo=UTC)


@pytest.mark.parametrize("method,path,query,headers,signature,host_bucket", [
    ("GET", "/photos/puppy.jpg", "", {"date": "Tue, 27 Mar 2007 19:36:42 +0000"},
     "bWq2s1WEIj+Ydj0vQ697zp+IXMU=", "johnsmith"),
    ("PUT", "/photos/puppy.jpg", "", {"date": "Tue, 27 Mar 2007 21:15:45 +0000",
                                      "content-type": "image/jpeg", "content-length": "94328"},
     "MyyxeRY7whkBe+bq8fHCL/2kKUg=", "johnsmith"),
    ("GET", "/", "prefix=photos&max-keys=50&marker=puppy",
     {"date": "Tue, 27 Mar 2007 19:42:41 +0000", "user-agent": "Mozilla/5.0"},
     "htDYFYduRNen8P9ZfE/s9SuKy0U=", "johnsmith"),
    ("GET", "/", "acl", {"date": "Tue, 27 Mar 2007 19:44:46 +0000"},
     "c2WLPFtWHVgbEmeEG93a4cG37dM=", "johnsmith"),
    # x-amz-date's value in the Date line, as this example signs it
    ("DELETE", "/johnsmith/photos/puppy.jpg", "",
     {"date": "Tue, 27 Mar 2007 21:20:27 +0000", "x-amz-date": "Tue, 27 Mar 2007 21:20:26 +0000"},
     "lx3byBScXR6KzyMaifNkardMwNk=", ""),
    ("PUT", "/db-backup.dat.gz", "", {
        "date": "Tue, 27 Mar 2007 21:06:08 +0000", "x-amz-acl": "public-read",
        "content-type": "application/x-download", "content-md5": "4gJE4saaMU4BqNR0kLY+lw==",
        "x-amz-meta-reviewedby": "joe@johnsmith.net,jane@johnsmith.net",
        "x-amz-meta-filechecksum": "0x02661779", "x-amz-meta-checksumalgorithm": "crc32",
        "content-disposition": "attachment; filename=database.dat", "content-encoding": "gzip",
    }, "ilyl83RwaSoYIEdixDQcA4OnAnc=", "static.johnsmith.net"),
    ("GET", "/", "", {"date": "Wed, 28 Mar 2007 01:29:59 +0000"},
     "qGdzdERIC03wnaRNKh6OqZehG9s=", ""),
    ("GET", "/dictionary/fran%C3%A7ais/pr%c3%a9f%c3%a8re", "",
     {"date": "Wed, 28 Mar 2007 01:49:49 +0000"}, "DNEZGsoieTZ92F3bUfSPQcbGmlM=", ""),
])
def test_doc_examples(method: str, path: str, query: str, headers: dict[str, str],
                      signature: str, host_bucket: str) -> None:
    now = _at(headers["date"][5:25]) + timedelta(seconds=30)
    _doc(method, path, query, headers, signature, now, host_bucket)


def test_doc_query_string_example() -> None:
    query = ("AWSAccessKeyId=AKIAIOSFODNN7EXAMPLE&Signature=NpgCjnDzrM%2BWFzoENXmpNDUsSn8%3D"
             "&Expires=1175139620")
    wire: Wire = ("GET", "/photos/puppy.jpg", query, {"host": "johnsmith.s3.amazonaws.com"})
    before = datetime.fromtimestamp(1175139620 - 60, UTC)
    auth(wire, before, "johnsmith", DOC_KEYS)
    with pytest.raises(S3Error) as caught:
        auth(wire, before + timedelta(seconds=120), "johnsmith", DOC_KEYS)
    assert caught.value.message == "Request has expired"


# -- property ----------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=200))
def test_any_key_signed_by_botocore_verifies(key: str) -> None:
    path = "/bucket/" + quote(key, safe="/~")
    auth(signed("PUT", path, body=b"x"))
    auth(presigned("GET", path))


@settings(max_examples=100, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_any_sub_resource_value_verifies(value: str) -> None:
    query = f"uploadId={quote(value, safe='')}&partNumber=1"
    auth(signed("PUT", "/bucket/key", query))
    auth(presigned("PUT", "/bucket/key", query))
