"""Mounted buckets: a data set uploaded straight to a moto S3 server (never
through the gateway) read through a real gateway with boto3 and s3fs;
ranged reads fetch only the pieces they touch; the source's changes are
seen after the freshness window; an outage serves what is cached."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
import s3fs
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from gateway.cli.app import app as cli_app
from tests.conftest import make_client, running_gateway
from tests.servers import ACCESS_KEY, ADMIN_TOKEN, SECRET_KEY, Gateway, free_port

MiB = 1024 * 1024
PIECE = 8 * MiB  # the gateway's default part size: the unit mounts cache in
PROBE = 1 * MiB  # a cold GET's first request asks for this much: a small object whole


def direct(endpoint: str):  # type: ignore[no-untyped-def]
    """A client of the source itself, bypassing the gateway."""
    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="testing",
        aws_secret_access_key="testing", region_name="us-east-1",
    )


def admin(gw: Gateway, method: str, path: str, **kwargs: object) -> httpx.Response:
    return httpx.request(method, gw.admin_url + path, timeout=60,
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, **kwargs)  # type: ignore[arg-type]


def mount(gw: Gateway, name: str, source: str, endpoint: str, **options: object) -> dict:
    body = {"name": name, "source": source, "endpoint": endpoint,
            "access_key": "testing", "secret_key": "testing", **options}
    response = admin(gw, "POST", "/mounts", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def source_stats(gw: Gateway, name: str) -> dict:
    view = admin(gw, "GET", f"/mounts/{name}").json()
    return {**view["source_requests"], "bytes": view["source_bytes_read"]}


@pytest.fixture(scope="module")
def dataset(moto_endpoint: str) -> dict[str, bytes]:
    """s3://datasets/imagenet/...: written directly to the source."""
    src = direct(moto_endpoint)
    src.create_bucket(Bucket="datasets")
    files = {f"train/{i:03d}.jpg": os.urandom(10_000 + i) for i in range(25)}
    files |= {f"val/{i:03d}.jpg": os.urandom(5_000) for i in range(5)}
    files["README"] = b"a data set"
    for key, data in files.items():
        src.put_object(Bucket="datasets", Key=f"imagenet/{key}", Body=data,
                       ContentType="image/jpeg", Metadata={"origin": "direct"})
    src.put_object(Bucket="datasets", Key="elsewhere/not-mounted", Body=b"x")
    return files


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str, dataset: dict[str, bytes]) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("mounts")
    with running_gateway(root / "data") as gateway:
        mount(gateway, "imagenet", "s3://datasets/imagenet", moto_endpoint, freshness="immutable")
        yield gateway


@pytest.fixture(scope="module")
def client(gw: Gateway):  # type: ignore[no-untyped-def]
    return make_client(gw.endpoint)


def test_boto3_reads_the_data_set_as_it_is_at_the_source(client, dataset: dict[str, bytes]) -> None:  # type: ignore[no-untyped-def]
    for key in ("train/000.jpg", "train/024.jpg", "README"):
        got = client.get_object(Bucket="imagenet", Key=key)
        assert got["Body"].read() == dataset[key]
        assert got["ContentType"] == "image/jpeg" and got["Metadata"] == {"origin": "direct"}
        assert got["ETag"] == '"' + hashlib.md5(dataset[key]).hexdigest() + '"'
    head = client.head_object(Bucket="imagenet", Key="val/001.jpg")
    assert head["ContentLength"] == 5_000
    ranged = client.get_object(Bucket="imagenet", Key="train/003.jpg", Range="bytes=10-19")["Body"].read()
    assert ranged == dataset["train/003.jpg"][10:20]
    with pytest.raises(ClientError) as missing:
        client.get_object(Bucket="imagenet", Key="no/such/key")
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"
    assert "imagenet" in [b["Name"] for b in client.list_buckets()["Buckets"]]
    client.create_bucket(Bucket="copies")
    client.copy_object(Bucket="copies", Key="readme", CopySource={"Bucket": "imagenet", "Key": "README"})
    assert client.get_object(Bucket="copies", Key="readme")["Body"].read() == dataset["README"]
    versions = client.list_object_versions(Bucket="imagenet", Prefix="val/")
    assert [v["Key"] for v in versions["Versions"]] == [f"val/{i:03d}.jpg" for i in range(5)]


