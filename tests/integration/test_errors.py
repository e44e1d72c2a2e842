"""S3 error responses of the gateway, one test per case.

Each test checks the HTTP status, the S3 error Code in the XML body (with a
Message and the RequestId, which must equal the x-amz-request-id header),
and for HEAD an empty body. Failed writes must leave nothing behind: the key
is absent, or keeps the content it had before.

The last test greps the gateway's log: none of these client errors may have
produced a traceback or an InternalError.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import socket
import zlib
from datetime import UTC, datetime, timedelta
from unittest import mock
from urllib.parse import quote

import pytest
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.conftest import make_client
from tests.integration.s3raw import (
    RecordingClient,
    Sender,
    boto_error,
    check_error,
    check_error_parts,
    chunk_signing_key,
    read_answer,
    sign,
)
from tests.servers import ACCESS_KEY, SECRET_KEY

MiB = 1024 * 1024
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def md5_b64(data: bytes) -> str:
    return b64(hashlib.md5(data).digest())


def crc32_b64(data: bytes) -> str:
    return b64(zlib.crc32(data).to_bytes(4, "big"))


def assert_absent(s3, bucket: str, key: str) -> None:
    with pytest.raises(ClientError) as info:
        s3.head_object(Bucket=bucket, Key=key)
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def assert_content(s3, bucket: str, key: str, data: bytes) -> None:
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data


def create_upload(s3, bucket: str, key: str, **kwargs) -> str:
    return s3.create_multipart_upload(Bucket=bucket, Key=key, **kwargs)["UploadId"]


# -- buckets ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ab", "UpperCase", "under_score", "192.168.1.1", "xn--bucket", "trailing-"])
def test_invalid_bucket_name(http: Sender, name: str) -> None:
    check_error(http.signed("PUT", f"/{name}"), 400, "InvalidBucketName")


def test_bucket_already_owned_by_you(s3r: RecordingClient, bucket: str) -> None:
    """In us-east-1 S3 answers its owner 200 (test_s3_completeness.py has
    the 409 of other regions)."""
    assert s3r.create_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_bucket_not_empty(s3r: RecordingClient, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"x")
    boto_error(s3r, s3r.delete_bucket, 409, "BucketNotEmpty", Bucket=bucket)
    assert_content(s3r, bucket, "k", b"x")


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/no-such-bucket-x1/key"),
        ("HEAD", "/no-such-bucket-x1/key"),
        ("PUT", "/no-such-bucket-x1/key"),
        ("DELETE", "/no-such-bucket-x1/key"),
        ("GET", "/no-such-bucket-x1"),
        ("GET", "/no-such-bucket-x1?list-type=2"),
        ("HEAD", "/no-such-bucket-x1"),
        ("DELETE", "/no-such-bucket-x1"),
        ("POST", "/no-such-bucket-x1/key?uploads"),
    ],
)
def test_no_such_bucket(http: Sender, method: str, path: str) -> None:
    body = b"data" if method == "PUT" else b""
    check_error(http.signed(method, path, body=body), 404, "NoSuchBucket")


# -- keys ---------------------------------------------------------------------


def test_no_such_key_get(http: Sender, bucket: str) -> None:
    root = check_error(http.signed("GET", f"/{bucket}/missing"), 404, "NoSuchKey")
    assert root is not None and root.findtext("Key") == "missing"


def test_no_such_key_head_has_no_body(http: Sender, bucket: str) -> None:
    check_error(http.signed("HEAD", f"/{bucket}/missing"), 404, None)


def test_delete_missing_key_is_204(http: Sender, bucket: str) -> None:
    resp = http.signed("DELETE", f"/{bucket}/missing")
    assert resp.status_code == 204
    assert resp.headers.get("x-amz-request-id")


# -- ranges -------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["bytes=10-", "bytes=10-20", "bytes=-0"])
def test_invalid_range(s3r: RecordingClient, http: Sender, bucket: str, spec: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"0123456789")
    check_error(http.signed("GET", f"/{bucket}/k", {"Range": spec}), 416, "InvalidRange")


@pytest.mark.parametrize("spec", ["bytes=abc", "bytes=5-2", "items=0-1", "bytes=0-1,3-4", "bytes=-"])
def test_malformed_range_is_ignored(s3r: RecordingClient, http: Sender, bucket: str, spec: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"0123456789")
    resp = http.signed("GET", f"/{bucket}/k", {"Range": spec})
    assert resp.status_code == 200
    assert resp.content == b"0123456789"
    assert "content-range" not in resp.headers


# -- conditional requests -----------------------------------------------------


def _http_date(when: datetime) -> str:
    return when.strftime("%a, %d %b %Y %H:%M:%S GMT")


def test_if_match_mismatch_is_412(s3r: RecordingClient, http: Sender, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"x")
    check_error(http.signed("GET", f"/{bucket}/k", {"If-Match": '"0123456789abcdef0123456789abcdef"'}),
                412, "PreconditionFailed")
    check_error(http.signed("HEAD", f"/{bucket}/k", {"If-Match": '"nope"'}), 412, None)


def test_if_unmodified_since_past_is_412(s3r: RecordingClient, http: Sender, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"x")
    past = _http_date(datetime.now(UTC) - timedelta(days=1))
    check_error(http.signed("GET", f"/{bucket}/k", {"If-Unmodified-Since": past}), 412, "PreconditionFailed")


def test_put_if_none_match_star_on_existing_key_is_412(s3r: RecordingClient, http: Sender, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"old")
    resp = http.signed("PUT", f"/{bucket}/k", {"If-None-Match": "*"}, b"new")
    check_error(resp, 412, "PreconditionFailed")
    assert_content(s3r, bucket, "k", b"old")


def test_if_none_match_matching_is_304(s3r: RecordingClient, http: Sender, bucket: str) -> None:
    etag = s3r.put_object(Bucket=bucket, Key="k", Body=b"x")["ETag"]
    for method in ("GET", "HEAD"):
        resp = http.signed(method, f"/{bucket}/k", {"If-None-Match": etag})
        check_error(resp, 304, None)
        assert resp.content == b""


def test_if_modified_since_future_is_304(s3r: RecordingClient, http: Sender, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"x")
    future = _http_date(datetime.now(UTC) + timedelta(days=1))
    resp = http.signed("GET", f"/{bucket}/k", {"If-Modified-Since": future})
    check_error(resp, 304, None)


# -- digests and checksums ----------------------------------------------------


@pytest.mark.parametrize("existed", [False, True], ids=["new", "overwrite"])
def test_bad_content_md5(s3r: RecordingClient, http: Sender, bucket: str, existed: bool) -> None:
    if existed:
        s3r.put_object(Bucket=bucket, Key="k", Body=b"old")
    resp = http.signed("PUT", f"/{bucket}/k", {"Content-MD5": md5_b64(b"other")}, b"new body")
    check_error(resp, 400, "BadDigest")
    if existed:
        assert_content(s3r, bucket, "k", b"old")
    else:
        assert_absent(s3r, bucket, "k")


@pytest.mark.parametrize("value", ["not base64!", b64(b"short"), b64(b"x" * 17), ""])
def test_invalid_content_md5(http: Sender, s3r: RecordingClient, bucket: str, value: str) -> None:
    resp = http.signed("PUT", f"/{bucket}/k", {"Content-MD5": value}, b"body")
    check_error(resp, 400, "InvalidDigest")
    assert_absent(s3r, bucket, "k")


@pytest.mark.parametrize(
    "header, value",
    [
        ("x-amz-checksum-crc32", crc32_b64(b"other")),
        ("x-amz-checksum-sha256", b64(hashlib.sha256(b"other").digest())),
    ],
)
@pytest.mark.parametrize("existed", [False, True], ids=["new", "overwrite"])
def test_put_bad_checksum(s3r: RecordingClient, http: Sender, bucket: str, header: str, value: str,
                          existed: bool) -> None:
    if existed:
        s3r.put_object(Bucket=bucket, Key="k", Body=b"old")
    check_error(http.signed("PUT", f"/{bucket}/k", {header: value}, b"new body"), 400, "BadDigest")
    if existed:
        assert_content(s3r, bucket, "k", b"old")
    else:
        assert_absent(s3r, bucket, "k")


@pytest.mark.parametrize(
    "header, value",
    [
        ("x-amz-checksum-crc32", crc32_b64(b"other")),
        ("x-amz-checksum-sha256", b64(hashlib.sha256(b"other").digest())),
    ],
)
def test_upload_part_bad_checksum(s3r: RecordingClient, http: Sender, bucket: str, header: str,
                                  value: str) -> None:
    upload_id = create_upload(s3r, bucket, "k")
    resp = http.signed("PUT", f"/{bucket}/k?partNumber=1&uploadId={upload_id}", {header: value}, b"part")
    check_error(resp, 400, "BadDigest")
    assert s3r.list_parts(Bucket=bucket, Key="k", UploadId=upload_id).get("Parts", []) == []


@pytest.mark.parametrize("value", ["not-base64!", b64(b"12345"), b64(b"123"), ""])
def test_malformed_checksum_value(s3r: RecordingClient, http: Sender, bucket: str, value: str) -> None:
    resp = http.signed("PUT", f"/{bucket}/k", {"x-amz-checksum-crc32": value}, b"body")
    check_error(resp, 400, "InvalidRequest")
    assert_absent(s3r, bucket, "k")


@pytest.mark.parametrize("existed", [False, True], ids=["new", "overwrite"])
def test_content_sha256_mismatch(s3r: RecordingClient, http: Sender, bucket: str, existed: bool) -> None:
    if existed:
        s3r.put_object(Bucket=bucket, Key="k", Body=b"old")
    resp = http.signed("PUT", f"/{bucket}/k", body=b"the real body",
                       payload_hash=hashlib.sha256(b"a different body").hexdigest())
    check_error(resp, 400, "XAmzContentSHA256Mismatch")
    if existed:
        assert_content(s3r, bucket, "k", b"old")
    else:
        assert_absent(s3r, bucket, "k")


def test_content_sha256_mismatch_on_xml_body(http: Sender, s3r: RecordingClient, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"x")
    body = b"<Delete><Object><Key>k</Key></Object></Delete>"
    resp = http.signed("POST", f"/{bucket}?delete", body=body, payload_hash=hashlib.sha256(b"no").hexdigest())
    check_error(resp, 400, "XAmzContentSHA256Mismatch")
    assert_content(s3r, bucket, "k", b"x")


# -- authentication -----------------------------------------------------------


def test_wrong_secret(http: Sender, bucket: str) -> None:
    check_error(http.signed("GET", f"/{bucket}", secret_key="wrong-secret"), 403, "SignatureDoesNotMatch")


def test_unknown_access_key(http: Sender, bucket: str) -> None:
    check_error(http.signed("GET", f"/{bucket}", access_key="AKIDUNKNOWN"), 403, "InvalidAccessKeyId")


@pytest.mark.parametrize("method, path", [("GET", "/"), ("GET", "/{b}"), ("PUT", "/{b}/k"), ("GET", "/{b}/k")])
def test_anonymous_is_denied(http: Sender, s3r: RecordingClient, bucket: str, method: str, path: str) -> None:
    resp = http.unsigned(method, path.format(b=bucket), body=b"x" if method == "PUT" else b"")
    check_error(resp, 403, "AccessDenied")
    assert_absent(s3r, bucket, "k")


def test_anonymous_head_is_denied_without_body(http: Sender, bucket: str) -> None:
    check_error(http.unsigned("HEAD", f"/{bucket}"), 403, None)


@pytest.mark.parametrize("minutes", [20, -20])
def test_request_time_too_skewed(http: Sender, bucket: str, minutes: int) -> None:
    when = datetime.now(UTC) + timedelta(minutes=minutes)
    check_error(http.signed("GET", f"/{bucket}", when=when), 403, "RequestTimeTooSkewed")


@pytest.fixture(scope="module")
def presigner(gateway):
    """A client that presigns with SigV4 (botocore's S3 default is SigV2)."""
    return make_client(gateway.endpoint, signature_version="s3v4")


def test_expired_presigned_url(s3r: RecordingClient, http: Sender, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"x")
    # botocore's pure-Python query signer, so that its clock can be moved
    # (with awscrt installed, clients presign through the CRT instead).
    an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).replace(tzinfo=None)
    request = AWSRequest(method="GET", url=http.url(f"/{bucket}/k"))
    with mock.patch("botocore.auth.get_current_datetime", return_value=an_hour_ago):
        S3SigV4QueryAuth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1", expires=60).add_auth(request)
    assert "X-Amz-Date=" + an_hour_ago.strftime("%Y%m%dT%H%M%SZ") in request.url
    check_error(http.client.get(request.url), 403, "AccessDenied")
    # the same URL signed now, with the same lifetime, works
    fresh = AWSRequest(method="GET", url=http.url(f"/{bucket}/k"))
    S3SigV4QueryAuth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1", expires=60).add_auth(fresh)
    assert http.client.get(fresh.url).content == b"x"


