"""SigV4 verification against what real clients send.

Requests are signed by botocore itself (its signers, and a boto3 client whose
requests are captured before they leave the process), then fed to
``authenticate`` as the HTTP layer would see them. No network.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlsplit

import boto3
import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest, AWSResponse
from botocore.config import Config
from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.auth.sigv4 import AuthContext, authenticate
from gateway.s3.errors import S3Error
from tiering.capacity.sigv4 import signing_key

AK = "AKIDTIERSTORETEST"
SECRET = "s3cr3t/KEY+with=odd chars"
ENDPOINT = "http://127.0.0.1:9100"
KEYS = {AK: SECRET}

Wire = tuple[str, str, str, dict[str, str]]


def _now() -> datetime:
    return datetime.now(UTC)


def _wire(request: AWSRequest | AWSPreparedRequest) -> Wire:
    """What the server sees: method, raw path, raw query, lower-cased headers."""
    parts = urlsplit(request.url)
    headers = {
        k.lower(): v.decode("latin-1") if isinstance(v, bytes) else v
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
           secret: str = SECRET, region: str = "us-east-1") -> Wire:
    request = _request(method, path, query, headers, body)
    S3SigV4Auth(Credentials(AK, secret), "s3", region).add_auth(request)
    return _wire(request)


def presigned(method: str = "GET", path: str = "/bucket/key", query: str = "",
              expires: int | str = 3600, secret: str = SECRET) -> Wire:
    request = _request(method, path, query)
    S3SigV4QueryAuth(Credentials(AK, secret), "s3", "us-east-1", expires=expires).add_auth(request)
    method, path, query, headers = _wire(request)
    return method, path, query, {"host": headers["host"]}  # a browser sends no x-amz-*


def auth(wire: Wire, now: datetime | None = None) -> AuthContext:
    method, path, query, headers = wire
    return authenticate(method, path, query, headers, KEYS.get, now or _now())


def refused(wire: Wire, code: str, now: datetime | None = None) -> S3Error:
    with pytest.raises(S3Error) as caught:
        auth(wire, now)
    assert caught.value.code == code, caught.value
    return caught.value


def _authorization(headers: dict[str, str]) -> dict[str, str]:
    rest = headers["authorization"].split(" ", 1)[1]
    return dict(part.strip().split("=", 1) for part in rest.split(","))


# -- header auth -------------------------------------------------------------


def test_header_auth_returns_the_context() -> None:
    wire = signed("PUT", "/bucket/key", body=b"hello")
    ctx = auth(wire)
    headers = wire[3]
    assert ctx.access_key == AK
    assert ctx.payload_hash == hashlib.sha256(b"hello").hexdigest()
    assert ctx.amz_date == headers["x-amz-date"]
    assert ctx.scope == f"{headers['x-amz-date'][:8]}/us-east-1/s3/aws4_request"
    assert ctx.seed_signature == _authorization(headers)["Signature"]
    assert ctx.signing_key == signing_key(SECRET, ctx.amz_date[:8], "us-east-1")
    assert "signing_key" not in repr(ctx)


def test_any_region_is_accepted() -> None:
    assert auth(signed(region="eu-west-3")).scope.endswith("/eu-west-3/s3/aws4_request")


KEY_CASES = [
    "with space", "a+b", "100%", "50%25", "ünïcødé/日本語", "a//b", "/leading", "k=v&x=y",
    "./dot/../segments", "q?h#f", "~tilde*star'quote", "trailing/", "emoji😀",
]


@pytest.mark.parametrize("key", KEY_CASES)
def test_odd_keys_verify_with_header_auth(key: str) -> None:
    auth(signed("PUT", "/bucket/" + quote(key, safe="/~"), body=b"x"))


@pytest.mark.parametrize("key", KEY_CASES)
def test_odd_keys_verify_presigned(key: str) -> None:
    auth(presigned("GET", "/bucket/" + quote(key, safe="/~")))


def test_path_sent_raw_but_signed_encoded_verifies() -> None:
    # Some clients sign '+' and '=' encoded but put them on the wire raw.
    method, _, query, headers = signed("GET", "/bucket/a%2Bb%3Dc")
    auth((method, "/bucket/a+b=c", query, headers))


def test_path_sent_with_lower_case_escapes_verifies() -> None:
    method, _, query, headers = signed("GET", "/bucket/%C3%BC")
    auth((method, "/bucket/%c3%bc", query, headers))


def test_query_with_several_parameters() -> None:
    auth(signed("GET", "/bucket", "list-type=2&prefix=a%2Fb&delimiter=%2F"))


def test_query_params_encoded_by_botocore() -> None:
    request = AWSRequest(method="GET", url=ENDPOINT + "/bucket",
                         params={"prefix": "a b/ü+~", "marker": "", "delimiter": "/"})
    S3SigV4Auth(Credentials(AK, SECRET), "s3", "us-east-1").add_auth(request)
    auth(_wire(request.prepare()))


def test_query_parameter_without_value() -> None:
    auth(signed("GET", "/bucket", "uploads="))
    method, path, query, headers = signed("GET", "/bucket/key", "acl=")
    auth((method, path, "acl", headers))


def test_header_whitespace_is_trimmed_and_collapsed() -> None:
    auth(signed(headers={"X-Amz-Meta-Note": "  two   spaces\tand tab  "}))


def test_date_header_instead_of_x_amz_date() -> None:
    wire = signed(headers={"Date": "placeholder"})  # botocore rewrites it to the signing time
    assert "x-amz-date" not in wire[3]
    ctx = auth(wire)
    assert ctx.amz_date.endswith("Z") and len(ctx.amz_date) == 16


@pytest.mark.parametrize("mode", [
    "UNSIGNED-PAYLOAD", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER", "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
])
def test_payload_modes_are_returned_unverified(mode: str) -> None:
    # SigV4Auth (not S3SigV4Auth) keeps the x-amz-content-sha256 we set.
    request = _request("PUT", "/bucket/key", headers={"X-Amz-Content-SHA256": mode})
    SigV4Auth(Credentials(AK, SECRET), "s3", "us-east-1").add_auth(request)
    assert auth(_wire(request)).payload_hash == mode


# -- boto3 end to end (requests captured before they are sent) -----------------


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, *args: object, **kwargs: object) -> Iterator[bytes]:
        yield self.data


@pytest.fixture
def boto3_client() -> Iterator[tuple[Any, list[Wire]]]:
    sent: list[Wire] = []
    listing = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
               b'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"></ListBucketResult>')

    def capture(request: AWSRequest, **_: object) -> AWSResponse:
        sent.append(_wire(request))
        return AWSResponse(request.url, 200, {"ETag": '"etag"'}, _Body(listing))

    client = boto3.client(
        "s3", endpoint_url=ENDPOINT, region_name="us-east-1",
        aws_access_key_id=AK, aws_secret_access_key=SECRET,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    client.meta.events.register("before-send.s3", capture)
    yield client, sent
    client.close()


def test_boto3_requests_verify(boto3_client: tuple[Any, list[Wire]]) -> None:
    client, sent = boto3_client
    client.put_object(Bucket="bucket", Key="dir/a+b=c d ü.txt", Body=b"data")
    client.list_objects_v2(Bucket="bucket", Prefix="a/b c", Delimiter="/")
    client.get_object(Bucket="bucket", Key="x y", Range="bytes=0-9")
    assert len(sent) == 3
    for wire in sent:
        auth(wire)


def test_boto3_presigned_url_verifies(boto3_client: tuple[Any, list[Wire]]) -> None:
    client, _ = boto3_client
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": "bucket", "Key": "dir/a+b=c d ü.txt"}, ExpiresIn=600)
    parts = urlsplit(url)
    ctx = auth(("GET", parts.path, parts.query, {"host": parts.netloc}))
    assert ctx.payload_hash == "UNSIGNED-PAYLOAD"


# -- presigned URLs ----------------------------------------------------------


def test_presigned_returns_the_context() -> None:
    wire = presigned()
    ctx = auth(wire)
    assert ctx.payload_hash == "UNSIGNED-PAYLOAD"
    assert wire[2].endswith("X-Amz-Signature=" + ctx.seed_signature)


def test_presigned_expired() -> None:
    error = refused(presigned(expires=60), "AccessDenied", now=_now() + timedelta(seconds=120))
    assert error.message == "Request has expired"
    assert error.status == 403


def test_presigned_not_yet_valid() -> None:
    refused(presigned(), "AccessDenied", now=_now() - timedelta(minutes=20))


@pytest.mark.parametrize(("expires", "message"), [
    (604801, ("X-Amz-Expires must be less than a week (in seconds); that is, the given X-Amz-Expires "
              "must be less than 604800 seconds")),
    (-1, "X-Amz-Expires must be non-negative"),
])
def test_presigned_expires_out_of_range(expires: int, message: str) -> None:
    assert refused(presigned(expires=expires), "AuthorizationQueryParametersError").message == message


def _signed_at(wire: Wire) -> datetime:
    stamp = next(p for p in wire[2].split("&") if p.startswith("X-Amz-Date="))
    return datetime.strptime(stamp.partition("=")[2], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


@pytest.mark.parametrize("expires", ["0", "-0"])
def test_presigned_expires_zero_has_expired(expires: str) -> None:
    # S3 takes X-Amz-Expires from 1 to 604800 and answers 0 as an expired
    # request (403), even within the second of X-Amz-Date or before it.
    wire = presigned(expires=expires)
    assert f"X-Amz-Expires={expires}&" in wire[2]
    signed_at = _signed_at(wire)
    for now in (signed_at - timedelta(seconds=5), signed_at,
                signed_at + timedelta(microseconds=999_999), signed_at + timedelta(seconds=1)):
        error = refused(wire, "AccessDenied", now=now)
        assert (error.status, error.message) == (403, "Request has expired")
        assert error.fields["X-Amz-Expires"] == "0"


def test_presigned_expires_one_is_good_through_its_second() -> None:
    wire = presigned(expires=1)
    signed_at = _signed_at(wire)
    auth(wire, now=signed_at + timedelta(seconds=1, microseconds=999_999))
    error = refused(wire, "AccessDenied", now=signed_at + timedelta(seconds=2))
    assert (error.status, error.message) == (403, "Request has expired")


def test_presigned_expires_max_is_accepted() -> None:
    auth(presigned(expires=604800))


def test_presigned_expires_not_a_number() -> None:
    method, path, query, headers = presigned()
    query = query.replace("X-Amz-Expires=3600", "X-Amz-Expires=soon")
    refused((method, path, query, headers), "AuthorizationQueryParametersError")


def test_presigned_missing_parameter() -> None:
    method, path, query, headers = presigned()
    query = "&".join(p for p in query.split("&") if not p.startswith("X-Amz-Date="))
    refused((method, path, query, headers), "AuthorizationQueryParametersError")


def test_presigned_tampered_query() -> None:
    method, path, query, headers = presigned(query="response-content-type=text%2Fplain")
    query = query.replace("text%2Fplain", "text%2Fhtml")
    refused((method, path, query, headers), "SignatureDoesNotMatch")


def test_presigned_rejects_added_amz_header() -> None:
    method, path, query, headers = presigned("PUT")
    error = refused((method, path, query, {**headers, "x-amz-acl": "public-read"}),
                    "AccessDenied")
    assert error.fields["HeadersNotSigned"] == "x-amz-acl"


def test_sigv2_presigned_url_goes_to_sigv2() -> None:
    # Verified by gateway.auth.sigv2 (tests/unit/gateway/test_sigv2.py), not refused.
    query = "AWSAccessKeyId=AK&Signature=abc%3D&Expires=4102444800"  # in 2100
    error = refused(("GET", "/b/k", query, {"host": "h"}), "InvalidAccessKeyId")
    assert error.fields["AWSAccessKeyId"] == "AK"
    expired = "AWSAccessKeyId=AK&Signature=abc%3D&Expires=1"
    assert refused(("GET", "/b/k", expired, {"host": "h"}),
                   "AccessDenied").message == "Request has expired"


def test_both_mechanisms_is_refused() -> None:
    method, path, query, _ = presigned()
    _, _, _, headers = signed()
    refused((method, path, query, headers), "InvalidArgument")


# -- refusals ----------------------------------------------------------------


def test_wrong_secret() -> None:
    error = refused(signed(secret="not-the-secret"), "SignatureDoesNotMatch")
    assert error.status == 403
    assert error.fields["CanonicalRequest"].startswith("GET\n/bucket/key\n")
    refused(presigned(secret="not-the-secret"), "SignatureDoesNotMatch")


def test_unknown_access_key() -> None:
    method, path, query, headers = signed()
    with pytest.raises(S3Error) as caught:
        authenticate(method, path, query, headers, lambda _: None, _now())
    assert caught.value.code == "InvalidAccessKeyId" and caught.value.status == 403


@pytest.mark.parametrize("minutes", [-16, 16])
def test_clock_skew(minutes: int) -> None:
    refused(signed(), "RequestTimeTooSkewed", now=_now() + timedelta(minutes=minutes))


def test_small_skew_is_fine() -> None:
    auth(signed(), now=_now() + timedelta(minutes=14))


def test_anonymous() -> None:
    refused(("GET", "/bucket/key", "", {"host": "127.0.0.1:9100"}), "AccessDenied")


def test_missing_content_sha256() -> None:
    request = _request("GET", "/bucket/key")
    SigV4Auth(Credentials(AK, SECRET), "s3", "us-east-1").add_auth(request)  # does not add it
    error = refused(_wire(request), "InvalidRequest")
    assert error.message == "Missing required header for this request: x-amz-content-sha256"


@pytest.mark.parametrize("value,code", [
    ("abc", "InvalidArgument"),
    ("STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD", "NotImplemented"),
])
def test_bad_content_sha256(value: str, code: str) -> None:
    method, path, query, headers = signed()
    refused((method, path, query, {**headers, "x-amz-content-sha256": value}), code)


def test_tampered_header_value() -> None:
    method, path, query, headers = signed(headers={"X-Amz-Meta-Owner": "alice"})
    refused((method, path, query, {**headers, "x-amz-meta-owner": "mallory"}),
            "SignatureDoesNotMatch")


def test_signature_that_is_not_ascii_does_not_match() -> None:
    """A header decoded as latin-1 may hold any character; the signature is
    compared as text, never raising on one that is not ASCII."""
    method, path, query, headers = signed()
    provided = _authorization(headers)["Signature"]
    tampered = headers["authorization"].replace(provided, provided[:-1] + "\u00e9")
    error = refused((method, path, query, {**headers, "authorization": tampered}), "SignatureDoesNotMatch")
    assert error.fields["SignatureProvided"].endswith("\u00e9")


def test_tampered_path_and_method() -> None:
    method, path, query, headers = signed()
    refused((method, "/bucket/other", query, headers), "SignatureDoesNotMatch")
    refused(("DELETE", path, query, headers), "SignatureDoesNotMatch")


def test_unsigned_amz_header_is_refused() -> None:
    method, path, query, headers = signed()
    error = refused((method, path, query, {**headers, "x-amz-copy-source": "/b/secret"}),
                    "AccessDenied")
    assert error.fields["HeadersNotSigned"] == "x-amz-copy-source"


def test_signed_header_missing_from_request() -> None:
    method, path, query, headers = signed(headers={"X-Amz-Meta-Owner": "alice"})
    del headers["x-amz-meta-owner"]
    refused((method, path, query, headers), "SignatureDoesNotMatch")


def _with_authorization(wire: Wire, value: str) -> Wire:
    method, path, query, headers = wire
    return method, path, query, {**headers, "authorization": value}


def _rebuilt(wire: Wire, **replace: str) -> Wire:
    parts = {**_authorization(wire[3]), **replace}
    value = "AWS4-HMAC-SHA256 " + ", ".join(f"{k}={v}" for k, v in parts.items())
    return _with_authorization(wire, value)


def test_host_must_be_signed() -> None:
    wire = signed()
    signed_headers = _authorization(wire[3])["SignedHeaders"].replace("host;", "")
    error = refused(_rebuilt(wire, SignedHeaders=signed_headers), "AccessDenied")
    assert "host" in error.fields["HeadersNotSigned"]


@pytest.mark.parametrize("spelling", ["{0}\r;{1}", "{0}; {1}", "{0} ;{1}", "{0};;{1}"])
def test_signed_headers_are_names_and_semicolons_only(spelling: str) -> None:
    """A blank or control character in SignedHeaders is refused, not
    trimmed away (a fuzz run found "content-md5\\r;host" accepted)."""
    wire = signed()
    first, rest = _authorization(wire[3])["SignedHeaders"].split(";", 1)
    refused(_rebuilt(wire, SignedHeaders=spelling.format(first, rest)), "AuthorizationHeaderMalformed")


@pytest.mark.parametrize("credential_tail", [
    "/20130524/us-east-1/s3",  # too short
    "/2013-05-24/us-east-1/s3/aws4_request",
    "/{date}/us-east-1/ec2/aws4_request",
    "/{date}/us-east-1/s3/aws5_request",
    "/19990101/us-east-1/s3/aws4_request",  # not the date of x-amz-date
])
def test_malformed_credential(credential_tail: str) -> None:
    wire = signed()
    tail = credential_tail.format(date=wire[3]["x-amz-date"][:8])
    refused(_rebuilt(wire, Credential=AK + tail), "AuthorizationHeaderMalformed")


def test_authorization_missing_component() -> None:
    wire = signed()
    parts = _authorization(wire[3])
    value = f"AWS4-HMAC-SHA256 Credential={parts['Credential']}, Signature={parts['Signature']}"
    refused(_with_authorization(wire, value), "AuthorizationHeaderMalformed")


@pytest.mark.parametrize("value", ["Bearer token", "", "AWS4-ECDSA-P256-SHA256 Credential=x"])
def test_other_algorithms(value: str) -> None:
    error = refused(_with_authorization(signed(), value), "InvalidRequest")
    assert "Please use AWS4-HMAC-SHA256" in error.message


def test_sigv2_authorization_goes_to_sigv2() -> None:
    # "AWS AK:signature" is verified by gateway.auth.sigv2, not refused.
    error = refused(_with_authorization(signed(), "AWS AKID:c2lnbmF0dXJl"), "InvalidAccessKeyId")
    assert error.fields["AWSAccessKeyId"] == "AKID"
    refused(_with_authorization(signed(), f"AWS {AK}:c2lnbmF0dXJl"), "SignatureDoesNotMatch")


def test_invalid_x_amz_date() -> None:
    method, path, query, headers = signed()
    refused((method, path, query, {**headers, "x-amz-date": "yesterday"}), "AccessDenied")


# -- the AWS documentation's chunked-upload example --------------------------

DOC_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
DOC_SEED = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
DOC_HEADERS = {
    "host": "s3.amazonaws.com",
    "x-amz-date": "20130524T000000Z",
    "x-amz-storage-class": "REDUCED_REDUNDANCY",
    "authorization": "AWS4-HMAC-SHA256 "
    "Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
    "SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
    "x-amz-decoded-content-length;x-amz-storage-class,"
    f"Signature={DOC_SEED}",
    "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    "content-encoding": "aws-chunked",
    "x-amz-decoded-content-length": "66560",
    "content-length": "66824",
}


def _doc_context() -> AuthContext:
    return authenticate(
        "PUT", "/examplebucket/chunkObject.txt", "", DOC_HEADERS,
        {"AKIAIOSFODNN7EXAMPLE": DOC_SECRET}.get,
        datetime(2013, 5, 24, 0, 0, 30, tzinfo=UTC),
    )


def _chain(ctx: AuthContext, seed: str) -> list[str]:
    signatures, previous = [], seed
    for size in (65536, 1024, 0):  # 66560 bytes of 'a', then the final empty chunk
        previous = ctx.chunk_signature(previous, hashlib.sha256(b"a" * size).hexdigest())
        signatures.append(previous)
    return signatures


def test_doc_example_seed_and_chunk_signatures() -> None:
    ctx = _doc_context()
    assert ctx.seed_signature == DOC_SEED
    assert ctx.payload_hash == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    assert ctx.scope == "20130524/us-east-1/s3/aws4_request"
    assert _chain(ctx, ctx.seed_signature) == [
        "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
        "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
        "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
    ]


def test_doc_example_with_trailer() -> None:
    # "Signature calculations for trailing headers": same object, same key,
    # its own seed; the trailer is signed as "name:value\n".
    seed = "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e"
    signatures = _chain(_doc_context(), seed)
    assert signatures == [
        "b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
        "1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
        "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992",
    ]
    assert _doc_context().trailer_signature(signatures[-1], b"x-amz-checksum-crc32c:sOO8/Q==\n") \
        == "d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435"


def testsigning_keys_are_cached_in_a_bounded_cache() -> None:
    assert signing_key.cache_info().maxsize == 64


# -- property ----------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=200))
def test_any_key_signed_by_botocore_verifies(key: str) -> None:
    path = "/bucket/" + quote(key, safe="/~")
    auth(signed("PUT", path, body=b"x"))
    auth(presigned("GET", path))


_PARAM_NAMES = st.text(min_size=1, max_size=20).filter(
    lambda name: not name.startswith("X-Amz-") and name not in ("Signature", "AWSAccessKeyId"))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_PARAM_NAMES, st.text(max_size=30), max_size=5))
def test_any_query_encoded_by_botocore_verifies(params: dict[str, str]) -> None:
    # AWSRequest form-encodes the query (space as '+') but signs it strictly.
    request = AWSRequest(method="GET", url=ENDPOINT + "/bucket", params=params)
    S3SigV4Auth(Credentials(AK, SECRET), "s3", "us-east-1").add_auth(request)
    auth(_wire(request.prepare()))