def test_listings_pass_through_with_prefix_delimiter_and_pages(client, dataset: dict[str, bytes]) -> None:  # type: ignore[no-untyped-def]
    top = client.list_objects_v2(Bucket="imagenet", Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["train/", "val/"]
    assert [o["Key"] for o in top["Contents"]] == ["README"]
    keys, token = [], None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        page = client.list_objects_v2(Bucket="imagenet", Prefix="train/", MaxKeys=7, **kw)
        keys += [o["Key"] for o in page.get("Contents", [])]
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    assert keys == sorted(k for k in dataset if k.startswith("train/"))
    v1 = client.list_objects(Bucket="imagenet", Prefix="val/", MaxKeys=2)
    assert [o["Key"] for o in v1["Contents"]] == ["val/000.jpg", "val/001.jpg"] and v1["IsTruncated"]
    assert client.list_objects_v2(Bucket="imagenet", Prefix="elsewhere/")["KeyCount"] == 0


def test_a_listing_ttl_reuses_pages_until_a_write_or_expiry(gw: Gateway, moto_endpoint: str, client) -> None:  # type: ignore[no-untyped-def]
    src = direct(moto_endpoint)
    src.put_object(Bucket="datasets", Key="listed/a", Body=b"a")
    view = mount(gw, "listed", "s3://datasets/listed", moto_endpoint, read_write=True, listing_ttl=1.5)
    assert view["listing_ttl"] == 1.5
    assert view["check_md5"] is False  # the default: the source's checksum where it sends one, else the length

    def keys(**kw: object) -> list[str]:
        return [o["Key"] for o in client.list_objects_v2(Bucket="listed", **kw).get("Contents", [])]

    lists = source_stats(gw, "listed")["lists"]
    assert keys() == ["a"] and keys() == ["a"] and keys() == ["a"]
    assert source_stats(gw, "listed")["lists"] == lists + 1, "one page asked of the source, reused twice"
    assert keys(Prefix="a") == ["a"] and source_stats(gw, "listed")["lists"] == lists + 2, "another question"

    src.put_object(Bucket="datasets", Key="listed/b", Body=b"b")  # at the source directly: seen after the TTL
    assert keys() == ["a"]
    time.sleep(1.6)
    assert keys() == ["a", "b"]
    client.put_object(Bucket="listed", Key="c", Body=b"c")  # through the gateway: seen at once
    assert keys() == ["a", "b", "c"]
    client.delete_object(Bucket="listed", Key="a")
    assert keys() == ["b", "c"]
    assert admin(gw, "POST", "/mounts", json={"name": "x", "source": "s3://datasets", "listing_ttl": -1}
                 ).status_code == 400


def test_a_cold_small_read_costs_the_source_one_request_and_counts_as_a_miss(
    gw: Gateway, client, moto_endpoint: str  # type: ignore[no-untyped-def]
) -> None:
    direct(moto_endpoint).put_object(Bucket="datasets", Key="imagenet/fresh/one", Body=b"1" * 300_000)
    before, stats_before = source_stats(gw, "imagenet"), admin(gw, "GET", "/stats").json()["served"]
    assert client.get_object(Bucket="imagenet", Key="fresh/one")["Body"].read() == b"1" * 300_000
    cold, stats_cold = source_stats(gw, "imagenet"), admin(gw, "GET", "/stats").json()["served"]
    assert (cold["gets"] - before["gets"], cold["heads"] - before["heads"]) == (1, 0)
    assert stats_cold["capacity"]["bytes"] - stats_before["capacity"]["bytes"] == 300_000
    assert client.get_object(Bucket="imagenet", Key="fresh/one")["Body"].read() == b"1" * 300_000
    warm, stats_warm = source_stats(gw, "imagenet"), admin(gw, "GET", "/stats").json()["served"]
    assert warm["gets"] == cold["gets"], "the second read is served from the hot tier"
    assert stats_warm["hot"]["bytes"] - stats_cold["hot"]["bytes"] == 300_000


def test_concurrent_cold_reads_of_one_object_share_one_request(
    gw: Gateway, client, moto_endpoint: str  # type: ignore[no-untyped-def]
) -> None:
    import threading

    body = b"2" * 200_000
    direct(moto_endpoint).put_object(Bucket="datasets", Key="imagenet/fresh/shared", Body=body)
    before = source_stats(gw, "imagenet")
    got: list[bytes] = []
    barrier = threading.Barrier(8)

    def read() -> None:
        s3 = make_client(gw.endpoint)
        barrier.wait()
        got.append(s3.get_object(Bucket="imagenet", Key="fresh/shared")["Body"].read())

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = source_stats(gw, "imagenet")
    assert got == [body] * 8
    assert (after["gets"] - before["gets"], after["heads"] - before["heads"]) == (1, 0)


def test_s3fs_reads_through_the_mount(gw: Gateway, dataset: dict[str, bytes]) -> None:
    fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=gw.endpoint,
                           client_kwargs={"region_name": "us-east-1"}, use_listings_cache=False)
    assert fs.cat("imagenet/val/002.jpg") == dataset["val/002.jpg"]
    assert sorted(fs.ls("imagenet/val", detail=False)) == [f"imagenet/val/{i:03d}.jpg" for i in range(5)]
    with fs.open("imagenet/train/010.jpg", "rb") as f:
        f.seek(100)
        assert f.read(50) == dataset["train/010.jpg"][100:150]


