"""What third-party S3 suites tripped on, against a real gateway with boto3
(and s3fs where it has the feature): re-creating a bucket, empty listing
pages, empty continuation tokens, Content-Encoding, the encryption header,
and conditional writes, races included (issue 25).

Every race here is decided by the index lock, not by timing: concurrent
clients may interleave any way they like, and the test checks what must
hold for every interleaving (one winner, no lost update).
"""

from __future__ import annotations

import hashlib
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from tests.conftest import make_client, running_gateway
from tests.integration.s3raw import read_answer, sign

MiB = 1024 * 1024
SSE = "x-amz-server-side-encryption"


def error_of(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = exc.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def headers_of(response: dict) -> dict[str, str]:
    return response["ResponseMetadata"]["HTTPHeaders"]


def quoted_md5(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


# -- 1. CreateBucket on a bucket you own ------------------------------------------------


def test_recreating_an_owned_bucket_in_us_east_1_is_200_and_keeps_it(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="kept", Body=b"still here")
    again = s3.create_bucket(Bucket=bucket)
    assert again["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_object(Bucket=bucket, Key="kept")["Body"].read() == b"still here"


def test_recreating_an_owned_bucket_elsewhere_is_409(tmp_path: Path) -> None:
    with running_gateway(tmp_path / "data", "--region", "eu-west-1") as gw:
        s3 = make_client(gw.endpoint)
        s3.create_bucket(Bucket="owned", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        with pytest.raises(ClientError) as err:
            s3.create_bucket(Bucket="owned", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        assert error_of(err) == ("BucketAlreadyOwnedByYou", 409)


# -- 2, 3. listings ----------------------------------------------------------------------


def test_max_keys_zero_is_an_empty_page_not_truncated(s3, bucket: str) -> None:
    for key in ("a", "b/c", "d"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    v2 = s3.list_objects_v2(Bucket=bucket, MaxKeys=0)
    assert v2["IsTruncated"] is False and v2["KeyCount"] == 0 and "Contents" not in v2
    v1 = s3.list_objects(Bucket=bucket, MaxKeys=0, Delimiter="/")
    assert v1["IsTruncated"] is False and "Contents" not in v1 and "CommonPrefixes" not in v1
    versions = s3.list_object_versions(Bucket=bucket, MaxKeys=0)
    assert versions["IsTruncated"] is False and "Versions" not in versions
    with pytest.raises(ClientError) as err:
        s3.list_objects_v2(Bucket=bucket + "-missing", MaxKeys=0)
    assert error_of(err) == ("NoSuchBucket", 404)


def test_an_empty_continuation_token_is_no_token(s3, bucket: str) -> None:
    for key in ("a", "b", "c"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    page = s3.list_objects_v2(Bucket=bucket, ContinuationToken="", MaxKeys=2)
    assert [o["Key"] for o in page["Contents"]] == ["a", "b"] and page["IsTruncated"] is True
    rest = s3.list_objects_v2(Bucket=bucket, ContinuationToken=page["NextContinuationToken"])
    assert [o["Key"] for o in rest["Contents"]] == ["c"]
    with pytest.raises(ClientError) as err:
        s3.list_objects_v2(Bucket=bucket, ContinuationToken="!!!!")
    assert error_of(err) == ("InvalidArgument", 400)


# -- 4. Content-Encoding ---------------------------------------------------------------------


@pytest.mark.parametrize(("sent", "kept"), [
    ("deflate, gzip", "deflate, gzip"),
    ("gzip", "gzip"),
    ("aws-chunked, gzip", "gzip"),
    ("gzip,aws-chunked", "gzip"),
])
def test_content_encoding_is_kept_as_sent_less_aws_chunked(s3, bucket: str, sent: str, kept: str) -> None:
    s3.put_object(Bucket=bucket, Key="enc", Body=b"bytes", ContentEncoding=sent)
    assert s3.head_object(Bucket=bucket, Key="enc")["ContentEncoding"] == kept
    assert s3.get_object(Bucket=bucket, Key="enc")["ContentEncoding"] == kept


def test_aws_chunked_alone_leaves_no_content_encoding(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="enc", Body=b"bytes", ContentEncoding="aws-chunked")
    assert "ContentEncoding" not in s3.head_object(Bucket=bucket, Key="enc")


# -- 6. x-amz-server-side-encryption -----------------------------------------------------------


def test_every_answer_about_a_stored_object_says_aes256(s3, bucket: str) -> None:
    put = s3.put_object(Bucket=bucket, Key="o", Body=b"data")
    assert put["ServerSideEncryption"] == "AES256"
    assert s3.get_object(Bucket=bucket, Key="o")["ServerSideEncryption"] == "AES256"
    assert s3.head_object(Bucket=bucket, Key="o")["ServerSideEncryption"] == "AES256"
    assert s3.get_object(Bucket=bucket, Key="o", Range="bytes=0-1")["ServerSideEncryption"] == "AES256"
    copy = s3.copy_object(Bucket=bucket, Key="c", CopySource={"Bucket": bucket, "Key": "o"})
    assert copy["ServerSideEncryption"] == "AES256"
    explicit = s3.put_object(Bucket=bucket, Key="e", Body=b"data", ServerSideEncryption="AES256")
    assert explicit["ServerSideEncryption"] == "AES256"
    upload = s3.create_multipart_upload(Bucket=bucket, Key="m")
    assert upload["ServerSideEncryption"] == "AES256"
    part = s3.upload_part(Bucket=bucket, Key="m", UploadId=upload["UploadId"], PartNumber=1, Body=b"p")
    assert part["ServerSideEncryption"] == "AES256"
    done = s3.complete_multipart_upload(Bucket=bucket, Key="m", UploadId=upload["UploadId"],
                                        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert done["ServerSideEncryption"] == "AES256"
    # Asking for AES256 again is a change S3 allows a copy onto itself.
    s3.copy_object(Bucket=bucket, Key="o", CopySource={"Bucket": bucket, "Key": "o"}, ServerSideEncryption="AES256")


def test_encryption_the_gateway_does_not_do_is_refused(s3, bucket: str) -> None:
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="kms", Body=b"x", ServerSideEncryption="aws:kms")
    assert error_of(err) == ("NotImplemented", 501)
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="ssec", Body=b"x", SSECustomerAlgorithm="AES256", SSECustomerKey="k" * 32)
    assert error_of(err) == ("NotImplemented", 501)
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="odd", Body=b"x", ServerSideEncryption="ROT13")
    assert error_of(err) == ("InvalidArgument", 400)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="kms")


# -- 5. conditional writes ---------------------------------------------------------------------


def test_put_if_match_and_if_none_match(s3, bucket: str) -> None:
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="k", Body=b"v0", IfMatch=quoted_md5(b"v0"))
    assert error_of(err) == ("NoSuchKey", 404)
    first = s3.put_object(Bucket=bucket, Key="k", Body=b"v1", IfNoneMatch="*")
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="k", Body=b"v2", IfNoneMatch="*")
    assert error_of(err) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="k", Body=b"v2", IfMatch=quoted_md5(b"other"))
    assert error_of(err) == ("PreconditionFailed", 412)
    second = s3.put_object(Bucket=bucket, Key="k", Body=b"v2", IfMatch=first["ETag"])
    assert second["ETag"] == quoted_md5(b"v2")
    s3.put_object(Bucket=bucket, Key="k", Body=b"v3", IfMatch="*")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v3"


def _multipart(s3, bucket: str, key: str, parts: list[bytes]) -> tuple[str, list[dict]]:
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    done = []
    for number, data in enumerate(parts, 1):
        etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=data)["ETag"]
        done.append({"PartNumber": number, "ETag": etag})
    return upload, done


