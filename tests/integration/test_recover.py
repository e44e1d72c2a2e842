"""The acceptance test of `tierstore recover`: the node's disk is lost, the
namespace comes back from the segment footers in the capacity store.

One capacity store (a real moto S3 server) is filled once per module: 2,000
objects (``TIERSTORE_RECOVER_OBJECTS``; 5,000 in ``scripts/release-check``) of 0 B..20 KiB in two buckets, a few of 6-12 MiB (split into parts)
and one multipart upload, then 500 overwritten and 500 deleted, all flushed;
besides, an empty bucket, a deleted one and a bucket policy (write-through).
The gateway is stopped and its data directory deleted. Then:

- a gateway on an empty data dir refuses that store (exit 1, says `recover`)
  and touches nothing in it;
- `recover` into a new dir gives back exactly the namespace: buckets and
  their policy, listing (keys, sizes, ETags), bytes, deleted keys NoSuchKey,
  content types, user metadata and checksums;
- `recover` into a dir that is not empty refuses and changes nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from tests.conftest import assert_consistent
from tests.integration.oracle import (
    Entry,
    MiB,
    Oracle,
    admin,
    blob,
    flush,
    recover,
    s3_client,
    tiers,
)
from tests.servers import Gateway
from tiering.index.db import Index
from tiering.maintenance import fsck

BUCKETS = ("train", "val")  # hold the objects
EMPTY, DROPPED = "empty-one", "dropped"  # a bucket left empty, one deleted after a flush
COUNT = int(os.environ.get("TIERSTORE_RECOVER_OBJECTS", "2000"))
SIZES = ["--segment-size", "8M"]  # several packed segments in the store



@dataclass
class Store:
    """The filled capacity store and what it must give back."""

    capacity_args: list[str]
    oracle: Oracle
    objects: int  # in the store's capacity bucket
    root: Path
    checksum: str  # ChecksumSHA256 of train/checked.txt

    def gateway(self, name: str) -> Gateway:
        return Gateway(self.root / name, extra_args=[*self.capacity_args, *SIZES])


def _capacity_objects(endpoint: str, bucket: str) -> list[tuple[str, int]]:
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        out += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
    return out


@pytest.fixture(scope="module")
def store(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    cap_bucket = f"tierstore-cap-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket=cap_bucket)
    capacity_args = [
        "--capacity",
        f"s3://{cap_bucket}",
        "--capacity-endpoint",
        moto_endpoint,
        "--capacity-access-key",
        "testing",
        "--capacity-secret-key",
        "testing",
    ]
    root = tmp_path_factory.mktemp("recover")
    oracle = Oracle()
    gw = Gateway(root / "lost", extra_args=[*capacity_args, *SIZES]).start()
    try:
        s3 = s3_client(gw)
        for bucket in (*BUCKETS, EMPTY, DROPPED):
            s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=DROPPED, Key="x", Body=b"x")
        checksum = s3.put_object(
            Bucket="train", Key="checked.txt", Body=b"checked", ChecksumAlgorithm="SHA256"
        )["ChecksumSHA256"]
        oracle.entries[("train", "checked.txt")] = Entry(b"checked")
        # COUNT objects, sizes 0 B .. 20 KiB. Most through the lean signer (boto3 costs ~4 ms of
        # client CPU a request on two cores); every tenth through boto3 with a content type and
        # user metadata.
        items = [
            (
                BUCKETS[i // 3 % 2],
                f"shard-{i % 37:02d}/obj-{i:05d}.bin",
                blob(f"o{i}", (i * 7919) % (20 * 1024 + 1)),
            )
            for i in range(COUNT)
        ]
        oracle.put_many_raw(gw, [item for i, item in enumerate(items) if i % 10], threads=12)
        oracle.put_many(
            gw,
            [item for i, item in enumerate(items) if i % 10 == 0],
            threads=8,
            content_type="application/x-sample",
            metadata={"label": "cat", "fold": "3"},
        )
        # A few large ones (split into 8 MiB parts in the capacity tier) and one multipart upload.
        large = [
            ("train", f"big/{i}.tar", blob(f"big{i}", size))
            for i, size in enumerate([6 * MiB, 9 * MiB + 1, 12 * MiB])
        ]
        oracle.put_many(
            gw, large, threads=3, content_type="application/x-tar", metadata={"big": "yes"}
        )
        oracle.upload_multipart(s3, "val", "big/multipart.bin", blob("mp", 11 * MiB + 5), 5 * MiB)
        flush(gw)
        # 500 overwrites (new sizes and bytes), 500 deletes (disjoint from the overwrites).
        oracle.put_many_raw(
            gw,
            [
                (b, k, blob(f"v2-{k}", 100 + (n * 31) % 15_000))
                for n, (b, k, _) in enumerate(items[1::10])
            ],
            threads=12,
        )
        deleted = items[5::10]
        for bucket in BUCKETS:
            oracle.delete_batch(s3, bucket, [k for b, k, _ in deleted[100:] if b == bucket])
        oracle.delete_many(gw, [(b, k) for b, k, _ in deleted[:100]])
        oracle.delete(s3, "train", "big/1.tar")
        s3.delete_object(Bucket=DROPPED, Key="x")
        s3.delete_bucket(Bucket=DROPPED)
        admin(gw, "PATCH", "/buckets/val", json={"write_through": True})
        status = flush(gw)
        assert status["flush_queue"] == 0 and status["hot_staged"] == 0, status
        assert status["segments"] >= 8, status
    finally:
        gw.stop()
    assert_consistent(gw)
    shutil.rmtree(gw.data_dir)  # the node's disk is gone
    objects = _capacity_objects(moto_endpoint, cap_bucket)
    assert len(objects) == status["segments"], (status, objects[:20])
    yield Store(capacity_args, oracle, len(objects), root, checksum)


SUMMARY = re.compile(
    r"recovered (\d+) objects \((\d+) bytes\) in (\d+) buckets from (\d+) segments; "
    r"(\d+) deleted keys stay deleted"
)


def _expected(store: Store) -> dict[str, int]:
    live = store.oracle.live()
    return {
        "objects": len(live),
        "bytes": sum(len(e.data) for e in live.values()),  # type: ignore[arg-type]
        "buckets": len(BUCKETS) + 1,  # and the empty one
        "segments": store.objects,
        "deleted": len(store.oracle.deleted()) + 1,  # and dropped/x
    }


def _check_serves(store: Store, gw: Gateway) -> None:
    gw.start()
    try:
        status = tiers(gw)
        assert status["flush_queue"] == 0 and status["segments"] == store.objects, status
        s3 = s3_client(gw)
        assert sorted(b["Name"] for b in s3.list_buckets()["Buckets"]) == sorted([*BUCKETS, EMPTY])
        assert admin(gw, "GET", "/buckets/val").json()["write_through"] is True
        assert admin(gw, "GET", "/buckets/train").json()["write_through"] is False
        head = s3.head_object(Bucket="train", Key="checked.txt", ChecksumMode="ENABLED")
        assert head.get("ChecksumSHA256") == store.checksum, head
        store.oracle.verify(gw, threads=12, sample_meta=50)
    finally:
        gw.stop()
    assert_consistent(gw)


def test_gateway_on_empty_dir_refuses_the_store(store: Store) -> None:
    gw = store.gateway("fresh")
    with pytest.raises(RuntimeError, match="exited with 1"):
        gw.start()
    assert gw.proc is not None and gw.proc.returncode == 1
    gw.proc = None
    assert "recover" in gw.log(), gw.log()[-2000:]
    endpoint = store.capacity_args[store.capacity_args.index("--capacity-endpoint") + 1]
    bucket = store.capacity_args[1].removeprefix("s3://")
    assert len(_capacity_objects(endpoint, bucket)) == store.objects, (
        "the refusing gateway changed the store"
    )


@pytest.fixture(scope="module")
def rebuilt(store: Store) -> tuple[Gateway, dict[str, int]]:
    """A data dir rebuilt by `tierstore recover`, and its summary line."""
    gw = store.gateway("recovered")
    done = recover(gw.data_dir, store.capacity_args)
    assert done.returncode == 0, done.stdout + done.stderr
    found = SUMMARY.search(done.stdout)
    assert found, done.stdout
    keys = ["objects", "bytes", "buckets", "segments", "deleted"]
    return gw, dict(zip(keys, map(int, found.groups()), strict=True))


def test_recover_command_rebuilds_the_namespace(
    store: Store, rebuilt: tuple[Gateway, dict[str, int]]
) -> None:
    gw, report = rebuilt
    assert report == _expected(store), report
    _check_serves(store, gw)


def test_recover_into_non_empty_dir_refuses(
    store: Store, rebuilt: tuple[Gateway, dict[str, int]]
) -> None:
    gw, _ = rebuilt
    before = _snapshot(gw.data_dir)
    done = recover(gw.data_dir, store.capacity_args)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    message = done.stderr.strip()
    assert message.startswith("tierstore: ") and "empty" in message, message
    assert "Traceback" not in done.stderr, done.stderr
    assert _snapshot(gw.data_dir) == before, "a refused recover changed the data directory"
    assert fsck.check(gw.data_dir) == []


def _snapshot(data_dir: Path) -> tuple[int, int]:
    index = Index(data_dir / "index")
    try:
        return sum(1 for _ in index.iter_objects()), len(index.segments())
    finally:
        index.close()