def test_writes_to_a_read_only_mount_are_refused(client) -> None:  # type: ignore[no-untyped-def]
    for call in (
        lambda: client.put_object(Bucket="imagenet", Key="new", Body=b"x"),
        lambda: client.delete_object(Bucket="imagenet", Key="README"),
        lambda: client.create_multipart_upload(Bucket="imagenet", Key="big"),
        lambda: client.delete_bucket(Bucket="imagenet"),
        lambda: client.copy_object(Bucket="imagenet", Key="copy", CopySource={"Bucket": "imagenet", "Key": "README"}),
    ):
        with pytest.raises(ClientError) as refused:
            call()
        assert refused.value.response["Error"]["Code"] == "AccessDenied"
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert client.get_object(Bucket="imagenet", Key="README")["Body"].read() == b"a data set"


def test_range_reads_of_a_large_object_fetch_only_the_pieces_they_touch(
    gw: Gateway, client, moto_endpoint: str  # type: ignore[no-untyped-def]
) -> None:
    big = os.urandom(100 * MiB)
    direct(moto_endpoint).put_object(Bucket="datasets", Key="imagenet/big.bin", Body=big)
    before = source_stats(gw, "imagenet")

    def ranged(start: int, end: int) -> bytes:
        return client.get_object(Bucket="imagenet", Key="big.bin", Range=f"bytes={start}-{end - 1}")["Body"].read()

    assert ranged(50 * MiB, 51 * MiB) == big[50 * MiB : 51 * MiB]  # inside piece 6 (48-56 MiB)
    first = source_stats(gw, "imagenet")
    # The first read describes the object with a 1 MiB probe, then fetches piece 6.
    assert first["gets"] - before["gets"] == 2 and first["heads"] == before["heads"]
    assert first["bytes"] - before["bytes"] == PROBE + PIECE
    assert ranged(55 * MiB, 57 * MiB) == big[55 * MiB : 57 * MiB]  # pieces 6 (cached) and 7
    second = source_stats(gw, "imagenet")
    assert second["gets"] - first["gets"] == 1 and second["bytes"] - first["bytes"] == PIECE
    assert ranged(49 * MiB, 63 * MiB) == big[49 * MiB : 63 * MiB]  # both cached now
    assert source_stats(gw, "imagenet")["gets"] == second["gets"]
    tail = ranged(100 * MiB - 10, 100 * MiB)
    assert tail == big[-10:]
    assert source_stats(gw, "imagenet")["bytes"] - second["bytes"] == 100 * MiB - 12 * PIECE
    whole = client.get_object(Bucket="imagenet", Key="big.bin")["Body"].read()
    assert hashlib.sha256(whole).digest() == hashlib.sha256(big).digest()
    # Each byte once: the describing GET's first MiB began piece 0, read last.
    assert source_stats(gw, "imagenet")["bytes"] - before["bytes"] == 100 * MiB, "each byte once"


def test_changes_at_the_source_are_seen_after_the_freshness_window(
    gw: Gateway, moto_endpoint: str  # type: ignore[no-untyped-def]
) -> None:
    src = direct(moto_endpoint)
    src.put_object(Bucket="datasets", Key="live/k", Body=b"version one")
    src.put_object(Bucket="datasets", Key="live/gone", Body=b"soon deleted")
    mount(gw, "live", "s3://datasets/live", moto_endpoint, freshness=1)
    mount(gw, "frozen", "s3://datasets/live", moto_endpoint, freshness="immutable")
    client = make_client(gw.endpoint)
    for bucket in ("live", "frozen"):
        assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"version one"
        assert client.get_object(Bucket=bucket, Key="gone")["Body"].read() == b"soon deleted"

    src.put_object(Bucket="datasets", Key="live/k", Body=b"version two, longer")
    src.delete_object(Bucket="datasets", Key="live/gone")
    assert client.get_object(Bucket="live", Key="k")["Body"].read() == b"version one", "still fresh"
    time.sleep(1.2)
    # Past the window a cached object is answered at once, stale, while it is
    # revalidated behind the answer (stale-while-revalidate): the first read
    # may still see version one, and once revalidated it never does again.
    assert client.get_object(Bucket="live", Key="k")["Body"].read() in (b"version one", b"version two, longer")
    deadline = time.monotonic() + 10
    while (body := client.get_object(Bucket="live", Key="k")["Body"].read()) != b"version two, longer":
        assert body == b"version one" and time.monotonic() < deadline, body
        time.sleep(0.05)
    got = client.get_object(Bucket="live", Key="k")
    assert got["Body"].read() == b"version two, longer"
    assert got["ETag"] == '"' + hashlib.md5(b"version two, longer").hexdigest() + '"'
    client.head_object(Bucket="live", Key="gone")  # revalidated by the listing of the same round, or now
    deadline = time.monotonic() + 10
    while True:
        try:
            client.head_object(Bucket="live", Key="gone")
        except ClientError as deleted:
            assert deleted.response["ResponseMetadata"]["HTTPStatusCode"] == 404
            break
        assert time.monotonic() < deadline, "a deleted object must stop being served"
        time.sleep(0.05)
    assert client.get_object(Bucket="frozen", Key="k")["Body"].read() == b"version one", "immutable"