def test_tampered_presigned_url(s3r: RecordingClient, http: Sender, presigner, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"x")
    s3r.put_object(Bucket=bucket, Key="other", Body=b"secret")
    url = presigner.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=300)
    assert http.client.get(url).content == b"x"  # the untampered URL works
    check_error(http.client.get(url.replace(f"/{bucket}/k?", f"/{bucket}/other?")), 403, "SignatureDoesNotMatch")
    check_error(http.client.get(url.replace("X-Amz-Expires=300", "X-Amz-Expires=600")), 403,
                "SignatureDoesNotMatch")


def _chunked_put(http: Sender, bucket: str, key: str, chunks: list[bytes], corrupt: int | None) -> object:
    """PUT ``chunks`` as a signed aws-chunked body; chunk number ``corrupt``
    (0-based, the final empty chunk is len(chunks)) gets a wrong signature."""
    url = http.url(f"/{bucket}/{key}")
    decoded = sum(len(c) for c in chunks)
    headers = {
        "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(decoded),
    }
    mode = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    signed_headers, _, stamp = sign("PUT", url, headers, payload_hash=mode)
    seed = signed_headers["Authorization"].rsplit("Signature=", 1)[1]
    key_bytes = chunk_signing_key(SECRET_KEY, stamp[:8])
    scope = f"{stamp[:8]}/us-east-1/s3/aws4_request"
    previous = seed
    body = b""
    for i, data in enumerate([*chunks, b""]):
        to_sign = "\n".join(("AWS4-HMAC-SHA256-PAYLOAD", stamp, scope, previous, EMPTY_SHA256,
                             hashlib.sha256(data).hexdigest()))
        signature = hmac.new(key_bytes, to_sign.encode(), hashlib.sha256).hexdigest()
        if i == corrupt:
            signature = ("0" if signature[0] != "0" else "1") + signature[1:]
        previous = signature
        body += f"{len(data):x};chunk-signature={signature}\r\n".encode() + data + b"\r\n"
    return http.client.put(url, headers=signed_headers, content=body)


