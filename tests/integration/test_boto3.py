"""boto3 against a real gateway process: the client and the transfer manager.

Every expected value (ETags, checksums, ranges) is computed here from the
bytes the test sent, never read back from the gateway and trusted.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import hashlib
import importlib
import io
import os
import urllib.parse
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import botocore.auth
import botocore.httpchecksum
import httpx
import pytest
from awscrt import checksums as crt
from boto3.s3.transfer import TransferConfig
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.conftest import make_client
from tests.integration.helpers import random_file, sha256_file
from tests.servers import ACCESS_KEY, SECRET_KEY

MiB = 1024 * 1024


# -- helpers -----------------------------------------------------------------


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def multipart_etag(parts: list[bytes]) -> str:
    digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    return f'"{digest}-{len(parts)}"'


def checksum_digest(algorithm: str, data: bytes) -> bytes:
    if algorithm == "CRC32":
        return zlib.crc32(data).to_bytes(4, "big")
    if algorithm == "CRC32C":
        return crt.crc32c(data).to_bytes(4, "big")
    if algorithm == "CRC64NVME":
        return crt.crc64nvme(data).to_bytes(8, "big")
    if algorithm == "SHA1":
        return hashlib.sha1(data).digest()
    if algorithm == "SHA256":
        return hashlib.sha256(data).digest()
    raise AssertionError(algorithm)


def checksum_b64(algorithm: str, data: bytes) -> str:
    return base64.b64encode(checksum_digest(algorithm, data)).decode()


def error_of(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = exc.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def headers_of(response: dict) -> dict[str, str]:
    return response["ResponseMetadata"]["HTTPHeaders"]


# -- transfer manager ----------------------------------------------------------


def test_upload_download_file_200mib(s3, bucket: str, tmp_path: Path) -> None:
    """Default TransferConfig: 8 MiB parts, 10 threads, both directions."""
    source = tmp_path / "big.bin"
    expected = random_file(source, 200 * MiB)
    s3.upload_file(str(source), bucket, "big.bin", Config=TransferConfig())
    head = s3.head_object(Bucket=bucket, Key="big.bin", ChecksumMode="ENABLED")
    assert head["ContentLength"] == 200 * MiB
    # 25 parts of 8 MiB: ETag and (botocore's default CRC32) checksum per part.
    part_md5s, part_crcs, whole_crc = [], [], 0
    with open(source, "rb") as f:
        while block := f.read(8 * MiB):
            part_md5s.append(hashlib.md5(block).digest())
            part_crcs.append(zlib.crc32(block).to_bytes(4, "big"))
            whole_crc = zlib.crc32(block, whole_crc)
    assert head["ETag"] == f'"{hashlib.md5(b"".join(part_md5s)).hexdigest()}-25"'
    if head.get("ChecksumType") == "FULL_OBJECT":
        assert head["ChecksumCRC32"] == base64.b64encode(whole_crc.to_bytes(4, "big")).decode()
    elif "ChecksumCRC32" in head:
        composite = zlib.crc32(b"".join(part_crcs)).to_bytes(4, "big")
        assert head["ChecksumCRC32"] == f"{base64.b64encode(composite).decode()}-25"
    target = tmp_path / "big.out"
    s3.download_file(bucket, "big.bin", str(target), Config=TransferConfig())
    assert target.stat().st_size == 200 * MiB
    assert sha256_file(target) == expected


@pytest.mark.parametrize("size", [0, 1234, 9 * MiB + 17])
def test_upload_download_fileobj(s3, bucket: str, size: int) -> None:
    data = os.urandom(size)
    config = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB)
    s3.upload_fileobj(io.BytesIO(data), bucket, "obj", Config=config)
    out = io.BytesIO()
    s3.download_fileobj(bucket, "obj", out, Config=config)
    assert out.getvalue() == data
    etag = s3.head_object(Bucket=bucket, Key="obj")["ETag"]
    if size > 8 * MiB:
        assert etag == multipart_etag([data[: 8 * MiB], data[8 * MiB :]])
    else:
        assert etag == f'"{md5_hex(data)}"'


# -- multipart by hand ---------------------------------------------------------


def test_multipart_by_hand(s3, bucket: str) -> None:
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(12345)]
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp", ContentType="application/x-mp",
                                        Metadata={"kind": "multi"})
    upload_id = upload["UploadId"]
    etags = []
    for number, data in enumerate(parts, start=1):
        response = s3.upload_part(Bucket=bucket, Key="mp", UploadId=upload_id, PartNumber=number, Body=data)
        assert response["ETag"] == f'"{md5_hex(data)}"'
        etags.append(response["ETag"])

    listed = s3.list_parts(Bucket=bucket, Key="mp", UploadId=upload_id)
    assert [p["PartNumber"] for p in listed["Parts"]] == [1, 2, 3]
    assert [p["Size"] for p in listed["Parts"]] == [len(p) for p in parts]
    assert [p["ETag"] for p in listed["Parts"]] == etags
    assert listed["IsTruncated"] is False

    uploads = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("mp", upload_id)]

    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="mp", UploadId=upload_id,
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n} for n, e in enumerate(etags, start=1)]},
    )
    assert done["ETag"] == multipart_etag(parts)
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=bucket)

    got = s3.get_object(Bucket=bucket, Key="mp")
    assert got["Body"].read() == b"".join(parts)
    assert got["ETag"] == multipart_etag(parts)
    assert got["ContentType"] == "application/x-mp"
    assert got["Metadata"] == {"kind": "multi"}
    listing = s3.list_objects_v2(Bucket=bucket)["Contents"]
    assert [(o["Key"], o["Size"], o["ETag"]) for o in listing] == [
        ("mp", sum(map(len, parts)), multipart_etag(parts))
    ]
    # GetObject ?partNumber= answers one part.
    second = s3.get_object(Bucket=bucket, Key="mp", PartNumber=2)
    assert second["Body"].read() == parts[1]
    assert second["PartsCount"] == 3


def test_multipart_complete_errors(s3, bucket: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="m")["UploadId"]
    small = [b"a" * 1000, b"b" * 2000]
    etags = [s3.upload_part(Bucket=bucket, Key="m", UploadId=upload_id, PartNumber=n, Body=d)["ETag"]
             for n, d in enumerate(small, start=1)]

    def complete(parts: list[dict]) -> None:
        s3.complete_multipart_upload(Bucket=bucket, Key="m", UploadId=upload_id, MultipartUpload={"Parts": parts})

    with pytest.raises(ClientError) as err:
        complete([{"ETag": etags[0], "PartNumber": 1}, {"ETag": etags[1], "PartNumber": 2}])
    assert error_of(err) == ("EntityTooSmall", 400)
    with pytest.raises(ClientError) as err:
        complete([{"ETag": '"00000000000000000000000000000000"', "PartNumber": 2}])
    assert error_of(err) == ("InvalidPart", 400)
    with pytest.raises(ClientError) as err:
        complete([{"ETag": etags[0], "PartNumber": 3}])
    assert error_of(err) == ("InvalidPart", 400)
    with pytest.raises(ClientError) as err:
        complete([{"ETag": etags[1], "PartNumber": 2}, {"ETag": etags[0], "PartNumber": 1}])
    assert error_of(err) == ("InvalidPartOrder", 400)
    # Failed completions leave the upload intact; a single (last) part may be small.
    complete([{"ETag": etags[1], "PartNumber": 2}])
    got = s3.get_object(Bucket=bucket, Key="m")
    assert got["Body"].read() == small[1]
    assert got["ETag"] == multipart_etag([small[1]])
    # Overwrite the multipart object with a plain PUT.
    s3.put_object(Bucket=bucket, Key="m", Body=b"plain")
    assert s3.get_object(Bucket=bucket, Key="m")["Body"].read() == b"plain"


def test_multipart_complete_is_idempotent(s3, bucket: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="twice")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="twice", UploadId=upload_id, PartNumber=1, Body=b"once")["ETag"]
    parts = {"Parts": [{"ETag": etag, "PartNumber": 1}]}
    first = s3.complete_multipart_upload(Bucket=bucket, Key="twice", UploadId=upload_id, MultipartUpload=parts)
    again = s3.complete_multipart_upload(Bucket=bucket, Key="twice", UploadId=upload_id, MultipartUpload=parts)
    assert again["ETag"] == first["ETag"] == multipart_etag([b"once"])


def test_multipart_abort(s3, bucket: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="gone")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="gone", UploadId=upload_id, PartNumber=1, Body=b"x" * 1000)
    keep_id = s3.create_multipart_upload(Bucket=bucket, Key="kept")["UploadId"]
    listed = {u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket)["Uploads"]}
    assert listed == {upload_id, keep_id}

    s3.abort_multipart_upload(Bucket=bucket, Key="gone", UploadId=upload_id)
    listed = [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket)["Uploads"]]
    assert listed == [keep_id]
    with pytest.raises(ClientError) as err:
        s3.list_parts(Bucket=bucket, Key="gone", UploadId=upload_id)
    assert error_of(err) == ("NoSuchUpload", 404)
    with pytest.raises(ClientError) as err:
        s3.upload_part(Bucket=bucket, Key="gone", UploadId=upload_id, PartNumber=2, Body=b"y")
    assert error_of(err) == ("NoSuchUpload", 404)
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket=bucket, Key="gone")
    assert error_of(err)[1] == 404
    s3.abort_multipart_upload(Bucket=bucket, Key="kept", UploadId=keep_id)


def test_upload_part_copy_with_range(s3, bucket: str) -> None:
    source = os.urandom(6 * MiB + 100)
    s3.put_object(Bucket=bucket, Key="src", Body=source)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    first = s3.upload_part_copy(
        Bucket=bucket, Key="dst", UploadId=upload_id, PartNumber=1,
        CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange=f"bytes=0-{5 * MiB - 1}",
    )["CopyPartResult"]
    assert first["ETag"] == f'"{md5_hex(source[: 5 * MiB])}"'
    second = s3.upload_part_copy(
        Bucket=bucket, Key="dst", UploadId=upload_id, PartNumber=2,
        CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange=f"bytes={5 * MiB}-{len(source) - 1}",
    )["CopyPartResult"]
    assert second["ETag"] == f'"{md5_hex(source[5 * MiB :])}"'
    # A third part copied from the middle, uploaded then left out of the
    # completion, must not end up in the object.
    s3.upload_part_copy(
        Bucket=bucket, Key="dst", UploadId=upload_id, PartNumber=3,
        CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange="bytes=10-19",
    )
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="dst", UploadId=upload_id,
        MultipartUpload={"Parts": [{"ETag": first["ETag"], "PartNumber": 1},
                                   {"ETag": second["ETag"], "PartNumber": 2}]},
    )
    assert done["ETag"] == multipart_etag([source[: 5 * MiB], source[5 * MiB :]])
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == source

    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="bad")["UploadId"]
    with pytest.raises(ClientError) as err:
        s3.upload_part_copy(
            Bucket=bucket, Key="bad", UploadId=upload_id, PartNumber=1,
            CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange=f"bytes=0-{len(source)}",
        )
    assert error_of(err) == ("InvalidRange", 416)
    s3.abort_multipart_upload(Bucket=bucket, Key="bad", UploadId=upload_id)


# -- copy ----------------------------------------------------------------------


def test_copy_object_directives(s3, bucket: str) -> None:
    data = b"copy me " * 1000
    s3.put_object(Bucket=bucket, Key="src", Body=data, ContentType="text/x-source",
                  Metadata={"origin": "src", "n": "1"}, CacheControl="max-age=60")
    copied = s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "src"})
    assert copied["CopyObjectResult"]["ETag"] == f'"{md5_hex(data)}"'
    got = s3.get_object(Bucket=bucket, Key="copy")
    assert got["Body"].read() == data
    assert got["ContentType"] == "text/x-source"
    assert got["Metadata"] == {"origin": "src", "n": "1"}
    assert got["CacheControl"] == "max-age=60"

    s3.copy_object(
        Bucket=bucket, Key="replaced", CopySource={"Bucket": bucket, "Key": "src"},
        MetadataDirective="REPLACE", ContentType="application/x-new", Metadata={"fresh": "yes"},
    )
    got = s3.get_object(Bucket=bucket, Key="replaced")
    assert got["Body"].read() == data
    assert got["ContentType"] == "application/x-new"
    assert got["Metadata"] == {"fresh": "yes"}
    assert "CacheControl" not in got

    # Onto itself: only allowed with REPLACE, and keeps the bytes.
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket=bucket, Key="src", CopySource={"Bucket": bucket, "Key": "src"})
    assert error_of(err) == ("InvalidRequest", 400)
    s3.copy_object(Bucket=bucket, Key="src", CopySource={"Bucket": bucket, "Key": "src"},
                   MetadataDirective="REPLACE", Metadata={"v": "2"}, ContentType="text/plain")
    got = s3.get_object(Bucket=bucket, Key="src")
    assert got["Body"].read() == data
    assert got["Metadata"] == {"v": "2"}
    assert got["ContentType"] == "text/plain"
    assert got["ETag"] == f'"{md5_hex(data)}"'


def test_copy_source_conditionals(s3, bucket: str) -> None:
    data = b"conditional source"
    etag = s3.put_object(Bucket=bucket, Key="src", Body=data)["ETag"]
    source = {"Bucket": bucket, "Key": "src"}
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource=source, CopySourceIfMatch='"0123456789abcdef"')
    assert error_of(err) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource=source, CopySourceIfNoneMatch=etag)
    assert error_of(err) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket=bucket, Key="dst")
    assert error_of(err)[1] == 404
    s3.copy_object(Bucket=bucket, Key="dst", CopySource=source, CopySourceIfMatch=etag)
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == data


# -- conditional requests ------------------------------------------------------


def test_conditional_get_and_head(s3, bucket: str) -> None:
    etag = s3.put_object(Bucket=bucket, Key="c", Body=b"conditional", CacheControl="max-age=5")["ETag"]
    head = s3.head_object(Bucket=bucket, Key="c")
    modified = head["LastModified"]
    earlier = modified - dt.timedelta(days=1)

    assert s3.get_object(Bucket=bucket, Key="c", IfMatch=etag)["Body"].read() == b"conditional"
    assert s3.head_object(Bucket=bucket, Key="c", IfMatch=etag)["ETag"] == etag
    for call in (s3.get_object, s3.head_object):
        with pytest.raises(ClientError) as err:
            call(Bucket=bucket, Key="c", IfMatch='"ffffffffffffffffffffffffffffffff"')
        assert error_of(err)[1] == 412
        with pytest.raises(ClientError) as err:
            call(Bucket=bucket, Key="c", IfNoneMatch=etag)
        assert error_of(err)[1] == 304
        # A 304 names what the client already has (RFC 9110 15.4.5; S3 does).
        not_modified = headers_of(err.value.response)
        assert not_modified["etag"] == etag
        assert not_modified["last-modified"] == headers_of(head)["last-modified"]
        assert not_modified["cache-control"] == "max-age=5"
        with pytest.raises(ClientError) as err:
            call(Bucket=bucket, Key="c", IfModifiedSince=modified)
        assert error_of(err)[1] == 304
        with pytest.raises(ClientError) as err:
            call(Bucket=bucket, Key="c", IfUnmodifiedSince=earlier)
        assert error_of(err)[1] == 412
        # The conditions that hold.
        call(Bucket=bucket, Key="c", IfNoneMatch='"ffffffffffffffffffffffffffffffff"')
        call(Bucket=bucket, Key="c", IfModifiedSince=earlier)
        call(Bucket=bucket, Key="c", IfUnmodifiedSince=modified)
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="c", IfMatch='"ffffffffffffffffffffffffffffffff"')
    assert error_of(err) == ("PreconditionFailed", 412)


def test_put_if_none_match_star(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="once", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="once", Body=b"second", IfNoneMatch="*")
    assert error_of(err) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="once")["Body"].read() == b"first"


# -- ranges and response headers -----------------------------------------------


def test_ranges(s3, bucket: str) -> None:
    data = os.urandom(3 * MiB + 11)
    size = len(data)
    s3.put_object(Bucket=bucket, Key="r", Body=data)
    cases = {
        "bytes=0-0": (0, 1),
        "bytes=100-199": (100, 200),
        f"bytes={MiB - 5}-{2 * MiB + 5}": (MiB - 5, 2 * MiB + 6),
        f"bytes={size - 10}-": (size - 10, size),
        "bytes=-4096": (size - 4096, size),
        f"bytes=5-{size + 100}": (5, size),
        f"bytes=-{size + 100}": (0, size),
    }
    for header, (start, end) in cases.items():
        got = s3.get_object(Bucket=bucket, Key="r", Range=header)
        assert got["Body"].read() == data[start:end], header
        assert got["ContentRange"] == f"bytes {start}-{end - 1}/{size}", header
        assert got["ContentLength"] == end - start
        assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    for header in (f"bytes={size}-", f"bytes={size + 5}-{size + 10}"):
        with pytest.raises(ClientError) as err:
            s3.get_object(Bucket=bucket, Key="r", Range=header)
        assert error_of(err) == ("InvalidRange", 416), header


def test_response_header_overrides(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="o", Body=b"override", ContentType="text/plain")
    got = s3.get_object(
        Bucket=bucket, Key="o", ResponseContentType="application/x-custom",
        ResponseContentDisposition='attachment; filename="x.bin"', ResponseCacheControl="no-store",
        ResponseContentLanguage="de",
    )
    assert got["Body"].read() == b"override"
    assert got["ContentType"] == "application/x-custom"
    assert got["ContentDisposition"] == 'attachment; filename="x.bin"'
    assert got["CacheControl"] == "no-store"
    assert got["ContentLanguage"] == "de"
    # Overrides are per request, never stored.
    assert s3.head_object(Bucket=bucket, Key="o")["ContentType"] == "text/plain"


def test_stored_representation_headers(s3, bucket: str) -> None:
    payload = gzip.compress(b"hello " * 500)
    expires = dt.datetime(2037, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    s3.put_object(
        Bucket=bucket, Key="h", Body=payload, ContentType="text/plain; charset=utf-8",
        ContentEncoding="gzip", ContentDisposition='inline; filename="h.txt"',
        CacheControl="public, max-age=3600", Expires=expires, ContentLanguage="en-GB",
    )
    for response in (s3.head_object(Bucket=bucket, Key="h"), s3.get_object(Bucket=bucket, Key="h")):
        assert response["ContentType"] == "text/plain; charset=utf-8"
        assert response["ContentEncoding"] == "gzip"
        assert response["ContentDisposition"] == 'inline; filename="h.txt"'
        assert response["CacheControl"] == "public, max-age=3600"
        assert response["ContentLanguage"] == "en-GB"
        assert headers_of(response)["expires"] == "Fri, 02 Jan 2037 03:04:05 GMT"
        assert response["ContentLength"] == len(payload)
    # Stored bytes are the gzip stream as sent, not decoded.
    assert s3.get_object(Bucket=bucket, Key="h")["Body"].read() == payload


# -- checksums -----------------------------------------------------------------

ALGORITHMS = ["CRC32", "CRC32C", "SHA1", "SHA256", "CRC64NVME"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_put_checksum_round_trip(s3, bucket: str, algorithm: str) -> None:
    data = os.urandom(300_001)
    expected = checksum_b64(algorithm, data)
    field = f"Checksum{algorithm}"
    put = s3.put_object(Bucket=bucket, Key="k", Body=data, ChecksumAlgorithm=algorithm)
    assert put[field] == expected
    head = s3.head_object(Bucket=bucket, Key="k", ChecksumMode="ENABLED")
    assert head[field] == expected
    assert head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT"
    got = s3.get_object(Bucket=bucket, Key="k", ChecksumMode="ENABLED")
    assert got[field] == expected
    assert got["Body"].read() == data
    # Without ChecksumMode the checksum is not announced.
    assert field not in s3.head_object(Bucket=bucket, Key="k")


def test_put_wrong_checksum_is_rejected(s3, bucket: str) -> None:
    data = b"some bytes"
    wrong = checksum_b64("CRC32", b"other bytes")
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="k", Body=data, ChecksumCRC32=wrong)
    assert error_of(err) == ("BadDigest", 400)
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket=bucket, Key="k")
    assert error_of(err)[1] == 404


def _multipart_with_checksum(s3, bucket: str, key: str, parts: list[bytes], **create: str) -> dict:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32", **create)["UploadId"]
    done = []
    for number, data in enumerate(parts, start=1):
        response = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                  Body=data, ChecksumAlgorithm="CRC32")
        assert response["ChecksumCRC32"] == checksum_b64("CRC32", data)
        done.append({"ETag": response["ETag"], "PartNumber": number, "ChecksumCRC32": response["ChecksumCRC32"]})
    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id)
    assert [p["ChecksumCRC32"] for p in listed["Parts"]] == [d["ChecksumCRC32"] for d in done]
    return s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                        MultipartUpload={"Parts": done})


def test_multipart_composite_crc32(s3, bucket: str) -> None:
    parts = [os.urandom(5 * MiB), os.urandom(777)]
    done = _multipart_with_checksum(s3, bucket, "comp", parts)
    combined = zlib.crc32(b"".join(checksum_digest("CRC32", p) for p in parts)).to_bytes(4, "big")
    expected = f"{base64.b64encode(combined).decode()}-2"
    assert done["ChecksumCRC32"] == expected
    head = s3.head_object(Bucket=bucket, Key="comp", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == expected
    assert head["ChecksumType"] == "COMPOSITE"
    got = s3.get_object(Bucket=bucket, Key="comp", ChecksumMode="ENABLED")
    assert got["Body"].read() == b"".join(parts)


def test_multipart_full_object_crc32(s3, bucket: str) -> None:
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(4321)]
    done = _multipart_with_checksum(s3, bucket, "full", parts, ChecksumType="FULL_OBJECT")
    expected = checksum_b64("CRC32", b"".join(parts))
    assert done["ChecksumCRC32"] == expected
    head = s3.head_object(Bucket=bucket, Key="full", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == expected
    assert head["ChecksumType"] == "FULL_OBJECT"
    # botocore validates a full-object checksum on read.
    got = s3.get_object(Bucket=bucket, Key="full", ChecksumMode="ENABLED")
    assert got["Body"].read() == b"".join(parts)


# -- buckets -------------------------------------------------------------------


def test_bucket_operations(s3, bucket: str) -> None:
    assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    head = s3.head_bucket(Bucket=bucket)
    assert head["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert headers_of(head)["x-amz-bucket-region"] == "us-east-1"
    assert s3.get_bucket_location(Bucket=bucket).get("LocationConstraint") in (None, "")
    versioning = s3.get_bucket_versioning(Bucket=bucket)
    assert "Status" not in versioning

    s3.put_object(Bucket=bucket, Key="a", Body=b"1")
    s3.put_object(Bucket=bucket, Key="b/c", Body=b"22")
    versions = s3.list_object_versions(Bucket=bucket)["Versions"]
    assert [(v["Key"], v["VersionId"], v["IsLatest"], v["Size"]) for v in versions] == [
        ("a", "null", True, 1), ("b/c", "null", True, 2),
    ]

    s3.put_bucket_acl(Bucket=bucket, ACL="private")
    acl = s3.get_bucket_acl(Bucket=bucket)
    assert [g["Permission"] for g in acl["Grants"]] == ["FULL_CONTROL"]
    s3.put_object_acl(Bucket=bucket, Key="a", ACL="private")
    acl = s3.get_object_acl(Bucket=bucket, Key="a")
    assert [g["Permission"] for g in acl["Grants"]] == ["FULL_CONTROL"]
    s3.put_object(Bucket=bucket, Key="with-acl", Body=b"x", ACL="private")

    with pytest.raises(ClientError) as err:
        s3.head_bucket(Bucket=bucket + "-missing")
    assert error_of(err)[1] == 404
    with pytest.raises(ClientError) as err:
        s3.list_objects_v2(Bucket=bucket + "-missing")
    assert error_of(err) == ("NoSuchBucket", 404)


def test_delete_bucket_not_empty(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="still-here", Body=b"x")
    with pytest.raises(ClientError) as err:
        s3.delete_bucket(Bucket=bucket)
    assert error_of(err) == ("BucketNotEmpty", 409)
    s3.delete_object(Bucket=bucket, Key="still-here")
    s3.delete_bucket(Bucket=bucket)
    with pytest.raises(ClientError) as err:
        s3.head_bucket(Bucket=bucket)
    assert error_of(err)[1] == 404
    assert bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def _put_many(s3, bucket: str, keys: list[str]) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket=bucket, Key=k, Body=k.encode()), keys))


def test_delete_objects_1000_verbose_and_quiet(s3, bucket: str) -> None:
    # 1000 keys per request (S3's maximum); only some exist, to keep the
    # test fast: deleting a missing key succeeds and is reported the same.
    existing = [f"many/{i:04d}" for i in range(400)]
    _put_many(s3, bucket, existing)
    verbose_keys = existing[:200] + [f"absent/{i:04d}" for i in range(800)]
    verbose = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in verbose_keys]})
    assert sorted(d["Key"] for d in verbose["Deleted"]) == sorted(verbose_keys)
    assert "Errors" not in verbose
    paginator = s3.get_paginator("list_objects_v2")
    remaining = [o["Key"] for page in paginator.paginate(Bucket=bucket) for o in page.get("Contents", [])]
    assert remaining == existing[200:]

    quiet_keys = [f"absent/{i:04d}" for i in range(800, 1600)] + existing[200:]
    quiet = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in quiet_keys], "Quiet": True})
    assert "Deleted" not in quiet
    assert "Errors" not in quiet
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)

    with pytest.raises(ClientError) as err:
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": f"k{i}"} for i in range(1001)]})
    assert error_of(err) == ("MalformedXML", 400)


# -- key names -----------------------------------------------------------------

ODD_KEYS = [
    "ünïcødé/日本語/файл.txt",
    "emoji 🎉 party",
    "with space/and more spaces .txt",
    "plus+sign+key",
    "percent%20literal%2F%",
    "double//slash//inside",
    "a=b&c=d?e#f",
    "tilde~and'quote\"",
    "x" * 1024,
    "é" * 512,  # 1024 bytes of UTF-8
]


def test_odd_keys_round_trip(s3, bucket: str) -> None:
    for i, key in enumerate(ODD_KEYS):
        s3.put_object(Bucket=bucket, Key=key, Body=f"body {i}".encode())
    for i, key in enumerate(ODD_KEYS):
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == f"body {i}".encode(), key
        assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(f"body {i}")
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert listed == sorted(ODD_KEYS, key=lambda k: k.encode())
    # ListObjects v1 without encoding-type: the XML carries the raw keys.
    v1 = s3.list_objects(Bucket=bucket)["Contents"]
    assert [o["Key"] for o in v1] == listed
    listed_prefix = s3.list_objects_v2(Bucket=bucket, Prefix="double/", Delimiter="/")
    assert [p["Prefix"] for p in listed_prefix.get("CommonPrefixes", [])] == ["double//"]
    listed_prefix = s3.list_objects_v2(Bucket=bucket, Prefix="double//", Delimiter="/")
    assert [p["Prefix"] for p in listed_prefix.get("CommonPrefixes", [])] == ["double//slash/"]
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 3})
    assert [o["Key"] for page in pages for o in page["Contents"]] == listed
    # x-amz-copy-source carries the key percent-encoded.
    for key in ODD_KEYS[:7]:
        s3.copy_object(Bucket=bucket, Key=key + ".copy", CopySource={"Bucket": bucket, "Key": key})
        assert s3.get_object(Bucket=bucket, Key=key + ".copy")["Body"].read() == \
            s3.get_object(Bucket=bucket, Key=key)["Body"].read(), key
    deleted = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k + ".copy"} for k in ODD_KEYS[:7]]})
    assert sorted(d["Key"] for d in deleted["Deleted"]) == sorted(k + ".copy" for k in ODD_KEYS[:7])
    for key in ODD_KEYS:
        s3.delete_object(Bucket=bucket, Key=key)
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)


def test_key_length_limit(s3, bucket: str) -> None:
    ok, too_long = "k" * 1024, "k" * 1025
    s3.put_object(Bucket=bucket, Key=ok, Body=b"fits")
    assert s3.get_object(Bucket=bucket, Key=ok)["Body"].read() == b"fits"
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key=too_long, Body=b"too long")
    assert error_of(err) == ("KeyTooLongError", 400)
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="é" * 512 + "k", Body=b"1025 bytes")
    assert error_of(err) == ("KeyTooLongError", 400)
    with pytest.raises(ClientError) as err:
        s3.create_multipart_upload(Bucket=bucket, Key=too_long)
    assert error_of(err) == ("KeyTooLongError", 400)
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == [ok]
    s3.delete_object(Bucket=bucket, Key=ok)


# -- persistence ---------------------------------------------------------------


def test_objects_survive_restart(fresh_gateway) -> None:
    s3 = make_client(fresh_gateway.endpoint)
    s3.create_bucket(Bucket="persist")
    small = os.urandom(1000)
    parts = [os.urandom(5 * MiB), os.urandom(3000)]
    s3.put_object(Bucket="persist", Key="small", Body=small, ContentType="text/x-small",
                  Metadata={"a": "1"}, ChecksumAlgorithm="CRC32C", CacheControl="no-cache")
    upload_id = s3.create_multipart_upload(Bucket="persist", Key="dir/multi", Metadata={"b": "2"},
                                           ChecksumAlgorithm="SHA256")["UploadId"]
    done = []
    for number, data in enumerate(parts, start=1):
        r = s3.upload_part(Bucket="persist", Key="dir/multi", UploadId=upload_id, PartNumber=number,
                           Body=data, ChecksumAlgorithm="SHA256")
        done.append({"ETag": r["ETag"], "PartNumber": number, "ChecksumSHA256": r["ChecksumSHA256"]})
    s3.complete_multipart_upload(Bucket="persist", Key="dir/multi", UploadId=upload_id,
                                 MultipartUpload={"Parts": done})
    pending = s3.create_multipart_upload(Bucket="persist", Key="pending")["UploadId"]
    s3.upload_part(Bucket="persist", Key="pending", UploadId=pending, PartNumber=1, Body=b"p" * 100)
    s3.put_object(Bucket="persist", Key="deleted", Body=b"bye")
    s3.delete_object(Bucket="persist", Key="deleted")
    composite = hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).digest()
    expected_multi_checksum = f"{base64.b64encode(composite).decode()}-2"

    def snapshot(client) -> dict:
        heads = {k: client.head_object(Bucket="persist", Key=k, ChecksumMode="ENABLED") for k in ("small", "dir/multi")}
        return {
            "listing": [(o["Key"], o["Size"], o["ETag"]) for o in client.list_objects_v2(Bucket="persist")["Contents"]],
            "small": (heads["small"]["ETag"], heads["small"]["Metadata"], heads["small"]["ContentType"],
                      heads["small"]["ChecksumCRC32C"], heads["small"]["CacheControl"]),
            "multi": (heads["dir/multi"]["ETag"], heads["dir/multi"]["Metadata"],
                      heads["dir/multi"]["ChecksumSHA256"]),
            "uploads": [u["UploadId"] for u in client.list_multipart_uploads(Bucket="persist").get("Uploads", [])],
        }

    before = snapshot(s3)
    assert before["small"] == (f'"{md5_hex(small)}"', {"a": "1"}, "text/x-small",
                               checksum_b64("CRC32C", small), "no-cache")
    assert before["multi"] == (multipart_etag(parts), {"b": "2"}, expected_multi_checksum)
    assert before["uploads"] == [pending]

    fresh_gateway.restart()
    s3 = make_client(fresh_gateway.endpoint)
    assert snapshot(s3) == before
    assert s3.get_object(Bucket="persist", Key="small")["Body"].read() == small
    assert s3.get_object(Bucket="persist", Key="dir/multi")["Body"].read() == b"".join(parts)
    assert [p["Size"] for p in s3.list_parts(Bucket="persist", Key="pending", UploadId=pending)["Parts"]] == [100]
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="persist", Key="deleted")
    assert error_of(err) == ("NoSuchKey", 404)
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["persist"]


# -- presigned URLs ------------------------------------------------------------


def _presigner(gateway):
    """boto3 presigns with SigV2 for a custom us-east-1 endpoint unless told
    otherwise; these tests exercise the SigV4 form (SigV2 has test_sigv2.py)."""
    return make_client(gateway.endpoint, signature_version="s3v4")


def test_presigned_get_and_put(gateway, bucket: str) -> None:
    s3 = _presigner(gateway)
    data = os.urandom(70_000)
    put_url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "pre/signed"}, ExpiresIn=300)
    assert "X-Amz-Signature=" in put_url
    response = httpx.put(put_url, content=data)
    assert response.status_code == 200, response.text
    assert response.headers["etag"] == f'"{md5_hex(data)}"'
    get_url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "pre/signed"}, ExpiresIn=300)
    response = httpx.get(get_url)
    assert response.status_code == 200
    assert response.content == data
    # A tampered URL does not pass.
    response = httpx.get(get_url.replace("pre/signed", "pre/other"))
    assert response.status_code == 403
    assert "<Code>SignatureDoesNotMatch</Code>" in response.text


def test_presigned_url_expired(gateway, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s3 = _presigner(gateway)
    s3.put_object(Bucket=bucket, Key="old", Body=b"stale")
    an_hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)

    def clock(remove_tzinfo: bool = True) -> dt.datetime:
        return an_hour_ago.replace(tzinfo=None) if remove_tzinfo else an_hour_ago

    # botocore signs with the CRT's signer when awscrt is installed.
    monkeypatch.setattr(botocore.auth, "get_current_datetime", clock)
    try:
        crt_auth = importlib.import_module("botocore.crt.auth")
    except ImportError:
        crt_auth = None
    if crt_auth is not None:
        monkeypatch.setattr(crt_auth, "get_current_datetime", clock)
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "old"}, ExpiresIn=60)
    monkeypatch.undo()
    assert f"X-Amz-Date={an_hour_ago:%Y%m%dT%H}" in url
    response = httpx.get(url)
    assert response.status_code == 403
    assert "<Code>AccessDenied</Code>" in response.text
    assert "expired" in response.text


def test_presigned_get_default_client_config(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="v2", Body=b"default presign")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "v2"}, ExpiresIn=60)
    response = httpx.get(url)
    assert response.status_code == 200, response.text
    assert response.content == b"default presign"


def test_early_error_does_not_poison_the_connection(s3, bucket: str) -> None:
    """An error answered before a PUT body is read (the client waits on
    Expect: 100-continue and never sends it) must not leave the body's
    place on a kept-alive connection to be parsed as the next request."""
    s3.put_object(Bucket=bucket, Key="exists", Body=b"v1")
    for _ in range(3):
        with pytest.raises(ClientError) as err:
            s3.put_object(Bucket=bucket, Key="exists", Body=b"v2" * 1000, IfNoneMatch="*")
        assert error_of(err) == ("PreconditionFailed", 412)
        with pytest.raises(ClientError) as err:
            s3.put_object(Bucket=bucket + "-nope", Key="k", Body=b"x" * 100)
        assert error_of(err) == ("NoSuchBucket", 404)
        assert s3.get_object(Bucket=bucket, Key="exists")["Body"].read() == b"v1"


# -- no framing bytes inside stored objects --------------------------------------

SIZES = [0, 1, 8191, 65536, MiB + 3, 9 * MiB]


def _as_if_tls(url: str):
    """botocore's urlparse, but reporting https: botocore only streams
    aws-chunked bodies with trailing checksums over TLS."""
    return urllib.parse.urlparse(url)._replace(scheme="https")


@pytest.mark.parametrize(
    ("config", "trailers"),
    [({}, False), ({"request_checksum_calculation": "when_supported"}, False),
     ({}, True), ({"request_checksum_calculation": "when_supported"}, True)],
    ids=["default", "when_supported", "default-trailers", "when_supported-trailers"],
)
def test_default_client_stores_exact_bytes(
    gateway, bucket: str, config: dict, trailers: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if trailers:
        monkeypatch.setattr(botocore.httpchecksum, "urlparse", _as_if_tls)
    client = make_client(gateway.endpoint, **config)
    modes: list[str] = []
    client.meta.events.register(
        "before-send.s3.*", lambda request, **_: modes.append(request.headers.get("x-amz-content-sha256", b""))
    )
    blobs = {size: os.urandom(size) for size in SIZES}
    for size, data in blobs.items():
        put = client.put_object(Bucket=bucket, Key=f"exact/{size}", Body=data)
        assert put["ETag"] == f'"{md5_hex(data)}"', size
    # A file-like body and the transfer manager, which stream differently.
    client.put_object(Bucket=bucket, Key="exact/fileobj", Body=io.BytesIO(blobs[MiB + 3]))
    client.upload_fileobj(io.BytesIO(blobs[9 * MiB]), bucket, "exact/transfer")
    for size, data in blobs.items():
        got = client.get_object(Bucket=bucket, Key=f"exact/{size}")
        assert got["ContentLength"] == size
        assert got["Body"].read() == data, size
        assert "ContentEncoding" not in got
        # The CRC32 botocore sent (header or trailer) was verified and kept.
        head = client.head_object(Bucket=bucket, Key=f"exact/{size}", ChecksumMode="ENABLED")
        assert head.get("ChecksumCRC32") == checksum_b64("CRC32", data), size
    assert client.get_object(Bucket=bucket, Key="exact/fileobj")["Body"].read() == blobs[MiB + 3]
    assert client.get_object(Bucket=bucket, Key="exact/transfer")["Body"].read() == blobs[9 * MiB]
    streamed = [m for m in modes if m in (b"STREAMING-UNSIGNED-PAYLOAD-TRAILER", "STREAMING-UNSIGNED-PAYLOAD-TRAILER")]
    # Every PUT and UploadPart above went aws-chunked with a trailer, or none did.
    assert len(streamed) == (len(SIZES) + 1 + 2 if trailers else 0)
    sizes = {o["Key"]: o["Size"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert sizes == {**{f"exact/{s}": s for s in SIZES}, "exact/fileobj": MiB + 3, "exact/transfer": 9 * MiB}


def _unsigned_trailer_put(endpoint: str, bucket: str, key: str, payload: bytes, trailer_value: str,
                          chunk: int = 64 * 1024, extra_headers: dict[str, str] | None = None) -> httpx.Response:
    body = bytearray()
    for offset in range(0, len(payload), chunk):
        piece = payload[offset : offset + chunk]
        body += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    body += b"0\r\n" + f"x-amz-checksum-crc32:{trailer_value}\r\n".encode() + b"\r\n"
    headers = {
        "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(payload)),
        "x-amz-trailer": "x-amz-checksum-crc32",
        "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "Content-Length": str(len(body)),
        **(extra_headers or {}),
    }
    request = AWSRequest(method="PUT", url=f"{endpoint}/{bucket}/{key}", headers=headers, data=bytes(body))
    request.context["checksum"] = {"request_algorithm": {"in": "trailer", "algorithm": "crc32"}}
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(request)
    assert request.headers["X-Amz-Content-SHA256"] == "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    return httpx.put(request.url, headers=dict(request.headers.items()), content=bytes(body))


def test_raw_unsigned_trailer_body(gateway, s3, bucket: str) -> None:
    payload = os.urandom(200 * 1024 + 7)
    expected = checksum_b64("CRC32", payload)
    response = _unsigned_trailer_put(gateway.endpoint, bucket, "chunked", payload, expected,
                                     extra_headers={"Content-Type": "application/x-chunked"})
    assert response.status_code == 200, response.text
    assert response.headers["etag"] == f'"{md5_hex(payload)}"'
    got = s3.get_object(Bucket=bucket, Key="chunked", ChecksumMode="ENABLED")
    assert got["Body"].read() == payload
    assert got["ContentLength"] == len(payload)
    assert got["ChecksumCRC32"] == expected
    assert got["ContentType"] == "application/x-chunked"
    assert "ContentEncoding" not in got  # aws-chunked is framing, not stored

    # The framing around a real Content-Encoding: only aws-chunked is dropped.
    response = _unsigned_trailer_put(gateway.endpoint, bucket, "gz", payload, expected,
                                     extra_headers={"Content-Encoding": "aws-chunked,gzip"})
    assert response.status_code == 200, response.text
    got = s3.get_object(Bucket=bucket, Key="gz")
    assert got["Body"].read() == payload
    assert got["ContentEncoding"] == "gzip"

    # A trailer that does not match the data is refused, nothing stored.
    response = _unsigned_trailer_put(gateway.endpoint, bucket, "bad", payload, checksum_b64("CRC32", b"nope"))
    assert response.status_code == 400
    assert "<Code>BadDigest</Code>" in response.text
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket=bucket, Key="bad")
    assert error_of(err)[1] == 404


# -- the log -------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def log_offset(gateway) -> int:
    """Where the session gateway's log stood when this module started."""
    return len(gateway.log())


def test_zz_no_internal_error_logged(gateway, log_offset: int) -> None:
    """Runs last in this module: nothing above may have become a 500."""
    log = gateway.log()[log_offset:]
    assert "Traceback" not in log, log[-5000:]
    assert "InternalError" not in log, log[-5000:]