def test_objects_past_their_freshness_are_served_at_once_and_revalidated_by_listing_pages(
    gw: Gateway, moto_endpoint: str  # type: ignore[no-untyped-def]
) -> None:
    src = direct(moto_endpoint)
    keys = [f"batch/{i:04d}" for i in range(1200)]
    for key in keys:
        src.put_object(Bucket="datasets", Key=key, Body=key.encode())
    # A window that the second pass below fits in even on a loaded machine:
    # keys it renewed must not go stale again before it ends.
    mount(gw, "batched", "s3://datasets/batch", moto_endpoint, freshness=4)
    client = make_client(gw.endpoint)
    names = [key.removeprefix("batch/") for key in keys]
    for name in names:  # cold: one GET each
        assert client.get_object(Bucket="batched", Key=name)["Body"].read() == f"batch/{name}".encode()
    src.put_object(Bucket="datasets", Key="batch/0007", Body=b"changed")
    time.sleep(4.2)
    before = source_stats(gw, "batched")
    for name in names:  # past the window: every read a hit, none waits for the source
        assert client.get_object(Bucket="batched", Key=name)["Body"].read() in (f"batch/{name}".encode(), b"changed")
    deadline = time.monotonic() + 20
    while client.get_object(Bucket="batched", Key="0007")["Body"].read() != b"changed":
        assert time.monotonic() < deadline, "the changed object must be seen once revalidated"
        time.sleep(0.05)
    after = source_stats(gw, "batched")
    # 1,200 revalidations in listing pages of 1,000 (each page renews every
    # key it shows; a few more pages for reads queued while one ran), not
    # 1,200 HEADs; the changed object is fetched again, once.
    assert after["heads"] == before["heads"]
    assert after["gets"] - before["gets"] == 1
    assert 2 <= after["lists"] - before["lists"] <= 10, after["lists"] - before["lists"]