def test_complete_multipart_upload_if_none_match_and_if_match(s3, bucket: str) -> None:
    first_id, first_parts = _multipart(s3, bucket, "big", [b"a" * (5 * MiB), b"tail"])
    s3.put_object(Bucket=bucket, Key="big", Body=b"already here")
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(Bucket=bucket, Key="big", UploadId=first_id, IfNoneMatch="*",
                                     MultipartUpload={"Parts": first_parts})
    assert error_of(err) == ("PreconditionFailed", 412)
    # The refused Complete left the upload open and the object as it was.
    assert s3.get_object(Bucket=bucket, Key="big")["Body"].read() == b"already here"
    assert [p["PartNumber"] for p in s3.list_parts(Bucket=bucket, Key="big", UploadId=first_id)["Parts"]] == [1, 2]
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(Bucket=bucket, Key="big", UploadId=first_id, IfMatch=quoted_md5(b"no"),
                                     MultipartUpload={"Parts": first_parts})
    assert error_of(err) == ("PreconditionFailed", 412)
    done = s3.complete_multipart_upload(Bucket=bucket, Key="big", UploadId=first_id,
                                        IfMatch=quoted_md5(b"already here"), MultipartUpload={"Parts": first_parts})
    assert s3.head_object(Bucket=bucket, Key="big")["ETag"] == done["ETag"]
    second_id, second_parts = _multipart(s3, bucket, "fresh", [b"b" * 10])
    s3.complete_multipart_upload(Bucket=bucket, Key="fresh", UploadId=second_id, IfNoneMatch="*",
                                 MultipartUpload={"Parts": second_parts})
    assert s3.get_object(Bucket=bucket, Key="fresh")["Body"].read() == b"b" * 10


