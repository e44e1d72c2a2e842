"""S3 behaviours clients still tripped on (issue 37, item 5), against the
real gateway.

- ListObjectsV2 with an empty ``continuation-token``: listed from the
  start, the empty token echoed as S3 echoes every token it was sent.
- ListObjects (v1) echoes ``Prefix`` as sent, newline and all, even under
  ``encoding-type=url`` (S3 encodes Delimiter, Marker, NextMarker and keys
  there, not the echoed Prefix; botocore, which asks for url encoding on
  every listing, decodes the same set, so it hands the caller back its own
  prefix). ListObjectsV2 encodes its Prefix, and botocore decodes it.
- One part number uploaded twice at once: the upload that finished last
  wins; Complete naming the overwritten part's ETag is InvalidPart. "The
  first upload finishes last" is made by construction: its body is held
  back on a raw socket until the second one has been answered.
- Presigned URLs whose ``X-Amz-Expires`` is out of range or not a number,
  or which have expired (X-Amz-Expires=0 among them), get S3's status,
  code and message.
"""

from __future__ import annotations

import hashlib
import os
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from unittest import mock
from urllib.parse import quote, urlsplit

import boto3
import httpx
import pytest
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.conftest import make_client
from tests.integration.s3raw import (
    RecordingClient,
    Sender,
    boto_error,
    check_error,
    read_answer,
    sign,
)
from tests.servers import ACCESS_KEY, ADMIN_TOKEN, SECRET_KEY, Gateway

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def _listing(resp: httpx.Response) -> ET.Element:
    assert resp.status_code == 200, resp.text
    return ET.fromstring(resp.content)


# -- ListObjectsV2: an empty continuation-token -----------------------------------------


def test_an_empty_continuation_token_lists_from_the_start_and_is_echoed(
    http: Sender, s3r: RecordingClient, bucket: str
) -> None:
    for key in ("a", "b", "c"):
        s3r.put_object(Bucket=bucket, Key=key, Body=b"x")
    resp = http.signed("GET", f"/{bucket}?list-type=2&continuation-token=&max-keys=2")
    assert b"<ContinuationToken></ContinuationToken>" in resp.content
    root = _listing(resp)
    assert [k.text for k in root.iter(f"{NS}Key")] == ["a", "b"]
    assert root.findtext(f"{NS}IsTruncated") == "true" and root.findtext(f"{NS}NextContinuationToken")

    page = s3r.list_objects_v2(Bucket=bucket, ContinuationToken="", MaxKeys=2)
    assert page["ContinuationToken"] == "" and [o["Key"] for o in page["Contents"]] == ["a", "b"]
    rest = s3r.list_objects_v2(Bucket=bucket, ContinuationToken=page["NextContinuationToken"])
    assert rest["ContinuationToken"] == page["NextContinuationToken"]
    assert [o["Key"] for o in rest["Contents"]] == ["c"]
    assert "ContinuationToken" not in s3r.list_objects_v2(Bucket=bucket)  # none sent, none echoed
    boto_error(s3r, s3r.list_objects_v2, 400, "InvalidArgument", Bucket=bucket, ContinuationToken="!!!!")


# -- ListObjects (v1): a Prefix holding a newline ------------------------------------------


@pytest.fixture
def newline_keys(s3r: RecordingClient, bucket: str) -> str:
    for key in ("\nx", "a\nb", "plain"):
        s3r.put_object(Bucket=bucket, Key=key, Body=b"x")
    return bucket


def test_a_v1_prefix_with_a_newline_comes_back_as_sent(s3r: RecordingClient, newline_keys: str) -> None:
    # boto3 asks for encoding-type=url by itself and decodes what S3 encodes.
    page = s3r.list_objects(Bucket=newline_keys, Prefix="\n")
    assert page["Prefix"] == "\n" and page["EncodingType"] == "url"
    assert [o["Key"] for o in page["Contents"]] == ["\nx"]
    nothing = s3r.list_objects(Bucket=newline_keys, Prefix="\n\n")
    assert nothing["Prefix"] == "\n\n" and "Contents" not in nothing
    v2 = s3r.list_objects_v2(Bucket=newline_keys, Prefix="\n")
    assert v2["Prefix"] == "\n" and [o["Key"] for o in v2["Contents"]] == ["\nx"]