def test_mount_errors_and_unmount(gw: Gateway, moto_endpoint: str, client) -> None:  # type: ignore[no-untyped-def]
    def error(response: httpx.Response) -> tuple[int, str]:
        return response.status_code, response.json()["error"]["code"]

    body = {"name": "m-err", "source": "s3://no-such-bucket", "endpoint": moto_endpoint,
            "access_key": "testing", "secret_key": "testing"}
    assert error(admin(gw, "POST", "/mounts", json=body)) == (502, "SourceUnavailable")
    assert error(admin(gw, "POST", "/mounts", json=body | {"source": "http://x"})) == (400, "InvalidRequest")
    assert error(admin(gw, "POST", "/mounts", json=body | {"name": "Bad_Name", "source": "s3://datasets"})) == (
        400, "InvalidBucketName")
    assert error(admin(gw, "POST", "/mounts", json=body | {"source": "s3://datasets", "secret_key": None})) == (
        400, "InvalidRequest")
    assert error(admin(gw, "POST", "/mounts", json=body | {"name": "imagenet", "source": "s3://datasets"})) == (
        409, "BucketAlreadyExists")
    client.create_bucket(Bucket="managed-one")
    assert error(admin(gw, "POST", "/mounts", json=body | {"name": "managed-one", "source": "s3://datasets"})) == (
        409, "BucketAlreadyExists")
    # A mount is a bucket of this gateway's owner: creating it again is 200
    # in us-east-1, as for any bucket one owns, and it stays the mount.
    assert client.create_bucket(Bucket="imagenet")["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert client.head_object(Bucket="imagenet", Key="README")["ContentLength"] == len(b"a data set")

    assert error(admin(gw, "DELETE", "/buckets/imagenet")) == (400, "InvalidRequest")
    assert error(admin(gw, "POST", "/jobs/pin", json={"bucket": "imagenet"})) == (400, "InvalidRequest")
    mount(gw, "short-lived", "s3://datasets/imagenet/val", moto_endpoint)
    assert client.get_object(Bucket="short-lived", Key="000.jpg")["ContentLength"] == 5_000
    listed = admin(gw, "GET", "/mounts").json()["mounts"]
    shown = next(m for m in listed if m["name"] == "short-lived")
    assert shown["secret_key"] == "***" and shown["freshness"] == 60.0 and shown["serve_stale"] is True
    assert "testing" not in admin(gw, "GET", "/mounts/short-lived").text.replace('"access_key":"testing"', "")
    assert admin(gw, "DELETE", "/mounts/short-lived").status_code == 204
    assert error(admin(gw, "GET", "/mounts/short-lived")) == (404, "NoSuchMount")
    assert error(admin(gw, "DELETE", "/mounts/short-lived")) == (404, "NoSuchMount")
    with pytest.raises(ClientError) as gone:
        client.head_bucket(Bucket="short-lived")
    assert gone.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert len(direct(moto_endpoint).list_objects_v2(Bucket="datasets", Prefix="imagenet/val/")["Contents"]) == 5


def test_a_read_write_mount_writes_through_natively(gw: Gateway, moto_endpoint: str, client) -> None:  # type: ignore[no-untyped-def]
    src = direct(moto_endpoint)
    src.put_object(Bucket="datasets", Key="ckpt/existing", Body=b"old")
    mount(gw, "ckpt", "s3://datasets/ckpt", moto_endpoint, read_write=True)

    put = client.put_object(Bucket="ckpt", Key="step-100/model.pt", Body=b"weights" * 1000,
                            ContentType="application/x-pytorch", Metadata={"step": "100"})
    seen = src.get_object(Bucket="datasets", Key="ckpt/step-100/model.pt")  # a direct client sees it
    assert seen["Body"].read() == b"weights" * 1000
    assert seen["ContentType"] == "application/x-pytorch" and seen["Metadata"] == {"step": "100"}
    assert put["ETag"] == seen["ETag"]

    large = os.urandom(20 * MiB)  # more than a part: a streamed multipart upload at the source
    client.put_object(Bucket="ckpt", Key="large.bin", Body=large)
    assert src.get_object(Bucket="datasets", Key="ckpt/large.bin")["Body"].read() == large
    assert client.get_object(Bucket="ckpt", Key="large.bin", Range="bytes=9000000-9000009")["Body"].read() == (
        large[9_000_000:9_000_010])

    client.put_object(Bucket="ckpt", Key="existing", Body=b"new")  # overwrite: the gateway sees it at once
    assert client.get_object(Bucket="ckpt", Key="existing")["Body"].read() == b"new"
    client.copy_object(Bucket="ckpt", Key="copy.pt", CopySource={"Bucket": "ckpt", "Key": "step-100/model.pt"})
    assert src.get_object(Bucket="datasets", Key="ckpt/copy.pt")["Body"].read() == b"weights" * 1000

    client.delete_object(Bucket="ckpt", Key="existing")
    client.delete_objects(Bucket="ckpt", Delete={"Objects": [{"Key": "copy.pt"}, {"Key": "never-was"}]})
    left = [o["Key"] for o in src.list_objects_v2(Bucket="datasets", Prefix="ckpt/")["Contents"]]
    assert left == ["ckpt/large.bin", "ckpt/step-100/model.pt"]
    with pytest.raises(ClientError) as gone:
        client.get_object(Bucket="ckpt", Key="existing")
    assert gone.value.response["Error"]["Code"] == "NoSuchKey"

    with pytest.raises(ClientError) as bad_digest:
        client.put_object(Bucket="ckpt", Key="corrupt", Body=b"abc", ContentMD5="1B2M2Y8AsgTpgAmY7PhCfg==")
    assert bad_digest.value.response["Error"]["Code"] == "BadDigest"
    assert src.list_objects_v2(Bucket="datasets", Prefix="ckpt/corrupt")["KeyCount"] == 0, "nothing written"
    with pytest.raises(ClientError) as denied:
        client.delete_bucket(Bucket="ckpt")
    assert denied.value.response["Error"]["Code"] == "AccessDenied"
    with pytest.raises(ClientError) as conditional:
        client.put_object(Bucket="ckpt", Key="x", Body=b"x", IfNoneMatch="*")
    assert conditional.value.response["Error"]["Code"] == "NotImplemented"


def error_code(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ClientError) as failed:
        call()
    return failed.value.response["Error"]["Code"]


def test_a_mount_refuses_tags_and_conditional_writes_plainly(gw: Gateway, moto_endpoint: str, client) -> None:  # type: ignore[no-untyped-def]
    """Tags and write conditions are not passed to the source: every request
    that would need them is 501 NotImplemented with a message naming the
    mount, and nothing is written."""
    mount(gw, "plain", "s3://datasets/plain", moto_endpoint, read_write=True)
    client.put_object(Bucket="plain", Key="obj", Body=b"x")
    etag = client.head_object(Bucket="plain", Key="obj")["ETag"]
    tags = {"TagSet": [{"Key": "a", "Value": "1"}]}
    refused = {
        "GetObjectTagging": lambda: client.get_object_tagging(Bucket="plain", Key="obj"),
        "PutObjectTagging": lambda: client.put_object_tagging(Bucket="plain", Key="obj", Tagging=tags),
        "DeleteObjectTagging": lambda: client.delete_object_tagging(Bucket="plain", Key="obj"),
        "PutObject with tags": lambda: client.put_object(Bucket="plain", Key="t", Body=b"x", Tagging="a=1"),
        "CreateMultipartUpload with tags": lambda: client.create_multipart_upload(Bucket="plain", Key="t",
                                                                                  Tagging="a=1"),
        "DeleteObject If-Match": lambda: client.delete_object(Bucket="plain", Key="obj", IfMatch=etag),
    }
    for what, call in refused.items():
        assert error_code(call) == "NotImplemented", what
    upload = client.create_multipart_upload(Bucket="plain", Key="m")["UploadId"]
    part = client.upload_part(Bucket="plain", Key="m", UploadId=upload, PartNumber=1, Body=b"p")["ETag"]
    assert error_code(lambda: client.complete_multipart_upload(
        Bucket="plain", Key="m", UploadId=upload, IfNoneMatch="*",
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part}]})) == "NotImplemented"
    client.abort_multipart_upload(Bucket="plain", Key="m", UploadId=upload)
    src = direct(moto_endpoint)
    assert [o["Key"] for o in src.list_objects_v2(Bucket="datasets", Prefix="plain/")["Contents"]] == ["plain/obj"]
    assert client.get_object(Bucket="plain", Key="obj")["Body"].read() == b"x"