def test_copy_object_if_none_match_and_if_match(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=b"source")
    s3.put_object(Bucket=bucket, Key="dst", Body=b"old")
    source = {"Bucket": bucket, "Key": "src"}
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource=source, IfNoneMatch="*")
    assert error_of(err) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource=source, IfMatch=quoted_md5(b"not old"))
    assert error_of(err) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket=bucket, Key="none", CopySource=source, IfMatch=quoted_md5(b"old"))
    assert error_of(err) == ("NoSuchKey", 404)
    s3.copy_object(Bucket=bucket, Key="dst", CopySource=source, IfMatch=quoted_md5(b"old"))
    s3.copy_object(Bucket=bucket, Key="new", CopySource=source, IfNoneMatch="*")
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == b"source"
    assert s3.get_object(Bucket=bucket, Key="new")["Body"].read() == b"source"
    # Onto itself: the conditions hold against the object being rewritten.
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket=bucket, Key="src", CopySource=source, MetadataDirective="REPLACE", IfNoneMatch="*")
    assert error_of(err) == ("PreconditionFailed", 412)
    s3.copy_object(Bucket=bucket, Key="src", CopySource=source, MetadataDirective="REPLACE",
                   Metadata={"m": "1"}, IfMatch=quoted_md5(b"source"))
    assert s3.head_object(Bucket=bucket, Key="src")["Metadata"] == {"m": "1"}


def test_delete_if_match(s3, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="d", Body=b"data")
    with pytest.raises(ClientError) as err:
        s3.delete_object(Bucket=bucket, Key="d", IfMatch=quoted_md5(b"other"))
    assert error_of(err) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="d")["Body"].read() == b"data"
    s3.delete_object(Bucket=bucket, Key="d", IfMatch=quoted_md5(b"data"))
    with pytest.raises(ClientError) as err:
        s3.delete_object(Bucket=bucket, Key="d", IfMatch="*")
    assert error_of(err) == ("NoSuchKey", 404)
    s3.delete_object(Bucket=bucket, Key="d")  # unconditional: still idempotent


