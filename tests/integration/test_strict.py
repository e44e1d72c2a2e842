"""Where S3 refuses a request, the gateway refuses it too, with S3's code
and status, and keeps nothing of a refused write.

Each case was accepted before (the hostile-input review): a bucket owner
the client did not expect, a storage class S3 does not know, a checksum
algorithm named with no value, part numbers in non-ASCII digits, object lock
asked for (501, never silently ignored), and GetBatch bodies that are
nested too deeply or name a key no S3 key can be (a lone surrogate).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
from botocore.exceptions import ClientError

from tests.integration.s3raw import RecordingClient, Sender, boto_error, check_error
from tests.servers import ACCESS_KEY


def assert_absent(s3: RecordingClient, bucket: str, key: str) -> None:
    with pytest.raises(ClientError) as info:
        s3.head_object(Bucket=bucket, Key=key)
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_an_unexpected_bucket_owner_is_access_denied(s3r: RecordingClient, bucket: str) -> None:
    boto_error(s3r, s3r.put_object, 403, "AccessDenied", Bucket=bucket, Key="k", Body=b"x",
               ExpectedBucketOwner="123456789012")
    assert_absent(s3r, bucket, "k")
    boto_error(s3r, s3r.list_objects_v2, 403, "AccessDenied", Bucket=bucket, ExpectedBucketOwner="111122223333")


def test_the_expected_owner_is_the_one_listings_name(s3r: RecordingClient, bucket: str) -> None:
    owner = s3r.list_buckets()["Owner"]
    assert owner["ID"] == hashlib.sha256(ACCESS_KEY.encode()).hexdigest()
    s3r.put_object(Bucket=bucket, Key="k", Body=b"x", ExpectedBucketOwner=owner["ID"])
    got = s3r.get_object(Bucket=bucket, Key="k", ExpectedBucketOwner=owner["ID"])
    assert got["Body"].read() == b"x"


def test_an_unknown_storage_class_is_refused(s3r: RecordingClient, bucket: str) -> None:
    boto_error(s3r, s3r.put_object, 400, "InvalidStorageClass", Bucket=bucket, Key="k", Body=b"x",
               StorageClass="EVIL")
    assert_absent(s3r, bucket, "k")
    boto_error(s3r, s3r.create_multipart_upload, 400, "InvalidStorageClass", Bucket=bucket, Key="m",
               StorageClass="EVIL")
    s3r.put_object(Bucket=bucket, Key="ia", Body=b"x", StorageClass="STANDARD_IA")  # one S3 knows: kept
    assert s3r.get_object(Bucket=bucket, Key="ia")["Body"].read() == b"x"


def test_a_checksum_algorithm_without_its_value_is_refused(http: Sender, s3r: RecordingClient, bucket: str) -> None:
    check_error(http.signed("PUT", f"/{bucket}/k", body=b"data",
                            headers={"x-amz-sdk-checksum-algorithm": "CRC32"}), 400, "InvalidRequest")
    assert_absent(s3r, bucket, "k")


@pytest.mark.parametrize("number", ["\u0663", "\u00b2", " 1", "+1"])
def test_part_numbers_are_ascii_digits(http: Sender, s3r: RecordingClient, bucket: str, number: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"x")
    check_error(http.signed("GET", f"/{bucket}/k?partNumber={quote(number)}"), 400, "InvalidArgument")
    upload = s3r.create_multipart_upload(Bucket=bucket, Key="m")["UploadId"]
    check_error(http.signed("PUT", f"/{bucket}/m?partNumber={quote(number)}&uploadId={quote(upload)}",
                            body=b"part"), 400, "InvalidArgument")
    assert s3r.list_parts(Bucket=bucket, Key="m", UploadId=upload).get("Parts", []) == []


def test_object_lock_is_not_implemented_never_ignored(s3r: RecordingClient, bucket: str) -> None:
    until = datetime.now(UTC) + timedelta(days=1)
    boto_error(s3r, s3r.put_object, 501, "NotImplemented", Bucket=bucket, Key="k", Body=b"x",
               ObjectLockMode="GOVERNANCE", ObjectLockRetainUntilDate=until)
    boto_error(s3r, s3r.put_object, 501, "NotImplemented", Bucket=bucket, Key="k", Body=b"x",
               ObjectLockLegalHoldStatus="ON")
    assert_absent(s3r, bucket, "k")
    name = f"{bucket[:50]}-locked"
    boto_error(s3r, s3r.create_bucket, 501, "NotImplemented", Bucket=name, ObjectLockEnabledForBucket=True)
    boto_error(s3r, s3r.head_bucket, 404, "404", head=True, Bucket=name)


def test_a_batch_nested_too_deeply_is_a_400(http: Sender, bucket: str) -> None:
    deep = b'{"keys": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    check_error(http.signed("POST", f"/{bucket}?batch", body=deep), 400, "InvalidRequest")


def test_a_batch_key_with_a_lone_surrogate_is_a_400(http: Sender, s3r: RecordingClient, bucket: str) -> None:
    s3r.put_object(Bucket=bucket, Key="k", Body=b"x")
    for keys in (["\ud800"], ["k", "a\udfffb"]):
        body = json.dumps({"keys": keys}).encode()  # ASCII JSON with the escape: valid JSON
        check_error(http.signed("POST", f"/{bucket}?batch", body=body), 400, "InvalidArgument")
    ok = http.signed("POST", f"/{bucket}?batch", body=json.dumps({"keys": ["k"]}).encode())
    assert ok.status_code == 200  # the gateway goes on answering batches
