"""SigV2 clients against a real gateway process.

boto3's default presigned URLs for a custom us-east-1 endpoint are SigV2 query
auth (AWSAccessKeyId, Expires, Signature), fetched here with httpx as a
browser or curl would; a client configured with signature_version='s3' signs
every request with ``Authorization: AWS AK:signature``.
"""

from __future__ import annotations

import hashlib
import os

import httpx
import pytest
from botocore.exceptions import ClientError

from tests.conftest import make_client
from tests.servers import ACCESS_KEY

KEY = "pre/signed a+b=c ü.bin"


def _md5(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def _error(err: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = err.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


@pytest.fixture(scope="module")
def sigv2(gateway):
    """A client signing every request with SigV2 header auth."""
    return make_client(gateway.endpoint, signature_version="s3")


def test_default_presigned_put_and_get(s3, bucket: str) -> None:
    data = os.urandom(70_000)
    put_url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": KEY},
                                        ExpiresIn=300)
    assert f"AWSAccessKeyId={ACCESS_KEY}" in put_url and "X-Amz-" not in put_url
    response = httpx.put(put_url, content=data)
    assert response.status_code == 200, response.text
    assert response.headers["etag"] == _md5(data)

    get_url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": KEY},
                                        ExpiresIn=300)
    response = httpx.get(get_url)
    assert response.status_code == 200, response.text
    assert response.content == data
    assert s3.get_object(Bucket=bucket, Key=KEY)["Body"].read() == data


def test_default_presigned_put_with_content_type(s3, bucket: str) -> None:
    url = s3.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "typed", "ContentType": "text/csv"},
        ExpiresIn=300)
    response = httpx.put(url, content=b"a,b\n", headers={"Content-Type": "text/csv"})
    assert response.status_code == 200, response.text
    assert s3.head_object(Bucket=bucket, Key="typed")["ContentType"] == "text/csv"
    # Another Content-Type than the one signed does not pass.
    response = httpx.put(url, content=b"<p>", headers={"Content-Type": "text/html"})
    assert response.status_code == 403
    assert "<Code>SignatureDoesNotMatch</Code>" in response.text


def test_default_presigned_get_with_response_override(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="doc", Body=b"{}")
    url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "doc",
                              "ResponseContentType": "application/json"}, ExpiresIn=300)
    response = httpx.get(url)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    response = httpx.get(url.replace("application%2Fjson", "text%2Fhtml"))
    assert response.status_code == 403
    assert "<Code>SignatureDoesNotMatch</Code>" in response.text


def test_default_presigned_url_expired(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="old", Body=b"stale")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "old"},
                                    ExpiresIn=-60)  # Expires is a minute ago
    assert "Expires=" in url
    response = httpx.get(url)
    assert response.status_code == 403
    assert "<Code>AccessDenied</Code>" in response.text
    assert "Request has expired" in response.text


def test_default_presigned_url_tampered(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    s3.put_object(Bucket=bucket, Key="other", Body=b"secret")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"},
                                    ExpiresIn=300)
    assert httpx.get(url).content == b"x"
    response = httpx.get(url.replace(f"/{bucket}/k?", f"/{bucket}/other?"))
    assert response.status_code == 403
    assert "<Code>SignatureDoesNotMatch</Code>" in response.text


def test_sigv2_header_auth_client(sigv2, bucket: str) -> None:
    data = os.urandom(10_000)
    put = sigv2.put_object(Bucket=bucket, Key=KEY, Body=data, ContentType="application/x-raw",
                           Metadata={"owner": "alice"})
    assert put["ETag"] == _md5(data)
    got = sigv2.get_object(Bucket=bucket, Key=KEY)
    assert got["Body"].read() == data
    assert got["ContentType"] == "application/x-raw"
    assert got["Metadata"] == {"owner": "alice"}
    ranged = sigv2.get_object(Bucket=bucket, Key=KEY, Range="bytes=10-19")
    assert ranged["Body"].read() == data[10:20]
    sigv2.put_object(Bucket=bucket, Key="pre/other", Body=b"2")

    listed = sigv2.list_objects_v2(Bucket=bucket, Prefix="pre/")
    assert [o["Key"] for o in listed["Contents"]] == ["pre/other", KEY]
    listed = sigv2.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in listed["CommonPrefixes"]] == ["pre/"]

    sigv2.delete_object(Bucket=bucket, Key=KEY)
    with pytest.raises(ClientError) as err:
        sigv2.head_object(Bucket=bucket, Key=KEY)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    deleted = sigv2.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "pre/other"}]})
    assert [d["Key"] for d in deleted["Deleted"]] == ["pre/other"]
    assert sigv2.list_objects_v2(Bucket=bucket).get("Contents", []) == []


def test_sigv2_header_auth_multipart(sigv2, bucket: str) -> None:
    parts = [os.urandom(5 * 1024 * 1024), os.urandom(1000)]
    upload = sigv2.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    etags = [sigv2.upload_part(Bucket=bucket, Key="mp", UploadId=upload, PartNumber=n,
                               Body=part)["ETag"] for n, part in enumerate(parts, 1)]
    assert [p["PartNumber"] for p in
            sigv2.list_parts(Bucket=bucket, Key="mp", UploadId=upload)["Parts"]] == [1, 2]
    sigv2.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload, MultipartUpload={
        "Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]})
    assert sigv2.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"".join(parts)


def test_sigv2_wrong_secret_and_unknown_key(gateway, bucket: str) -> None:
    import boto3
    from botocore.config import Config

    for key, secret, code in [(ACCESS_KEY, "not-the-secret", "SignatureDoesNotMatch"),
                              ("nobody", "whatever", "InvalidAccessKeyId")]:
        client = boto3.client("s3", endpoint_url=gateway.endpoint, region_name="us-east-1",
                              aws_access_key_id=key, aws_secret_access_key=secret,
                              config=Config(signature_version="s3",
                                            retries={"max_attempts": 1}))
        with pytest.raises(ClientError) as err:
            client.list_objects_v2(Bucket=bucket)
        assert _error(err) == (code, 403)