def test_a_mount_refuses_versioning_plainly(gw: Gateway, moto_endpoint: str, client) -> None:  # type: ignore[no-untyped-def]
    """A mount's objects are the source's own, one per key: PutBucketVersioning
    is 501 naming why, the status stays unset, and every object is its one
    null version (a version id of another is NoSuchVersion)."""
    mount(gw, "unversioned", "s3://datasets/unversioned", moto_endpoint, read_write=True)
    client.put_object(Bucket="unversioned", Key="obj", Body=b"x")
    with pytest.raises(ClientError) as failed:
        client.put_bucket_versioning(Bucket="unversioned", VersioningConfiguration={"Status": "Enabled"})
    assert failed.value.response["Error"]["Code"] == "NotImplemented"
    assert "mount" in failed.value.response["Error"]["Message"]
    assert "Status" not in client.get_bucket_versioning(Bucket="unversioned")
    assert client.get_object(Bucket="unversioned", Key="obj", VersionId="null")["Body"].read() == b"x"
    assert error_code(lambda: client.get_object(Bucket="unversioned", Key="obj",
                                                VersionId="00000000000000ff")) == "NoSuchVersion"
    listed = client.list_object_versions(Bucket="unversioned")
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in listed["Versions"]] == [("obj", "null", True)]
    client.delete_object(Bucket="unversioned", Key="obj", VersionId="null")
    assert "Contents" not in client.list_objects_v2(Bucket="unversioned")


