"""Batch GET (docs/batch.md) against a real gateway: ``POST /{bucket}?batch``
and presigned ``GET /{bucket}/{manifest}?batch``, read as tar streams by
``tarfile`` and by the package's client (gateway/batch_client.py)."""

from __future__ import annotations

import io
import json
import os
import socket
import tarfile
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import boto3
import httpx
import pytest

from gateway.batch_client import BatchClient, BatchCut, BatchDataset, BatchError, RequestFailed
from tests.conftest import make_client, running_gateway
from tests.faults import FaultProxy, Rates, get_object
from tests.integration.s3raw import Sender, check_error, sign
from tests.integration.test_capacity import CAPACITY_KEYS
from tests.servers import ACCESS_KEY, SECRET_KEY, Gateway

KiB, MiB = 1024, 1024 * 1024


def client_of(gw: Gateway) -> BatchClient:
    return BatchClient(gw.endpoint, ACCESS_KEY, SECRET_KEY, "us-east-1")


def members(data: bytes) -> list[tuple[str, bytes]]:
    """The members of a whole tar, read by the standard library."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        return [(m.name, archive.extractfile(m).read()) for m in archive]  # type: ignore[union-attr]


def post(http: Sender, bucket: str, doc: object, **options: object) -> httpx.Response:
    return http.signed("POST", f"/{bucket}?batch", body=json.dumps(doc).encode(), **options)  # type: ignore[arg-type]


@pytest.fixture
def filled(s3, bucket: str) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    objects = {f"img/{i:03d}.jpg": os.urandom(1000 + 97 * i) for i in range(20)}
    objects["empty"] = b""
    for key, data in objects.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    return objects


# -- the tar --------------------------------------------------------------------


def test_members_in_request_order_with_names_bytes_and_mtimes(s3, http: Sender, bucket: str,  # type: ignore[no-untyped-def]
                                                              filled: dict[str, bytes]) -> None:
    keys = ["img/005.jpg", "empty", "img/000.jpg", "img/019.jpg", "img/005.jpg"]  # a repeat, as asked
    response = post(http, bucket, {"keys": keys})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-tar"
    assert "content-length" not in response.headers  # streamed
    assert [(name, data) for name, data in members(response.content)] == [(k, filled[k]) for k in keys]
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:") as archive:
        info = archive.getmember("img/000.jpg")
        head = s3.head_object(Bucket=bucket, Key="img/000.jpg")
        assert info.isreg() and info.size == 1000
        assert info.mtime == int(head["LastModified"].timestamp())
    assert len(response.content) % 512 == 0 and response.content.endswith(bytes(1024))


def test_long_and_non_ascii_keys_travel_in_pax_headers(s3, bucket: str, gateway: Gateway) -> None:  # type: ignore[no-untyped-def]
    keys = ["d/" + "x" * 300, "données/été 日本.txt", "a" * 100, "b" * 101, "sp ace+plus=eq&amp"]
    for i, key in enumerate(keys):
        s3.put_object(Bucket=bucket, Key=key, Body=f"body {i}".encode())
    with client_of(gateway) as batches:
        got = list(batches.get_batch(bucket, keys))
    assert got == [(k, f"body {i}".encode()) for i, k in enumerate(keys)]


def test_missing_keys_are_error_members_when_skipping(http: Sender, bucket: str, filled: dict[str, bytes]) -> None:
    response = post(http, bucket, {"keys": ["img/001.jpg", "nope", "img/002.jpg", "x" * 1100]})
    assert response.status_code == 200
    assert members(response.content) == [
        ("img/001.jpg", filled["img/001.jpg"]), ("__errors__/nope", b"NoSuchKey"),
        ("img/002.jpg", filled["img/002.jpg"]), ("__errors__/" + "x" * 1100, b"KeyTooLongError"),
    ]


def test_a_missing_key_fails_the_request_before_any_byte(http: Sender, bucket: str,
                                                        filled: dict[str, bytes]) -> None:
    response = post(http, bucket, {"keys": ["img/001.jpg", "nope"], "on_error": "fail"})
    root = check_error(response, 404, "NoSuchKey")
    assert root is not None and root.findtext("Key") == "nope"
    check_error(post(http, "no-such-bucket-here", {"keys": ["a"]}), 404, "NoSuchBucket")


@pytest.mark.parametrize(("body", "code"), [
    (b"not json", "InvalidRequest"),
    (b"[]", "InvalidRequest"),
    (b'{"keys": "a"}', "InvalidRequest"),
    (b'{"keys": [1]}', "InvalidArgument"),
    (b'{"keys": ["a"], "on_error": "explode"}', "InvalidArgument"),
])
def test_malformed_requests_are_400(http: Sender, bucket: str, body: bytes, code: str) -> None:
    check_error(http.signed("POST", f"/{bucket}?batch", body=body), 400, code)


def test_limits_are_named_in_the_error(http: Sender, bucket: str) -> None:
    response = post(http, bucket, {"keys": [f"k{i}" for i in range(10_001)]})
    root = check_error(response, 400, "InvalidArgument")
    assert root is not None and "10000" in (root.findtext("Message") or "")
    big = json.dumps({"keys": ["k" * 1000] * 2200}).encode()  # over 2 MiB, fewer than 10,000 keys
    root = check_error(http.signed("POST", f"/{bucket}?batch", body=big), 400, "MaxMessageLengthExceeded")
    assert root is not None and str(2 * MiB) in (root.findtext("Message") or "")
    # 10,000 keys are fine (all missing here: 10,000 error members)
    response = post(http, bucket, {"keys": [f"k{i}" for i in range(10_000)]})
    assert response.status_code == 200 and len(members(response.content)) == 10_000


# -- authentication ---------------------------------------------------------------


def test_unsigned_and_badly_signed_requests_are_refused(http: Sender, bucket: str,
                                                       filled: dict[str, bytes]) -> None:
    body = json.dumps({"keys": ["img/001.jpg"]}).encode()
    check_error(http.unsigned("POST", f"/{bucket}?batch", body=body), 403, "AccessDenied")
    check_error(http.signed("POST", f"/{bucket}?batch", body=body, secret_key="wrong" * 8), 403,
                "SignatureDoesNotMatch")
    # The payload hash covers the body: another body under the same signature is refused.
    url = http.url(f"/{bucket}?batch")
    headers, _, _ = sign("POST", url, body=body)
    other = json.dumps({"keys": ["img/002.jpg"]}).encode()
    check_error(http.client.post(url, headers=headers, content=other), 400, "XAmzContentSHA256Mismatch")
    # UNSIGNED-PAYLOAD is accepted, as for PUT.
    response = http.signed("POST", f"/{bucket}?batch", body=body, payload_hash="UNSIGNED-PAYLOAD")
    assert response.status_code == 200 and members(response.content) == [("img/001.jpg", filled["img/001.jpg"])]


def test_presigned_manifest_reads(gateway: Gateway, s3, bucket: str, filled: dict[str, bytes]) -> None:  # type: ignore[no-untyped-def]
    keys = ["img/003.jpg", "img/004.jpg", "img/003.jpg"]
    with client_of(gateway) as batches:
        [url] = batches.virtual_shards(bucket, keys, per_shard=10)
        # Any HTTP client reads it: here httpx, with no credentials at all.
        response = httpx.get(url)
        assert response.status_code == 200
        assert members(response.content) == [(k, filled[k]) for k in keys]
        # CRLF manifests and blank lines are fine.
        s3.put_object(Bucket=bucket, Key="m2", Body=b"img/001.jpg\r\n\r\nnope\r\n")
        got = list(batches.read_url(batches.presign_batch(bucket, "m2")))
        assert got[0] == ("img/001.jpg", filled["img/001.jpg"])
        assert isinstance(got[1][1], BatchError) and got[1][1].code == "NoSuchKey"
        # The signature covers ?batch: the same URL without it is refused...
        check_error(httpx.get(url.replace("batch=&", "").replace("?batch=", "?")), 403, "SignatureDoesNotMatch")
        # ... and an expired one too.
        expired = batches.presign_batch(bucket, "__manifests__/shard-000000", expires=1)
        time.sleep(2.1)
        check_error(httpx.get(expired), 403, "AccessDenied")
        # A manifest that is not there, or too big.
        check_error(httpx.get(batches.presign_batch(bucket, "no-manifest")), 404, "NoSuchKey")
        s3.put_object(Bucket=bucket, Key="huge", Body=b"k\n" * (MiB + 1))
        check_error(httpx.get(batches.presign_batch(bucket, "huge")), 400, "MaxMessageLengthExceeded")
        response = httpx.get(batches.presign_batch(bucket, "m2").replace("batch=", "batch=&on_error=fail"))
        check_error(response, 403, "SignatureDoesNotMatch")  # on_error is signed too


def test_client_helpers(gateway: Gateway, bucket: str, filled: dict[str, bytes]) -> None:
    with client_of(gateway) as batches:
        with pytest.raises(RequestFailed) as failed:
            list(batches.get_batch(bucket, ["img/001.jpg", "nope"], on_error="fail"))
        assert failed.value.status == 404 and failed.value.code == "NoSuchKey"
    dataset = BatchDataset(bucket, sorted(filled), endpoint_url=gateway.endpoint, access_key=ACCESS_KEY,
                           secret_key=SECRET_KEY)
    assert len(dataset) == len(filled)
    assert dataset.__getitems__([3, 0, 3]) == [filled[sorted(filled)[i]] for i in (3, 0, 3)]
    assert dataset[1] == filled[sorted(filled)[1]]