@pytest.mark.parametrize("encoding", ["", "&encoding-type=url"])
def test_the_v1_prefix_element_carries_the_newline_as_s3_writes_it(
    http: Sender, newline_keys: str, encoding: str
) -> None:
    resp = http.signed("GET", f"/{newline_keys}?prefix=%0A&delimiter=b&marker=%0A{encoding}")
    # The newline itself, in the element's text, encoded or not: an XML
    # parser reads it back unchanged (XML 1.0 keeps a lone LF as it is).
    assert b"<Prefix>\n</Prefix>" in resp.content
    root = _listing(resp)
    assert root.findtext(f"{NS}Prefix") == "\n"
    if encoding:  # the rest is encoded, as S3 does
        assert root.findtext(f"{NS}Marker") == "%0A" and root.findtext(f"{NS}Delimiter") == "b"
        assert [k.text for k in root.iter(f"{NS}Key")] == ["%0Ax"]
    else:
        assert root.findtext(f"{NS}Marker") == "\n"
        assert [k.text for k in root.iter(f"{NS}Key")] == ["\nx"]


def test_the_v2_prefix_element_is_encoded_under_encoding_type_url(http: Sender, newline_keys: str) -> None:
    root = _listing(http.signed("GET", f"/{newline_keys}?list-type=2&prefix=%0A&encoding-type=url"))
    assert root.findtext(f"{NS}Prefix") == "%0A" and [k.text for k in root.iter(f"{NS}Key")] == ["%0Ax"]
    root = _listing(http.signed("GET", f"/{newline_keys}?list-type=2&prefix=%0A"))
    assert root.findtext(f"{NS}Prefix") == "\n"


# -- one part number uploaded twice at once ------------------------------------------------


def _source(endpoint: str):  # type: ignore[no-untyped-def]
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


@pytest.fixture(params=["managed", "mounted"])
def upload_bucket(request: pytest.FixtureRequest, gateway: Gateway, bucket: str) -> Iterator[str]:
    """A managed bucket, or a read-write mount of a moto bucket (whose parts
    pass through to the source)."""
    if request.param == "managed":
        yield bucket
        return
    moto_endpoint = request.getfixturevalue("moto_endpoint")
    _source(moto_endpoint).create_bucket(Bucket=bucket)
    name = f"{bucket[:50]}-mnt"
    body = {"name": name, "source": f"s3://{bucket}/under", "endpoint": moto_endpoint,
            "access_key": "testing", "secret_key": "testing", "read_write": True}
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    made = httpx.post(gateway.admin_url + "/mounts", json=body, headers=admin, timeout=60)
    assert made.status_code == 201, made.text
    try:
        yield name
    finally:
        httpx.delete(f"{gateway.admin_url}/mounts/{name}", headers=admin, timeout=60)


class HeldPut:
    """A signed UploadPart on a raw socket whose body is sent in two
    halves, when the test says so."""

    def __init__(self, endpoint: str, path: str, body: bytes) -> None:
        parts = urlsplit(endpoint)
        headers, _, _ = sign("PUT", endpoint + path, body=body)
        headers |= {"Host": parts.netloc, "Content-Length": str(len(body)), "Expect": "100-continue"}
        head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
        self.sock.sendall(head.encode("latin-1"))

    def wait_for_continue(self) -> None:
        """The gateway asked for the body: the part is being received."""
        data = b""
        while b"\r\n\r\n" not in data:
            piece = self.sock.recv(1)
            assert piece, f"closed before 100 Continue: {data!r}"
            data += piece
        assert data.startswith(b"HTTP/1.1 100"), data

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()