def test_multipart_uploads_on_a_read_write_mount_pass_through(gw: Gateway, moto_endpoint: str, client) -> None:  # type: ignore[no-untyped-def]
    src = direct(moto_endpoint)
    mount(gw, "shards", "s3://datasets/shards", moto_endpoint, read_write=True)

    # boto3's managed transfer: parts of 5 MiB, the source's upload and ETag.
    data = os.urandom(12 * MiB)
    small_parts = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    client.upload_fileobj(io.BytesIO(data), "shards", "shard-000.tar", Config=small_parts,
                          ExtraArgs={"ContentType": "application/x-tar", "Metadata": {"epoch": "1"}})
    seen = src.get_object(Bucket="datasets", Key="shards/shard-000.tar")
    assert seen["Body"].read() == data and seen["ETag"].endswith('-3"')
    assert seen["ContentType"] == "application/x-tar" and seen["Metadata"] == {"epoch": "1"}
    assert client.head_object(Bucket="shards", Key="shard-000.tar")["ETag"] == seen["ETag"]
    assert client.get_object(Bucket="shards", Key="shard-000.tar")["Body"].read() == data

    # The low-level calls: the upload is the source's, seen by both clients.
    upload_id = client.create_multipart_upload(Bucket="shards", Key="manual.bin")["UploadId"]
    direct_ids = [u["UploadId"] for u in src.list_multipart_uploads(Bucket="datasets").get("Uploads", [])]
    assert upload_id in direct_ids
    listed = client.list_multipart_uploads(Bucket="shards")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in listed] == [("manual.bin", upload_id)]
    first = os.urandom(5 * MiB)
    e1 = client.upload_part(Bucket="shards", Key="manual.bin", UploadId=upload_id, PartNumber=1, Body=first)["ETag"]
    e2 = client.upload_part_copy(Bucket="shards", Key="manual.bin", UploadId=upload_id, PartNumber=2,
                                 CopySource={"Bucket": "imagenet", "Key": "README"})["CopyPartResult"]["ETag"]
    parts = client.list_parts(Bucket="shards", Key="manual.bin", UploadId=upload_id)["Parts"]
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in parts] == [(1, 5 * MiB, e1), (2, 10, e2)]
    assert error_code(lambda: client.upload_part(
        Bucket="shards", Key="manual.bin", UploadId=upload_id, PartNumber=3, Body=b"abc",
        ContentMD5="1B2M2Y8AsgTpgAmY7PhCfg==")) == "BadDigest"
    assert len(src.list_parts(Bucket="datasets", Key="shards/manual.bin", UploadId=upload_id)["Parts"]) == 2

    def complete(chosen: list[tuple[int, str]]) -> dict:
        return client.complete_multipart_upload(
            Bucket="shards", Key="manual.bin", UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in chosen]})

    assert error_code(lambda: complete([(2, e2), (1, e1)])) == "InvalidPartOrder"
    assert error_code(lambda: complete([(1, e1), (2, '"0123456789abcdef0123456789abcdef"')])) == "InvalidPart"
    done = complete([(1, e1), (2, e2)])
    whole = src.get_object(Bucket="datasets", Key="shards/manual.bin")
    assert whole["Body"].read() == first + b"a data set" and done["ETag"] == whole["ETag"]
    assert client.get_object(Bucket="shards", Key="manual.bin", Range="bytes=-10")["Body"].read() == b"a data set"

    # A checksum the client asks for is verified here and kept by the source.
    upload_id = client.create_multipart_upload(Bucket="shards", Key="summed", ChecksumAlgorithm="SHA256")["UploadId"]
    small = client.upload_part(Bucket="shards", Key="summed", UploadId=upload_id, PartNumber=1, Body=b"x" * 100,
                               ChecksumAlgorithm="SHA256")
    last = client.upload_part(Bucket="shards", Key="summed", UploadId=upload_id, PartNumber=2, Body=b"y",
                              ChecksumAlgorithm="SHA256")
    assert small["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(b"x" * 100).digest()).decode()
    chosen = [{"PartNumber": 1, "ETag": small["ETag"], "ChecksumSHA256": small["ChecksumSHA256"]},
              {"PartNumber": 2, "ETag": last["ETag"], "ChecksumSHA256": last["ChecksumSHA256"]}]
    assert error_code(lambda: client.complete_multipart_upload(  # a first part under 5 MiB
        Bucket="shards", Key="summed", UploadId=upload_id, MultipartUpload={"Parts": chosen})) == "EntityTooSmall"
    client.abort_multipart_upload(Bucket="shards", Key="summed", UploadId=upload_id)

    # Abort: the source forgets the upload; later calls are NoSuchUpload.
    aborted = client.create_multipart_upload(Bucket="shards", Key="dropped")["UploadId"]
    client.abort_multipart_upload(Bucket="shards", Key="dropped", UploadId=aborted)
    assert not src.list_multipart_uploads(Bucket="datasets", Prefix="shards/").get("Uploads")
    # (S3 says NoSuchUpload to UploadPart and Complete too; moto answers 500.)
    assert error_code(lambda: client.list_parts(Bucket="shards", Key="dropped", UploadId=aborted)) == "NoSuchUpload"

    # s3fs writes in blocks: a multipart upload when the file outgrows one.
    fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=gw.endpoint,
                           client_kwargs={"region_name": "us-east-1"}, use_listings_cache=False)
    payload = os.urandom(11 * MiB)
    with fs.open("shards/from-s3fs.bin", "wb", block_size=5 * MiB) as f:
        f.write(payload)
    assert src.get_object(Bucket="datasets", Key="shards/from-s3fs.bin")["Body"].read() == payload