def test_delete_objects_with_etags(s3, bucket: str) -> None:
    for key in ("a", "b", "c"):
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    answer = s3.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "a", "ETag": quoted_md5(b"a")},
        {"Key": "b", "ETag": quoted_md5(b"not b")},
        {"Key": "c"},
        {"Key": "gone", "ETag": quoted_md5(b"x")},
    ]})
    assert sorted(d["Key"] for d in answer["Deleted"]) == ["a", "c"]
    assert {e["Key"]: e["Code"] for e in answer["Errors"]} == {"b": "PreconditionFailed", "gone": "NoSuchKey"}
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["b"]


def test_if_none_match_takes_only_a_star_on_writes(s3, bucket: str) -> None:
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="k", Body=b"x", IfNoneMatch='"abc"')
    assert error_of(err) == ("NotImplemented", 501)


# -- races ---------------------------------------------------------------------------------


def _outcome(call) -> str:  # type: ignore[no-untyped-def]
    try:
        call()
        return "ok"
    except ClientError as exc:
        return exc.response["Error"]["Code"]


def test_racing_creates_have_exactly_one_winner(gateway, bucket: str) -> None:
    """16 clients create the same key with If-None-Match: * at once, 10
    rounds: one succeeds each round, the others are refused (412 if the key
    was there when they started, 409 if it appeared while they were
    uploading), and the object is the winner's."""
    clients = [make_client(gateway.endpoint) for _ in range(16)]
    for round_ in range(10):
        key = f"once-{round_}"
        barrier = threading.Barrier(len(clients))

        def create(i: int, key: str = key, barrier: threading.Barrier = barrier) -> str:
            barrier.wait()
            return _outcome(lambda: clients[i].put_object(Bucket=bucket, Key=key, Body=f"writer {i}".encode() * 500,
                                                          IfNoneMatch="*"))

        with ThreadPoolExecutor(len(clients)) as pool:
            outcomes = list(pool.map(create, range(len(clients))))
        winners = [i for i, o in enumerate(outcomes) if o == "ok"]
        assert len(winners) == 1, outcomes
        assert set(outcomes) - {"ok"} <= {"PreconditionFailed", "ConditionalRequestConflict"}, outcomes
        body = clients[0].get_object(Bucket=bucket, Key=key)["Body"].read()
        assert body == f"writer {winners[0]}".encode() * 500


def test_compare_and_swap_loses_no_update(gateway, bucket: str) -> None:
    """A counter incremented by 6 clients, 15 times each, each increment a
    read then a PUT with If-Match on what was read, retried when refused:
    it ends at exactly 90, and every refusal was a 412 or 409."""
    writers, rounds = 6, 15
    clients = [make_client(gateway.endpoint) for _ in range(writers)]
    clients[0].put_object(Bucket=bucket, Key="counter", Body=b"0")
    refusals: list[str] = []

    def increment(i: int) -> None:
        s3 = clients[i]
        done = 0
        while done < rounds:
            got = s3.get_object(Bucket=bucket, Key="counter")
            value = int(got["Body"].read().split()[0])
            outcome = _outcome(lambda: s3.put_object(Bucket=bucket, Key="counter", IfMatch=got["ETag"],
                                                     Body=f"{value + 1} by {i}".encode()))
            if outcome == "ok":
                done += 1
            else:
                refusals.append(outcome)

    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(increment, range(writers)))
    final = clients[0].get_object(Bucket=bucket, Key="counter")["Body"].read()
    assert int(final.split()[0]) == writers * rounds, final
    assert set(refusals) <= {"PreconditionFailed", "ConditionalRequestConflict"}, set(refusals)