@pytest.mark.parametrize("corrupt", [0, 1, 2], ids=["first", "second", "final-empty"])
def test_aws_chunked_bad_chunk_signature(s3r: RecordingClient, http: Sender, bucket: str, corrupt: int) -> None:
    chunks = [b"a" * 70_000, b"b" * 1000]
    ok = _chunked_put(http, bucket, "good", chunks, corrupt=None)
    assert ok.status_code == 200, ok.text  # the framing itself is right
    assert_content(s3r, bucket, "good", b"".join(chunks))
    s3r.put_object(Bucket=bucket, Key="existing", Body=b"old")
    for key in ("fresh", "existing"):
        resp = _chunked_put(http, bucket, key, chunks, corrupt=corrupt)
        check_error(resp, 403, "SignatureDoesNotMatch")
    assert_absent(s3r, bucket, "fresh")
    assert_content(s3r, bucket, "existing", b"old")


# -- multipart ----------------------------------------------------------------

UNKNOWN_UPLOAD = "0123456789abcdef0123456789abcdef"


def test_no_such_upload_upload_part(s3r: RecordingClient, bucket: str) -> None:
    boto_error(s3r, s3r.upload_part, 404, "NoSuchUpload", Bucket=bucket, Key="k", UploadId=UNKNOWN_UPLOAD,
               PartNumber=1, Body=b"x")


