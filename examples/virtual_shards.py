"""A small-file data set read by WebDataset as tar shards, without
converting it: ``virtual_shards`` writes a manifest of keys per shard and
returns presigned ``GET /{bucket}/{manifest}?batch`` URLs; WebDataset reads
each one (through curl, as any http URL) as the tar of those objects, in
the manifest's order. Each sample is two objects, ``<name>.bin`` and
``<name>.cls``, next to each other in the key order, so a shard of an even
number of keys holds whole samples. Every sample is checked.

    eval "$(tierstore env)"
    python examples/virtual_shards.py --bucket recipes-vshards
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import boto3
import webdataset as wds

from gateway.client.batch import virtual_shards

from _recipe import KiB, arguments, check, create_bucket, fail, payload, rate, same_bytes

SAMPLES, PER_SHARD = 256, 32  # samples; samples per shard (two objects each)


def files(index: int) -> dict[str, bytes]:
    name = f"images/{index:05d}"
    return {f"{name}.bin": payload(name, KiB * (1 + index % 12)), f"{name}.cls": str(index % 10).encode()}


def main() -> None:
    args = arguments(__doc__, "recipes-vshards")
    s3 = boto3.client("s3")
    create_bucket(s3, args.bucket)
    objects = {key: data for i in range(SAMPLES) for key, data in files(i).items()}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda item: s3.put_object(Bucket=args.bucket, Key=item[0], Body=item[1]), objects.items()))
    keys = sorted(objects)
    urls = virtual_shards(args.bucket, keys, per_shard=2 * PER_SHARD)
    print(f"wrote {SAMPLES} samples as {len(objects)} objects; {len(urls)} virtual shards of {PER_SHARD} samples")
    start = time.perf_counter()
    seen, size = [], 0
    for sample in wds.WebDataset(urls, shardshuffle=False):
        name = sample["__key__"]
        for ext in ("bin", "cls"):
            key = f"{name}.{ext}"
            if key not in objects:
                fail(f"{key}: not written")
            same_bytes(key, sample[ext], objects[key])
            size += len(sample[ext])
        seen.append(name)
    seconds = time.perf_counter() - start
    check(seen == sorted({k.rsplit(".", 1)[0] for k in keys}), f"read {len(seen)} samples, not the {SAMPLES} in order")
    print(f"webdataset read {len(seen)} samples from {len(urls)} virtual shards in order: {rate(len(seen), size, seconds)}")
    print(f"OK: virtual shards verified {len(seen)} samples")


if __name__ == "__main__":
    main()