def test_the_cli_mounts_lists_and_unmounts(gw: Gateway, moto_endpoint: str, dataset: dict[str, bytes]) -> None:
    env = {"TIERSTORE_ADMIN_URL": gw.admin_url, "TIERSTORE_ADMIN_TOKEN": ADMIN_TOKEN,
           "TIERSTORE_MOUNT_SECRET_KEY": "testing"}

    def tierstore(*args: str) -> str:
        result = CliRunner().invoke(cli_app, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.stdout + result.stderr
        return result.stdout

    shown = json.loads(tierstore("mount", "cli-val", "s3://datasets/imagenet/val", "--endpoint", moto_endpoint,
                                 "--access-key", "testing", "--freshness", "immutable", "--listing-ttl", "30",
                                 "--check-md5", "--json"))
    assert (shown["source"], shown["freshness"], shown["read_write"], shown["listing_ttl"], shown["check_md5"]) == (
        "s3://datasets/imagenet/val", "immutable", False, 30, True)
    assert make_client(gw.endpoint).get_object(Bucket="cli-val", Key="003.jpg")["Body"].read() == dataset["val/003.jpg"]
    table = tierstore("mounts")
    assert "cli-val" in table and "read-only" in table and "30 s" in table
    assert tierstore("unmount", "cli-val") == "unmounted cli-val\n"
    assert "cli-val" not in [m["name"] for m in json.loads(tierstore("mounts", "--json"))["mounts"]]


def test_mounts_survive_a_restart(gw: Gateway, dataset: dict[str, bytes]) -> None:
    gw.restart()
    assert make_client(gw.endpoint).get_object(Bucket="imagenet", Key="val/004.jpg")["Body"].read() == (
        dataset["val/004.jpg"])


def test_an_outage_serves_what_is_cached_and_503s_the_rest(tmp_path: Path) -> None:
    from moto.server import ThreadedMotoServer

    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    endpoint = f"http://127.0.0.1:{port}"
    running = True
    try:
        src = direct(endpoint)
        src.create_bucket(Bucket="src")
        for key in ("cached", "uncached", "strict"):
            src.put_object(Bucket="src", Key=key, Body=key.encode() * 1000)
        with running_gateway(tmp_path / "data") as gateway:
            mount(gateway, "tolerant", "s3://src", endpoint, freshness=0.5)
            mount(gateway, "strict", "s3://src", endpoint, freshness=0.5, serve_stale=False)
            client = make_client(gateway.endpoint)
            assert client.get_object(Bucket="tolerant", Key="cached")["Body"].read() == b"cached" * 1000
            assert client.get_object(Bucket="strict", Key="strict")["Body"].read() == b"strict" * 1000
            moto.stop()
            running = False
            time.sleep(0.6)  # past the freshness window: every read asks the source
            assert client.get_object(Bucket="tolerant", Key="cached")["Body"].read() == b"cached" * 1000
            for bucket, key in (("tolerant", "uncached"), ("strict", "strict")):
                with pytest.raises(ClientError) as down:
                    client.get_object(Bucket=bucket, Key=key)
                assert down.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
                assert "unreachable" in down.value.response["Error"]["Message"]
            with pytest.raises(ClientError) as listing:
                client.list_objects_v2(Bucket="tolerant")
            assert listing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
            assert admin(gateway, "GET", "/health").status_code == 200
    finally:
        if running:
            moto.stop()


def test_a_mount_over_rclone_serve_s3(gw: Gateway, rclone_endpoint: str) -> None:
    """Another S3 server as a mount's source, with its own answers: ranged
    GETs answered 200 with just the range and the whole object's checksum,
    NoSuchUpload to an upload listing with nothing to list (an empty list
    here, as S3 answers)."""
    src = direct(rclone_endpoint)
    src.create_bucket(Bucket="rclone-src")
    bodies = {f"set/{i:02d}": os.urandom(1000 + i) for i in range(5)} | {"set/large": os.urandom(PIECE + 12_345)}
    for key, body in bodies.items():
        src.put_object(Bucket="rclone-src", Key=key, Body=body)
    mount(gw, "via-rclone", "s3://rclone-src/set", rclone_endpoint, read_write=True)
    client = make_client(gw.endpoint)
    for key, body in bodies.items():
        name = key.removeprefix("set/")
        assert client.get_object(Bucket="via-rclone", Key=name)["Body"].read() == body, name
        assert client.get_object(Bucket="via-rclone", Key=name)["Body"].read() == body, f"{name} (hot)"
    ranged = client.get_object(Bucket="via-rclone", Key="large", Range=f"bytes={PIECE - 10}-{PIECE + 9}")
    assert ranged["Body"].read() == bodies["set/large"][PIECE - 10:PIECE + 10]
    listed = client.list_objects_v2(Bucket="via-rclone")
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted(k.removeprefix("set/") for k in bodies)
    assert client.list_multipart_uploads(Bucket="via-rclone").get("Uploads", []) == []