def test_no_such_upload_complete(s3r: RecordingClient, bucket: str) -> None:
    boto_error(s3r, s3r.complete_multipart_upload, 404, "NoSuchUpload", Bucket=bucket, Key="k",
               UploadId=UNKNOWN_UPLOAD, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"abc"'}]})
    assert_absent(s3r, bucket, "k")


def test_no_such_upload_abort(s3r: RecordingClient, bucket: str) -> None:
    boto_error(s3r, s3r.abort_multipart_upload, 404, "NoSuchUpload", Bucket=bucket, Key="k",
               UploadId=UNKNOWN_UPLOAD)


def test_no_such_upload_list_parts(s3r: RecordingClient, bucket: str) -> None:
    boto_error(s3r, s3r.list_parts, 404, "NoSuchUpload", Bucket=bucket, Key="k", UploadId=UNKNOWN_UPLOAD)


def test_upload_id_of_another_key(s3r: RecordingClient, bucket: str) -> None:
    upload_id = create_upload(s3r, bucket, "a")
    boto_error(s3r, s3r.upload_part, 404, "NoSuchUpload", Bucket=bucket, Key="b", UploadId=upload_id,
               PartNumber=1, Body=b"x")


def test_no_such_upload_after_abort(s3r: RecordingClient, bucket: str) -> None:
    upload_id = create_upload(s3r, bucket, "k")
    s3r.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=upload_id)
    boto_error(s3r, s3r.upload_part, 404, "NoSuchUpload", Bucket=bucket, Key="k", UploadId=upload_id,
               PartNumber=1, Body=b"x")
    boto_error(s3r, s3r.abort_multipart_upload, 404, "NoSuchUpload", Bucket=bucket, Key="k",
               UploadId=upload_id)


