"""Smoke: the gateway process answers boto3 for the basic object life cycle."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError


def test_put_get_list_delete(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="a/b.txt", Body=b"hello", ContentType="text/plain", Metadata={"k": "v"})
    got = s3.get_object(Bucket=bucket, Key="a/b.txt")
    assert got["Body"].read() == b"hello"
    assert got["ContentType"] == "text/plain"
    assert got["Metadata"] == {"k": "v"}
    assert got["ETag"] == '"5d41402abc4b2a76b9719d911017c592"'
    listing = s3.list_objects_v2(Bucket=bucket)
    assert [o["Key"] for o in listing["Contents"]] == ["a/b.txt"]
    s3.delete_object(Bucket=bucket, Key="a/b.txt")
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="a/b.txt")
    assert err.value.response["Error"]["Code"] == "NoSuchKey"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
