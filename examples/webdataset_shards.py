"""WebDataset against a tierstore gateway: write tar shards of samples and a
manifest of their checksums, then read one epoch with ``webdataset`` in the
shard order registered with the gateway as an epoch hint; every sample is
checked against the manifest.

    eval "$(tierstore env)"
    python examples/webdataset_shards.py --bucket recipes-wds
    python examples/webdataset_shards.py --bucket recipes-wds --read-only --seed 1  # next epoch

WebDataset opens URLs with its own ``gopen`` (it knows ``http(s)://`` through
curl and ``pipe:`` commands, not ``s3://``). Presigned URLs, made by boto3 for
the gateway, are read by one curl per shard; ``pipe:aws s3 cp s3://... -``
works too but starts a Python interpreter per shard (about 1 s of CPU each).
"""

from __future__ import annotations

import io
import json
import tarfile
import time

import boto3
import webdataset as wds

from gateway.client.hints import shard_epoch

from _recipe import (
    KiB,
    arguments,
    check,
    create_bucket,
    epoch_line,
    fail,
    last_epoch,
    mib,
    payload,
    rate,
    sha256,
)

SHARDS, PER_SHARD = 16, 32
PATTERN = f"shards/train-{{0000..{SHARDS - 1:04d}}}.tar"
MANIFEST = "shards/manifest.json"


def sample(shard: int, index: int) -> tuple[str, bytes, bytes]:
    """One sample: its key, a .bin of 1-8 KiB and a .cls label."""
    key = f"sample-{shard:04d}-{index:03d}"
    size = KiB * (1 + (shard * PER_SHARD + index) % 8)
    return key, payload(key, size), str((shard + index) % 10).encode()


def build_shard(shard: int) -> tuple[bytes, dict[str, dict[str, str]]]:
    """The tar shard and the checksums of its samples' files."""
    buffer, digests = io.BytesIO(), {}
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for index in range(PER_SHARD):
            key, data, label = sample(shard, index)
            for ext, body in (("bin", data), ("cls", label)):
                member = tarfile.TarInfo(f"{key}.{ext}")
                member.size, member.mtime = len(body), 0
                tar.addfile(member, io.BytesIO(body))
            digests[key] = {"bin": sha256(data), "cls": sha256(label)}
    return buffer.getvalue(), digests


def upload(s3, bucket: str) -> int:
    create_bucket(s3, bucket)
    manifest, size = {}, 0
    for shard in range(SHARDS):
        body, digests = build_shard(shard)
        s3.put_object(Bucket=bucket, Key=f"shards/train-{shard:04d}.tar", Body=body)
        manifest.update(digests)
        size += len(body)
    s3.put_object(Bucket=bucket, Key=MANIFEST, Body=json.dumps(manifest).encode())
    return size


def presigned(s3, bucket: str, key: str) -> str:
    """A GET URL curl can read, signed with the key pair, valid for an hour."""
    return s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key},
                                     ExpiresIn=3600)


def read_epoch(s3, bucket: str, seed: int) -> tuple[list[str], list[str], int]:
    """One epoch in the hinted order; the shard keys, the sample keys in the
    order read and their bytes in all. Fails on the first bad sample."""
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=MANIFEST)["Body"].read())
    keys = shard_epoch(bucket, PATTERN, seed=seed)  # registers the order; also returns it
    shard_of = {presigned(s3, bucket, key): key for key in keys}
    seen, order, size = [], [], 0
    # shardshuffle=False: read in the hinted order, not in WebDataset's own shuffle.
    for item in wds.WebDataset(list(shard_of), shardshuffle=False):
        shard = shard_of[item["__url__"]]
        if not order or order[-1] != shard:
            order.append(shard)
        want = manifest.get(item["__key__"]) or fail(f"{item['__key__']}: not in the manifest")
        for ext in ("bin", "cls"):
            if sha256(item[ext]) != want[ext]:
                fail(f"{item['__key__']}.{ext} in {shard}: checksum mismatch")
            size += len(item[ext])
        seen.append(item["__key__"])
    check(sorted(seen) == sorted(manifest), f"read {len(seen)} samples "
          f"({len(set(seen))} distinct), the manifest lists {len(manifest)}")
    check(order == keys, f"shards were read in the order {order}, not the hinted {keys}")
    return keys, seen, size


def main() -> None:
    args = arguments(__doc__, "recipes-wds", seed=(0, "epoch seed: the shard order (default 0)"),
                     read_only=(False, "read the shards already in the bucket"))
    s3 = boto3.client("s3")
    if not args.read_only:
        size = upload(s3, args.bucket)
        print(f"wrote {SHARDS} shards x {PER_SHARD} samples ({mib(size)}) and {MANIFEST} "
              f"to s3://{args.bucket}")
    start = time.perf_counter()
    keys, seen, size = read_epoch(s3, args.bucket, args.seed)
    seconds = time.perf_counter() - start
    print(f"read {len(seen)} samples from {len(keys)} shards in the hinted order "
          f"(seed {args.seed}, first {keys[0]}): {rate(len(seen), size, seconds)}")
    print(epoch_line(last_epoch(args.bucket)))
    print(f"OK: webdataset verified {len(seen)} samples")


if __name__ == "__main__":
    main()