def test_invalid_part_wrong_etag(s3r: RecordingClient, bucket: str) -> None:
    upload_id = create_upload(s3r, bucket, "k")
    s3r.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=1, Body=b"x")
    boto_error(s3r, s3r.complete_multipart_upload, 400, "InvalidPart", Bucket=bucket, Key="k",
               UploadId=upload_id,
               MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"0123456789abcdef0123456789abcdef"'}]})
    boto_error(s3r, s3r.complete_multipart_upload, 400, "InvalidPart", Bucket=bucket, Key="k",
               UploadId=upload_id, MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": '"abc"'}]})
    assert_absent(s3r, bucket, "k")
    # the upload survives a failed completion
    assert len(s3r.list_parts(Bucket=bucket, Key="k", UploadId=upload_id)["Parts"]) == 1


def test_invalid_part_order(s3r: RecordingClient, bucket: str) -> None:
    upload_id = create_upload(s3r, bucket, "k")
    etags = [s3r.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=n, Body=b"x")["ETag"]
             for n in (1, 2)]
    boto_error(s3r, s3r.complete_multipart_upload, 400, "InvalidPartOrder", Bucket=bucket, Key="k",
               UploadId=upload_id,
               MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": etags[1]}, {"PartNumber": 1, "ETag": etags[0]}]})
    assert_absent(s3r, bucket, "k")


def test_entity_too_small(s3r: RecordingClient, bucket: str) -> None:
    upload_id = create_upload(s3r, bucket, "k")
    etags = [s3r.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=n, Body=b"x" * 1024)["ETag"]
             for n in (1, 2)]
    boto_error(s3r, s3r.complete_multipart_upload, 400, "EntityTooSmall", Bucket=bucket, Key="k",
               UploadId=upload_id,
               MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etags[0]}, {"PartNumber": 2, "ETag": etags[1]}]})
    assert_absent(s3r, bucket, "k")


