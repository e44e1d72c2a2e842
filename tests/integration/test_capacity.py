"""The capacity tier end to end: real clients, a real gateway, and as the
capacity store a local directory, a real moto S3 server or rclone serve s3.

Each round trip is read three ways: while staged, after a flush (served from
the hot tier's clean cache) and cold (cache evicted, so every extent comes
back from the capacity store, verified and decompressed)."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.conftest import make_client, running_gateway
from tests.servers import Gateway, free_ports

MiB = 1024 * 1024
CAPACITY_KEYS = ["--capacity-access-key", "testing", "--capacity-secret-key", "testing"]


def capacity_args(kind: str, endpoint: str, root: Path, name: str) -> list[str]:
    if kind == "local":
        return ["--capacity", (root / "capacity").as_uri()]
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="testing",
        aws_secret_access_key="testing", region_name="us-east-1",
    ).create_bucket(Bucket=name)
    return ["--capacity", f"s3://{name}/tier", "--capacity-endpoint", endpoint, *CAPACITY_KEYS]


@pytest.fixture(scope="module", params=["local", "s3", "rclone"])
def tiered(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Gateway]:
    """A gateway in front of each kind of capacity store: a directory, and
    S3 on moto and on rclone serve s3 (another server, its own answers).
    The flush delay is long so tests decide when data moves (POST /flush)."""
    root = tmp_path_factory.mktemp(f"tiered-{request.param}")
    endpoint = "" if request.param == "local" else request.getfixturevalue(
        "moto_endpoint" if request.param == "s3" else "rclone_endpoint")
    args = capacity_args(request.param, endpoint, root, f"cap-{request.param}-{os.getpid()}")
    with running_gateway(root / "data", *args, "--flush-delay", "3600") as gw:
        yield gw


@pytest.fixture(scope="module")
def client(tiered: Gateway):
    return make_client(tiered.endpoint)


@pytest.fixture
def tbucket(client, request: pytest.FixtureRequest) -> str:
    name = "cap-" + hashlib.md5(request.node.nodeid.encode()).hexdigest()[:16]
    client.create_bucket(Bucket=name)
    return name


def pattern(size: int, seed: int = 0) -> bytes:
    """Half random, half repetitive: some extents compress, some do not."""
    block = random.Random(seed).randbytes(64 * 1024) + bytes([seed % 256]) * (64 * 1024)
    return (block * (size // len(block) + 1))[:size]


def get(client, bucket: str, key: str, **kw) -> bytes:
    return client.get_object(Bucket=bucket, Key=key, **kw)["Body"].read()


SIZES = [0, 1, 4 * MiB - 1, 4 * MiB, 4 * MiB + 1, 100 * MiB]


def test_round_trips_staged_cached_and_cold(tiered: Gateway, client, tbucket: str) -> None:
    objects = {f"size-{size}": pattern(size, size) for size in SIZES}
    for key, data in objects.items():
        client.put_object(Bucket=tbucket, Key=key, Body=data, Metadata={"origin": key})
    for key, data in objects.items():
        assert get(client, tbucket, key) == data, f"{key} (staged)"
    status = tiered.flush()
    assert status["flush_queue"] == 0 and status["hot_staged"] == 0
    for key, data in objects.items():
        assert get(client, tbucket, key) == data, f"{key} (cached)"
    tiered.evict()
    before = tiered.admin("GET", "/tiers").json()
    for key, data in objects.items():
        response = client.get_object(Bucket=tbucket, Key=key)
        assert response["Body"].read() == data, f"{key} (cold)"
        assert response["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
        assert response["Metadata"] == {"origin": key}
    after = tiered.admin("GET", "/tiers").json()
    # 1 B and the 4 MiB ones are one extent each, 100 MiB is 13 parts of
    # 8 MiB, and 0 B has no bytes to fetch.
    assert after["cache_misses"] - before["cache_misses"] == 4 + 13


def test_small_objects_share_segments(tiered: Gateway, client, tbucket: str) -> None:
    before = tiered.admin("GET", "/tiers").json()
    for i in range(300):
        client.put_object(Bucket=tbucket, Key=f"small/{i:04d}", Body=pattern(10_000 + i, i))
    after = tiered.flush()
    assert after["segments_written"] - before["segments_written"] == 1
    puts = after["capacity_requests"]["puts"] - before["capacity_requests"]["puts"]
    assert puts == 1, "300 small objects cost one capacity PUT"
    tiered.evict()
    for i in range(0, 300, 37):
        assert get(client, tbucket, f"small/{i:04d}") == pattern(10_000 + i, i)


def test_cold_range_reads_fetch_only_the_extents_they_touch(tiered: Gateway, client, tbucket: str) -> None:
    data = pattern(40 * MiB + 3, 7)
    client.put_object(Bucket=tbucket, Key="ranged", Body=data)
    tiered.flush()
    tiered.evict()
    before = tiered.admin("GET", "/tiers").json()
    boundary = 8 * MiB  # the part size
    for start, end in [(boundary - 10, boundary + 10), (3 * boundary - 1, 3 * boundary), (0, 0)]:
        got = get(client, tbucket, "ranged", Range=f"bytes={start}-{end}")
        assert got == data[start : end + 1]
    after = tiered.admin("GET", "/tiers").json()
    # Extents 0, 1, 2 and 3 were touched; the other parts never left the store.
    assert after["cache_misses"] - before["cache_misses"] == 4
    assert after["capacity_requests"]["gets"] - before["capacity_requests"]["gets"] == 4
    assert get(client, tbucket, "ranged", Range=f"bytes={40 * MiB}-") == data[40 * MiB :]
    assert get(client, tbucket, "ranged") == data


def test_multipart_parts_flushed_before_complete(tiered: Gateway, client, tbucket: str) -> None:
    parts = [pattern(6 * MiB, 1), pattern(5 * MiB, 2), b"tail"]
    upload = client.create_multipart_upload(Bucket=tbucket, Key="mp")["UploadId"]
    etags = []
    for number, part in enumerate(parts, 1):
        etags.append(client.upload_part(Bucket=tbucket, Key="mp", UploadId=upload, PartNumber=number,
                                        Body=part)["ETag"])
        tiered.flush()  # the open upload's parts move to the capacity tier
    client.complete_multipart_upload(
        Bucket=tbucket, Key="mp", UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )
    tiered.flush()
    tiered.evict()
    assert get(client, tbucket, "mp") == b"".join(parts)
    assert get(client, tbucket, "mp", PartNumber=2) == parts[1]


def test_overwrite_and_delete_then_compaction(tiered: Gateway, client, tbucket: str) -> None:
    for i in range(40):
        client.put_object(Bucket=tbucket, Key=f"k{i}", Body=pattern(50_000, i))
    tiered.flush()
    for i in range(30):
        if i % 2:
            client.delete_object(Bucket=tbucket, Key=f"k{i}")
        else:
            client.put_object(Bucket=tbucket, Key=f"k{i}", Body=b"new %d" % i)
    tiered.flush()
    report = tiered.compact(0.9)
    assert report["rewritten"] + report["deleted"] >= 1
    tiered.evict()
    for i in range(40):
        if i < 30 and i % 2:
            with pytest.raises(client.exceptions.NoSuchKey):
                client.get_object(Bucket=tbucket, Key=f"k{i}")
        else:
            want = b"new %d" % i if i < 30 else pattern(50_000, i)
            assert get(client, tbucket, f"k{i}") == want


def test_s3fs_reads_cold_objects(tiered: Gateway, client, tbucket: str) -> None:
    import s3fs

    from tests.servers import ACCESS_KEY, SECRET_KEY

    data = pattern(20 * MiB + 5, 3)
    client.put_object(Bucket=tbucket, Key="dir/blob", Body=data)
    tiered.flush()
    tiered.evict()
    fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=tiered.endpoint,
                           use_listings_cache=False, skip_instance_cache=True)
    with fs.open(f"{tbucket}/dir/blob", "rb", block_size=MiB) as f:
        f.seek(8 * MiB - 100)
        assert f.read(200) == data[8 * MiB - 100 : 8 * MiB + 100]
    assert fs.cat(f"{tbucket}/dir/blob") == data


def test_write_through_bucket_acks_after_the_capacity_store(tiered: Gateway, client, tbucket: str) -> None:
    policy = tiered.admin("PATCH", f"/buckets/{tbucket}", json={"write_through": True}).json()
    assert policy["write_through"] is True
    before = tiered.admin("GET", "/tiers").json()
    client.put_object(Bucket=tbucket, Key="durable", Body=b"in the capacity store before the ack")
    after = tiered.admin("GET", "/tiers").json()
    assert after["segments_written"] > before["segments_written"]
    assert after["flush_queue"] == 0
    tiered.evict()
    assert get(client, tbucket, "durable") == b"in the capacity store before the ack"
    client.copy_object(Bucket=tbucket, Key="copied", CopySource={"Bucket": tbucket, "Key": "durable"})
    assert tiered.admin("GET", "/tiers").json()["flush_queue"] == 0
    # A delete is acknowledged once its tombstone is in the capacity store:
    # nothing of it is left pending.
    before = tiered.admin("GET", "/tiers").json()["segments_written"]
    client.delete_object(Bucket=tbucket, Key="copied")
    status = tiered.admin("GET", "/tiers").json()
    assert status["pending_records"] == 0 and status["segments_written"] == before + 1


def test_segments_of_footer_records_alone_are_merged(tiered: Gateway, client, tbucket: str) -> None:
    for i in range(3):
        client.put_object(Bucket=tbucket, Key=f"r{i}", Body=b"x" * 1000)
    tiered.flush()
    tiered.compact()  # settle earlier tests' leftovers first
    before = tiered.admin("GET", "/tiers").json()["segments"]
    for i in range(2):  # each flush of a delete alone makes a segment of one tombstone
        client.delete_object(Bucket=tbucket, Key=f"r{i}")
        tiered.flush()
    client.copy_object(Bucket=tbucket, Key="r2", CopySource={"Bucket": tbucket, "Key": "r2"},
                       Metadata={"v": "2"}, MetadataDirective="REPLACE")  # a manifest alone
    assert tiered.flush()["segments"] == before + 3
    report = tiered.compact()
    assert report["merged"] >= 2
    tiered.compact()  # deletes what the first pass left unused
    assert tiered.admin("GET", "/tiers").json()["segments"] <= before + 1
    tiered.evict()
    head = client.head_object(Bucket=tbucket, Key="r2")
    assert head["Metadata"] == {"v": "2"}
    assert get(client, tbucket, "r2") == b"x" * 1000
    for i in range(2):
        with pytest.raises(client.exceptions.NoSuchKey):
            client.get_object(Bucket=tbucket, Key=f"r{i}")


def test_a_node_of_several_refuses_a_store_without_conditional_writes(rclone_endpoint: str, tmp_path: Path) -> None:
    """rclone serve s3 accepts If-None-Match: * and writes anyway: two nodes
    would both hold a lease, so a gateway with --node-id does not start."""
    port, admin_port = free_ports(2)
    args = capacity_args("rclone", rclone_endpoint, tmp_path, f"cap-node-{os.getpid()}")
    started = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--admin-port", str(admin_port), "--data-dir", str(tmp_path / "data"), "--node-id", "n1", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert started.returncode == 1, started.stdout + started.stderr
    assert "ignores conditional writes" in started.stderr and "--node-id" in started.stderr, started.stderr
