"""S3's size and count limits, as S3 defines them, on a real gateway.

- A PutObject or UploadPart that declares more than 5 GiB (Content-Length,
  or x-amz-decoded-content-length for aws-chunked) is refused with 400
  EntityTooLarge before its body is read: these requests send no body at
  all, so a gateway that waited for it would time out instead.
- A CompleteMultipartUpload naming more than 10,000 parts, or a part number
  outside 1..10,000, is 400 InvalidArgument, and the upload survives it.
- The parts of a completed upload add up to at most 5 TiB (EntityTooLarge);
  that sum is checked on the function, with sizes no test could upload.
- GetObject and HeadObject with partNumber outside 1..10,000 are 400
  InvalidArgument (UploadPart's bounds are in test_errors.py).
- ListObjects, ListObjectsV2, ListObjectVersions, ListMultipartUploads and
  ListParts asked for more than 1,000 entries return a page of 1,000 whose
  MaxKeys (MaxUploads, MaxParts) says 1000; a negative count or one past
  the 32-bit range is 400 InvalidArgument.

Already covered elsewhere, and not repeated: UploadPart with partNumber 0
or 10001, DeleteObjects with 1,001 keys, negative max-keys on ListObjects
and ListObjectsV2 (all in test_errors.py).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.client import HTTPConnection

import httpx
import pytest
from botocore.auth import HmacV1Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from gateway.s3.errors import to_s3_error
from tests.conftest import make_client
from tests.integration.s3raw import RecordingClient, Sender, check_error, check_error_parts, sign
from tests.servers import ACCESS_KEY, SECRET_KEY, Gateway
from tiering.errors import EntityTooLarge
from tiering.model.uploads import MAX_OBJECT_SIZE, MAX_PART_SIZE, check_object_size

GiB = 1024**3
TOO_LARGE = 5 * GiB + 1
PAGE = 1000
ENTRIES = PAGE + 1


def _head_only(gateway: Gateway, method: str, path: str, headers: dict[str, str]) -> tuple[int, dict, bytes]:
    """Send a signed request head that announces a body, and no body: the
    answer has to come from the head alone (a bounded wait otherwise)."""
    url = gateway.endpoint + path
    mode = headers.pop("x-amz-content-sha256", "UNSIGNED-PAYLOAD")
    signed, _, _ = sign(method, url, headers, payload_hash=mode)
    conn = HTTPConnection("127.0.0.1", gateway.port, timeout=20)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in signed.items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _declaring(size: int, framing: str) -> dict[str, str]:
    """Headers announcing a body of ``size`` bytes, plainly or aws-chunked."""
    if framing == "content-length":
        return {"Content-Length": str(size)}
    return {"Content-Length": "100", "Content-Encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(size),
            "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
            "x-amz-trailer": "x-amz-checksum-crc32"}


def _absent(s3, bucket: str, key: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        return exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    return False


# -- bodies larger than S3 takes -------------------------------------------------------------


@pytest.mark.parametrize("framing", ["content-length", "aws-chunked"])
def test_a_put_declaring_more_than_5_gib_is_refused_unread(
    gateway: Gateway, s3r: RecordingClient, bucket: str, framing: str
) -> None:
    status, answer_headers, body = _head_only(
        gateway, "PUT", f"/{bucket}/huge", _declaring(TOO_LARGE, framing))
    root = check_error_parts(status, answer_headers, body, 400, "EntityTooLarge")
    assert root is not None and root.findtext("ProposedSize") == str(TOO_LARGE)
    assert answer_headers.get("connection") == "close", "the unread body makes the connection unusable"
    assert _absent(s3r, bucket, "huge")


@pytest.mark.parametrize("framing", ["content-length", "aws-chunked"])
def test_a_part_declaring_more_than_5_gib_is_refused_unread(
    gateway: Gateway, s3r: RecordingClient, bucket: str, framing: str
) -> None:
    upload_id = s3r.create_multipart_upload(Bucket=bucket, Key="huge")["UploadId"]
    status, answer_headers, body = _head_only(
        gateway, "PUT", f"/{bucket}/huge?partNumber=1&uploadId={upload_id}", _declaring(TOO_LARGE, framing))
    root = check_error_parts(status, answer_headers, body, 400, "EntityTooLarge")
    assert root is not None and root.findtext("MaxSizeAllowed") == str(MAX_PART_SIZE)
    assert s3r.list_parts(Bucket=bucket, Key="huge", UploadId=upload_id).get("Parts", []) == []


def test_parts_adding_up_to_more_than_5_tib_are_too_large() -> None:
    check_object_size([5 * GiB] * 1024)  # exactly 5 TiB: allowed
    check_object_size([5 * GiB] * 1023 + [1])
    for sizes in ([5 * GiB] * 1024 + [1], [5 * GiB] * 10_000, [MAX_OBJECT_SIZE + 1]):
        with pytest.raises(EntityTooLarge) as info:
            check_object_size(sizes)
        err = to_s3_error(info.value)
        assert (err.status, err.code) == (400, "EntityTooLarge")
        assert int(err.fields["ProposedSize"]) == sum(sizes)


# -- part numbers and counts ---------------------------------------------------------------------


def _complete_body(parts: list[tuple[int, str]]) -> bytes:
    items = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>" for n, etag in parts)
    return f"<CompleteMultipartUpload>{items}</CompleteMultipartUpload>".encode()


@pytest.mark.parametrize("listed", ["10001 parts", "part 0", "part 10001"])
def test_complete_names_at_most_10000_parts_numbered_up_to_10000(
    http: Sender, s3r: RecordingClient, bucket: str, listed: str
) -> None:
    upload_id = s3r.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    etag = s3r.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=1, Body=b"x")["ETag"]
    parts = {
        "10001 parts": [(1, etag)] + [(n, '"0123456789abcdef0123456789abcdef"') for n in range(2, 10_002)],
        "part 0": [(0, etag)],
        "part 10001": [(1, etag), (10_001, etag)],
    }[listed]
    check_error(http.signed("POST", f"/{bucket}/k?uploadId={upload_id}", body=_complete_body(parts)),
                400, "InvalidArgument")
    assert _absent(s3r, bucket, "k")
    parts_left = s3r.list_parts(Bucket=bucket, Key="k", UploadId=upload_id)["Parts"]
    assert [p["PartNumber"] for p in parts_left] == [1], "a refused Complete leaves the upload open"
    s3r.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=upload_id,
                                  MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert s3r.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"


@pytest.mark.parametrize("number", ["0", "10001", "-1"])
def test_get_and_head_part_number_out_of_range(
    http: Sender, s3r: RecordingClient, bucket: str, number: str
) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"0123456789")
    root = check_error(http.signed("GET", f"/{bucket}/k?partNumber={number}"), 400, "InvalidArgument")
    assert root is not None and root.findtext("ArgumentName") == "partNumber"
    check_error(http.signed("HEAD", f"/{bucket}/k?partNumber={number}"), 400, None)
    whole = http.signed("GET", f"/{bucket}/k?partNumber=1")
    assert (whole.status_code, whole.content) == (206, b"0123456789")


# -- listing pages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Crowd:
    """A bucket holding 1,001 objects and 1,001 open uploads, one of which has 1,001 parts."""

    bucket: str
    upload_key: str
    upload_id: str


@pytest.fixture(scope="module")
def crowd(gateway: Gateway) -> Crowd:
    """Made with SigV2-signed httpx requests from a few threads: about half
    the client time of boto3 calls, for 3,000 requests."""
    s3 = make_client(gateway.endpoint)
    name = f"limits-crowd-{os.getpid()}"
    s3.create_bucket(Bucket=name)
    upload_id = s3.create_multipart_upload(Bucket=name, Key="parts")["UploadId"]
    credentials = Credentials(ACCESS_KEY, SECRET_KEY)
    requests = [("PUT", f"/{name}/obj/{i:04d}", b"x") for i in range(ENTRIES)]
    requests += [("POST", f"/{name}/up/{i:04d}?uploads", b"") for i in range(ENTRIES - 1)]
    requests += [("PUT", f"/{name}/parts?partNumber={n}&uploadId={upload_id}", b"p")
                 for n in range(1, ENTRIES + 1)]

    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=8)) as client:
        def send(request: tuple[str, str, bytes]) -> int:
            method, path, body = request
            signed = AWSRequest(method=method, url=gateway.endpoint + path, data=body)
            HmacV1Auth(credentials).add_auth(signed)
            answer = client.request(method, signed.url, headers=dict(signed.headers.items()), content=body)
            return answer.status_code

        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(send, requests))
    assert set(statuses) == {200}, sorted(set(statuses))
    return Crowd(name, "parts", upload_id)


def _xml(response) -> ET.Element:  # type: ignore[no-untyped-def]
    assert response.status_code == 200, response.text[:500]
    root = ET.fromstring(response.content)
    for element in root.iter():
        element.tag = element.tag.rpartition("}")[2]
    return root


def _listings(c: Crowd) -> dict[str, tuple[str, str, str, str]]:
    """operation -> (path and query without the count, count parameter, element echoing it, entry element)."""
    return {
        "ListObjects": (f"/{c.bucket}?prefix=obj", "max-keys", "MaxKeys", "Contents"),
        "ListObjectsV2": (f"/{c.bucket}?list-type=2&prefix=obj", "max-keys", "MaxKeys", "Contents"),
        "ListObjectVersions": (f"/{c.bucket}?versions&prefix=obj", "max-keys", "MaxKeys", "Version"),
        "ListMultipartUploads": (f"/{c.bucket}?uploads", "max-uploads", "MaxUploads", "Upload"),
        "ListParts": (f"/{c.bucket}/{c.upload_key}?uploadId={c.upload_id}", "max-parts", "MaxParts", "Part"),
    }


OPERATIONS = ["ListObjects", "ListObjectsV2", "ListObjectVersions", "ListMultipartUploads", "ListParts"]


@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_page_holds_at_most_1000_entries(http: Sender, crowd: Crowd, operation: str) -> None:
    path, count, echoed, entry = _listings(crowd)[operation]
    for asked in ("1001", "5000", "2147483647"):
        root = _xml(http.signed("GET", f"{path}&{count}={asked}"))
        assert root.findtext(echoed) == str(PAGE), (asked, root.findtext(echoed))
        assert len(root.findall(entry)) == PAGE
        assert root.findtext("IsTruncated") == "true"
    # Without a count the page is 1,000 too, and the 1,001st entry is on the next page.
    root = _xml(http.signed("GET", path))
    assert (root.findtext(echoed), len(root.findall(entry))) == (str(PAGE), PAGE)


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("asked", ["-1", "2147483648", "99999999999999999999"])
def test_a_count_that_is_not_a_32_bit_natural_is_refused(http: Sender, crowd: Crowd, operation: str,
                                                         asked: str) -> None:
    if operation in ("ListObjects", "ListObjectsV2") and asked == "-1":
        pytest.skip("in test_errors.py::test_list_bad_max_keys")
    path, count, _, _ = _listings(crowd)[operation]
    root = check_error(http.signed("GET", f"{path}&{count}={asked}"), 400, "InvalidArgument")
    assert root is not None and root.findtext("ArgumentName") == count


@pytest.mark.parametrize("marker", ["-1", "2147483648"])
def test_list_parts_marker_out_of_range(http: Sender, crowd: Crowd, marker: str) -> None:
    path = f"/{crowd.bucket}/{crowd.upload_key}?uploadId={crowd.upload_id}&part-number-marker={marker}"
    check_error(http.signed("GET", path), 400, "InvalidArgument")


def test_the_last_entries_are_on_the_next_page(s3r: RecordingClient, crowd: Crowd) -> None:
    first = s3r.list_parts(Bucket=crowd.bucket, Key=crowd.upload_key, UploadId=crowd.upload_id, MaxParts=5000)
    assert (len(first["Parts"]), first["NextPartNumberMarker"]) == (PAGE, PAGE)
    rest = s3r.list_parts(Bucket=crowd.bucket, Key=crowd.upload_key, UploadId=crowd.upload_id,
                          PartNumberMarker=first["NextPartNumberMarker"])
    assert [p["PartNumber"] for p in rest["Parts"]] == [ENTRIES] and not rest["IsTruncated"]
    listed = s3r.list_objects_v2(Bucket=crowd.bucket, Prefix="obj/", MaxKeys=5000)
    rest_objects = s3r.list_objects_v2(Bucket=crowd.bucket, Prefix="obj/",
                                       ContinuationToken=listed["NextContinuationToken"])
    assert [o["Key"] for o in rest_objects["Contents"]] == [f"obj/{PAGE:04d}"]