@pytest.mark.parametrize("number", ["0", "10001", "-1", "abc"])
def test_upload_part_number_out_of_range(s3r: RecordingClient, http: Sender, bucket: str, number: str) -> None:
    upload_id = create_upload(s3r, bucket, "k")
    resp = http.signed("PUT", f"/{bucket}/k?partNumber={number}&uploadId={upload_id}", body=b"x")
    check_error(resp, 400, "InvalidArgument")
    assert s3r.list_parts(Bucket=bucket, Key="k", UploadId=upload_id).get("Parts", []) == []


@pytest.mark.parametrize("body", [b"garbage, not xml", b"<CompleteMultipartUpload><Part><PartNumber>x</PartNumber>"
                                  b"<ETag>e</ETag></Part></CompleteMultipartUpload>", b"<Other/>", b""])
def test_complete_malformed_xml(s3r: RecordingClient, http: Sender, bucket: str, body: bytes) -> None:
    upload_id = create_upload(s3r, bucket, "k")
    s3r.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=1, Body=b"x")
    check_error(http.signed("POST", f"/{bucket}/k?uploadId={upload_id}", body=body), 400, "MalformedXML")
    assert_absent(s3r, bucket, "k")


# -- DeleteObjects ------------------------------------------------------------


def test_delete_objects_garbage_body(http: Sender, bucket: str) -> None:
    body = b"this is not xml"
    resp = http.signed("POST", f"/{bucket}?delete", {"Content-MD5": md5_b64(body)}, body)
    check_error(resp, 400, "MalformedXML")


def test_delete_objects_too_many_keys(s3r: RecordingClient, http: Sender, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k0", Body=b"x")
    body = ("<Delete>" + "".join(f"<Object><Key>k{i}</Key></Object>" for i in range(1001)) + "</Delete>").encode()
    resp = http.signed("POST", f"/{bucket}?delete", {"Content-MD5": md5_b64(body)}, body)
    check_error(resp, 400, "MalformedXML")
    assert_content(s3r, bucket, "k0", b"x")


def test_delete_objects_verbose_reports_every_key(s3r: RecordingClient, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="a", Body=b"x")
    out = s3r.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "a"}, {"Key": "missing"}, {"Key": "bad-version", "VersionId": "v123"}]})
    assert sorted(d["Key"] for d in out.get("Deleted", [])) == ["a", "missing"]
    assert [(e["Key"], e["Code"]) for e in out.get("Errors", [])] == [("bad-version", "InvalidArgument")]
    assert_absent(s3r, bucket, "a")


def test_delete_objects_quiet_returns_only_errors(s3r: RecordingClient, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="a", Body=b"x")
    out = s3r.delete_objects(Bucket=bucket, Delete={"Quiet": True, "Objects": [
        {"Key": "a"}, {"Key": "missing"}, {"Key": "bad-version", "VersionId": "v123"}]})
    assert "Deleted" not in out
    assert [(e["Key"], e["Code"]) for e in out.get("Errors", [])] == [("bad-version", "InvalidArgument")]
    assert_absent(s3r, bucket, "a")


# -- copy ---------------------------------------------------------------------


def test_copy_onto_itself_without_replace(s3r: RecordingClient, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"x", Metadata={"a": "1"})
    boto_error(s3r, s3r.copy_object, 400, "InvalidRequest", Bucket=bucket, Key="k",
               CopySource={"Bucket": bucket, "Key": "k"})
    got = s3r.get_object(Bucket=bucket, Key="k")
    assert got["Body"].read() == b"x" and got["Metadata"] == {"a": "1"}


def test_copy_from_missing_source(s3r: RecordingClient, bucket: str) -> None:
    boto_error(s3r, s3r.copy_object, 404, "NoSuchKey", Bucket=bucket, Key="dst",
               CopySource={"Bucket": bucket, "Key": "missing"})
    assert_absent(s3r, bucket, "dst")


def test_copy_from_missing_source_bucket(s3r: RecordingClient, bucket: str) -> None:
    boto_error(s3r, s3r.copy_object, 404, "NoSuchBucket", Bucket=bucket, Key="dst",
               CopySource={"Bucket": "no-such-bucket-x2", "Key": "k"})