def test_a_part_uploaded_twice_at_once_is_the_one_that_finished_last(
    gateway: Gateway, s3r: RecordingClient, upload_bucket: str
) -> None:
    key = "ckpt/model.pt"
    first, second = os.urandom(256 * 1024), os.urandom(200 * 1024)
    upload_id = s3r.create_multipart_upload(Bucket=upload_bucket, Key=key)["UploadId"]
    path = f"/{upload_bucket}/{quote(key)}?partNumber=1&uploadId={quote(upload_id, safe='')}"
    held = HeldPut(gateway.endpoint, path, first)
    try:
        held.wait_for_continue()
        held.send(first[: len(first) // 2])  # the first upload is under way ...
        done = s3r.upload_part(Bucket=upload_bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=second)
        assert done["ETag"] == f'"{hashlib.md5(second).hexdigest()}"'  # ... the second has finished ...
        listed = s3r.list_parts(Bucket=upload_bucket, Key=key, UploadId=upload_id)["Parts"]
        assert [(p["PartNumber"], p["ETag"]) for p in listed] == [(1, done["ETag"])]
        held.send(first[len(first) // 2:])  # ... and the first finishes last
        answer = read_answer(held.sock)
    finally:
        held.close()
    assert answer is not None and answer.status == 200, answer
    last = f'"{hashlib.md5(first).hexdigest()}"'
    assert answer.headers["etag"] == last
    listed = s3r.list_parts(Bucket=upload_bucket, Key=key, UploadId=upload_id)["Parts"]
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed] == [(1, last, len(first))]

    overwritten = {"Parts": [{"PartNumber": 1, "ETag": done["ETag"]}]}
    boto_error(s3r, s3r.complete_multipart_upload, 400, "InvalidPart", Bucket=upload_bucket, Key=key,
               UploadId=upload_id, MultipartUpload=overwritten)
    s3r.complete_multipart_upload(Bucket=upload_bucket, Key=key, UploadId=upload_id,
                                  MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": last}]})
    assert s3r.get_object(Bucket=upload_bucket, Key=key)["Body"].read() == first


# -- presigned URLs: X-Amz-Expires ------------------------------------------------------------


def presigned(endpoint: str, path: str, expires: object, when: datetime | None = None) -> str:
    """A SigV4 query-signed GET, signed (correctly) with whatever
    X-Amz-Expires it is given; botocore's pure-Python signer, so that its
    clock can be moved."""
    request = AWSRequest(method="GET", url=endpoint + path)
    moment = (when or datetime.now(UTC)).astimezone(UTC).replace(tzinfo=None)
    with mock.patch("botocore.auth.get_current_datetime", return_value=moment):
        S3SigV4QueryAuth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1",
                         expires=expires).add_auth(request)  # type: ignore[arg-type]
    return request.url


@pytest.fixture
def readable(gateway: Gateway, bucket: str) -> str:
    make_client(gateway.endpoint).put_object(Bucket=bucket, Key="k", Body=b"data")
    return f"/{bucket}/k"


OVER_A_WEEK = ("X-Amz-Expires must be less than a week (in seconds); that is, the given X-Amz-Expires "
               "must be less than 604800 seconds")  # S3's words (aws-cli#5464, bryanjos/aws_auth#31)


@pytest.mark.parametrize(("expires", "message"), [
    (604801, OVER_A_WEEK),
    (10**30, OVER_A_WEEK),
    (-1, "X-Amz-Expires must be non-negative"),
    (-604801, "X-Amz-Expires must be non-negative"),
    ("soon", "X-Amz-Expires should be a number"),
    ("1.5", "X-Amz-Expires should be a number"),
    ("+60", "X-Amz-Expires should be a number"),
])
def test_an_x_amz_expires_s3_refuses_is_400(
    http: Sender, gateway: Gateway, readable: str, expires: object, message: str
) -> None:
    root = check_error(http.client.get(presigned(gateway.endpoint, readable, expires)), 400,
                       "AuthorizationQueryParametersError")
    assert root is not None and root.findtext("Message") == message


@pytest.mark.parametrize(("expires", "ago"), [
    (0, timedelta(seconds=5)),  # X-Amz-Expires=0 has expired at once, as S3 answers
    (60, timedelta(hours=1)),
    (604800, timedelta(days=7, seconds=5)),
])
def test_an_expired_presigned_url_is_403_request_has_expired(
    http: Sender, gateway: Gateway, readable: str, expires: int, ago: timedelta
) -> None:
    signed_at = datetime.now(UTC).replace(microsecond=0) - ago
    root = check_error(http.client.get(presigned(gateway.endpoint, readable, expires, signed_at)), 403,
                       "AccessDenied")
    assert root is not None and root.findtext("Message") == "Request has expired"
    assert root.findtext("X-Amz-Expires") == str(expires)
    assert root.findtext("Expires") == (signed_at + timedelta(seconds=expires)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fresh = http.client.get(presigned(gateway.endpoint, readable, max(expires, 60)))
    assert (fresh.status_code, fresh.content) == (200, b"data")  # the same URL, signed now