def test_racing_completes_have_exactly_one_winner(gateway, bucket: str) -> None:
    """Four uploads of one key complete at once with If-None-Match: *: one
    object results, and it is one whole upload (no mix of parts)."""
    clients = [make_client(gateway.endpoint) for _ in range(4)]
    uploads = [_multipart(clients[i], bucket, "shared", [bytes([65 + i]) * (5 * MiB), b"end %d" % i])
               for i in range(4)]
    barrier = threading.Barrier(4)

    def complete(i: int) -> str:
        upload, parts = uploads[i]
        barrier.wait()
        return _outcome(lambda: clients[i].complete_multipart_upload(
            Bucket=bucket, Key="shared", UploadId=upload, IfNoneMatch="*", MultipartUpload={"Parts": parts}))

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(complete, range(4)))
    winners = [i for i, o in enumerate(outcomes) if o == "ok"]
    assert len(winners) == 1, outcomes
    assert set(outcomes) - {"ok"} <= {"PreconditionFailed", "ConditionalRequestConflict"}, outcomes
    body = clients[0].get_object(Bucket=bucket, Key="shared")["Body"].read()
    assert body == bytes([65 + winners[0]]) * (5 * MiB) + b"end %d" % winners[0]
    for i in set(range(4)) - set(winners):  # the losers may still be completed or aborted
        clients[i].abort_multipart_upload(Bucket=bucket, Key="shared", UploadId=uploads[i][0])


def test_racing_conditional_deletes_delete_once(gateway, bucket: str) -> None:
    clients = [make_client(gateway.endpoint) for _ in range(8)]
    for round_ in range(5):
        clients[0].put_object(Bucket=bucket, Key="victim", Body=b"round %d" % round_)
        etag = quoted_md5(b"round %d" % round_)
        barrier = threading.Barrier(len(clients))

        def delete(i: int, etag: str = etag, barrier: threading.Barrier = barrier) -> str:
            barrier.wait()
            return _outcome(lambda: clients[i].delete_object(Bucket=bucket, Key="victim", IfMatch=etag))

        with ThreadPoolExecutor(len(clients)) as pool:
            outcomes = list(pool.map(delete, range(len(clients))))
        assert outcomes.count("ok") == 1 and outcomes.count("NoSuchKey") == len(clients) - 1, outcomes


def test_a_write_landing_during_a_conditional_upload_is_a_conflict(gateway, s3, bucket: str) -> None:
    """Deterministic: the create-only PUT passes its first check (the server
    asks for the body: 100 Continue), another PUT of the key commits, then
    the body arrives. The commit sees the key and answers 409
    ConditionalRequestConflict; the other write stays."""
    body = b"late create" * 1000
    url = f"{gateway.endpoint}/{bucket}/raced"
    headers, _, _ = sign("PUT", url, {"If-None-Match": "*", "Expect": "100-continue",
                                      "Content-Length": str(len(body))}, payload_hash="UNSIGNED-PAYLOAD")
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        headers.setdefault("Host", f"127.0.0.1:{gateway.port}")
        head = f"PUT /{bucket}/raced HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 100"), "the gateway did not ask for the body"
        s3.put_object(Bucket=bucket, Key="raced", Body=b"first")
        sock.sendall(body)
        answer = read_answer(sock)
    assert answer is not None and answer.status == 409, answer
    assert b"<Code>ConditionalRequestConflict</Code>" in answer.body
    assert s3.get_object(Bucket=bucket, Key="raced")["Body"].read() == b"first"


# -- s3fs: exclusive create ------------------------------------------------------------------


def test_s3fs_exclusive_create(fs, bucket: str) -> None:
    fs.pipe(f"{bucket}/small", b"one", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe(f"{bucket}/small", b"two", mode="create")
    assert fs.cat(f"{bucket}/small") == b"one"
    # A large exclusive write is a multipart upload completed with If-None-Match: *.
    big = bytes(range(256)) * (48 * 1024)  # 12 MiB
    with fs.open(f"{bucket}/big", "xb", block_size=5 * MiB) as f:
        f.write(big)
    assert fs.cat(f"{bucket}/big") == big
    with pytest.raises(FileExistsError), fs.open(f"{bucket}/big", "xb", block_size=5 * MiB) as f:
        f.write(b"z" * (12 * MiB))
    assert fs.cat(f"{bucket}/big") == big