@pytest.mark.parametrize("source", ["{b}", "/{b}", "{b}/", "/", "%"])
def test_copy_source_without_key(http: Sender, s3r: RecordingClient, bucket: str, source: str) -> None:
    resp = http.signed("PUT", f"/{bucket}/dst", {"x-amz-copy-source": source.format(b=bucket)})
    check_error(resp, 400, "InvalidArgument")
    assert_absent(s3r, bucket, "dst")


def test_upload_part_copy_range_beyond_source(s3r: RecordingClient, bucket: str) -> None:
    # AWS is reported to answer 400 InvalidArgument ("Range specified is not
    # valid for source object of size") here; the gateway answers 416
    # InvalidRange, as RFC 9110 does for an unsatisfiable range.
    s3r.put_object(Bucket=bucket, Key="src", Body=b"0123456789")
    upload_id = create_upload(s3r, bucket, "k")
    boto_error(s3r, s3r.upload_part_copy, 416, "InvalidRange", Bucket=bucket, Key="k", UploadId=upload_id,
               PartNumber=1, CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange="bytes=5-10")
    assert s3r.list_parts(Bucket=bucket, Key="k", UploadId=upload_id).get("Parts", []) == []


# -- listing arguments --------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "abc", "1.5", ""])
@pytest.mark.parametrize("list_type", ["1", "2"])
def test_list_bad_max_keys(http: Sender, bucket: str, value: str, list_type: str) -> None:
    check_error(http.signed("GET", f"/{bucket}?list-type={list_type}&max-keys={value}"), 400, "InvalidArgument")


def test_list_bad_encoding_type(http: Sender, bucket: str) -> None:
    check_error(http.signed("GET", f"/{bucket}?list-type=2&encoding-type=foo"), 400, "InvalidArgument")


@pytest.mark.parametrize("token", ["garbage", "!!!!", "////", "not a token", "AAAA", "YQ"])
def test_list_garbage_continuation_token(s3r: RecordingClient, http: Sender, bucket: str, token: str) -> None:
    s3r.put_object(Bucket=bucket, Key="a", Body=b"x")
    resp = http.signed("GET", f"/{bucket}?list-type=2&continuation-token={quote(token, safe='%')}")
    check_error(resp, 400, "InvalidArgument")


def test_list_real_continuation_token_still_works(s3r: RecordingClient, bucket: str) -> None:
    for key in ("a", "b", "c"):
        s3r.put_object(Bucket=bucket, Key=key, Body=b"x")
    first = s3r.list_objects_v2(Bucket=bucket, MaxKeys=2)
    assert first["IsTruncated"]
    second = s3r.list_objects_v2(Bucket=bucket, MaxKeys=2, ContinuationToken=first["NextContinuationToken"])
    assert [o["Key"] for o in second["Contents"]] == ["c"]


# -- unsupported operations ---------------------------------------------------


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/{b}?tagging"),
        ("GET", "/{b}?policyStatus"),  # ?policy itself is served (gateway/handlers/permissions.py)
        ("GET", "/{b}?lifecycle"),
        ("GET", "/{b}?cors"),
        ("PUT", "/{b}?tagging"),
        ("DELETE", "/{b}?website"),
        ("DELETE", "/{b}?versioning"),
        ("DELETE", "/{b}?tagging"),
    ],
)
def test_unsupported_sub_resource(http: Sender, bucket: str, method: str, path: str) -> None:
    body = b"<Tagging><TagSet/></Tagging>" if method == "PUT" else b""
    check_error(http.signed(method, path.format(b=bucket), body=body), 501, "NotImplemented")


@pytest.mark.parametrize(("method", "body", "status", "code"), [
    ("GET", b"", 404, "NoSuchKey"),
    ("PUT", b"<Tagging><TagSet/></Tagging>", 404, "NoSuchKey"),
    ("PUT", b"<Tagging><Set/></Tagging>", 400, "MalformedXML"),
    ("PUT", b"<Tagging><TagSet><Tag><Key>k</Key></Tag></TagSet></Tagging>", 400, "MalformedXML"),
    ("PUT", b"<Tagging><TagSet><Tag><Key>a:b\x01</Key><Value/></Tag></TagSet></Tagging>", 400, "MalformedXML"),
    ("DELETE", b"", 404, "NoSuchKey"),
])
def test_object_tagging_errors(http: Sender, bucket: str, method: str, body: bytes, status: int, code: str) -> None:
    """Object tagging is answered (test_tagging.py); bad input gets S3's
    errors, in XML, never a 500."""
    check_error(http.signed(method, f"/{bucket}/missing?tagging", body=body), status, code)


@pytest.mark.parametrize("path", ["/{b}", "/{b}/k", "/"])
def test_unknown_method(http: Sender, bucket: str, path: str) -> None:
    check_error(http.signed("PATCH", path.format(b=bucket), body=b"x"), 405, "MethodNotAllowed")


# -- names and metadata -------------------------------------------------------


def test_key_too_long(http: Sender, s3r: RecordingClient, bucket: str) -> None:
    key = "k" * 1025
    check_error(http.signed("PUT", f"/{bucket}/{key}", body=b"x"), 400, "KeyTooLongError")
    ok = "k" * 1024
    assert http.signed("PUT", f"/{bucket}/{ok}", body=b"x").status_code == 200


def test_key_too_long_multibyte(http: Sender, bucket: str) -> None:
    key = "é" * 513  # 1026 bytes of UTF-8, 513 characters
    check_error(http.signed("PUT", f"/{bucket}/{quote(key)}", body=b"x"), 400, "KeyTooLongError")


def test_metadata_too_large(http: Sender, s3r: RecordingClient, bucket: str) -> None:
    headers = {"x-amz-meta-big": "v" * 2100}
    check_error(http.signed("PUT", f"/{bucket}/k", headers, b"x"), 400, "MetadataTooLarge")
    assert_absent(s3r, bucket, "k")
    many = {f"x-amz-meta-m{i}": "v" * 100 for i in range(25)}
    check_error(http.signed("POST", f"/{bucket}/k?uploads", many), 400, "MetadataTooLarge")
    assert s3r.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


# -- connections --------------------------------------------------------------


def test_early_error_with_unread_body_keeps_connection_sane(http: Sender, bucket: str) -> None:
    """An error answered before the body is read (here under Expect:
    100-continue, the body never sent) must not let the next request on the
    connection be parsed from the middle of a body: the connection is closed,
    or the next request is answered properly."""
    host = http.endpoint.removeprefix("http://")
    path = f"/{bucket}/k?partNumber=1&uploadId={UNKNOWN_UPLOAD}"
    put, _, _ = sign("PUT", http.url(path), {"Expect": "100-continue", "Content-Length": "5"}, b"hello")
    get, _, _ = sign("GET", http.url(f"/{bucket}"))

    def request(method: str, target: str, headers: dict[str, str]) -> bytes:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    with socket.create_connection(("127.0.0.1", http.gateway.port), timeout=10) as sock:
        sock.sendall(request("PUT", path, put))
        first = read_answer(sock)
        assert first is not None and first.status == 404, first
        assert b"<Code>NoSuchUpload</Code>" in first.body and "x-amz-request-id" in first.headers
        try:
            sock.sendall(request("GET", f"/{bucket}", get))
            second = read_answer(sock)
        except BrokenPipeError:
            second = None
    assert second is None or (second.status == 200 and b"<ListBucketResult" in second.body), second


# -- URIs ---------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["%ff", "%c3%28", "%e2%82", "%zz", "%", "%4"])
def test_invalid_percent_encoding_in_path(http: Sender, bucket: str, suffix: str) -> None:
    status, headers, body = http.raw_http("GET", f"/{bucket}/key{suffix}", {"Host": http.endpoint[7:]})
    check_error_parts(status, headers, body, 400, "InvalidURI")


# -- the log ------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def log_offset(gateway) -> int:
    """Where the session gateway's log stood when this module started."""
    return len(gateway.log())


def test_zz_no_traceback_logged(gateway, log_offset: int) -> None:
    """Runs last in this module: no error above may have become a 500."""
    log = gateway.log()[log_offset:]
    assert "Traceback" not in log, log[-5000:]
    assert "InternalError" not in log, log[-5000:]
    assert not re.search(r"request [0-9A-F]+ failed", log), log[-5000:]
