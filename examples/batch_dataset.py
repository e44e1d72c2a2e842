"""One request per DataLoader batch: a map-style data set whose
``__getitems__`` reads a whole batch of samples with one ``POST ?batch``
(a tar stream of the objects in order), with ``HintedSampler`` telling the
gateway the epoch's order. With torch installed it goes into a
``DataLoader`` (which calls ``__getitems__`` with each batch's indices);
without it the recipe cuts the sampler's order into batches by hand. Every
sample is checked; the same epoch is then read one GET per sample, for the
rate beside it.

    eval "$(tierstore env)"
    python examples/batch_dataset.py --bucket recipes-batch --batch-size 32
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3

from gateway.client.batch import BatchDataset
from gateway.client.hints import HintedSampler

from _recipe import (
    KiB,
    RandomIndices,
    arguments,
    check,
    create_bucket,
    epoch_line,
    last_epoch,
    payload,
    rate,
    same_bytes,
)

try:
    from torch import Generator
    from torch.utils.data import DataLoader, RandomSampler
except ImportError:  # driven by hand
    DataLoader = None

SAMPLES = 256


def size_of(index: int) -> int:
    return KiB * (1 + index * 5 % 24)


def upload(s3: Any, bucket: str) -> list[str]:
    create_bucket(s3, bucket)
    keys = [f"samples/{i:05d}.bin" for i in range(SAMPLES)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=keys[i], Body=payload(keys[i], size_of(i))),
                      range(SAMPLES)))
    return keys


def batches(dataset: BatchDataset, keys: list[str], batch_size: int, workers: int,
            seed: int) -> tuple[HintedSampler, Any]:
    """The epoch's batches, each a list of (key, bytes), and the sampler that hinted it."""
    if DataLoader is not None:
        sampler = HintedSampler(RandomSampler(dataset, generator=Generator().manual_seed(seed)), keys,
                                bucket=dataset.bucket)
        # collate_fn=list: a batch stays the list of samples __getitems__ returned.
        loader = DataLoader(dataset, sampler=sampler, batch_size=batch_size, num_workers=workers, collate_fn=list)
        return sampler, loader
    sampler = HintedSampler(RandomIndices(len(dataset), seed), keys, bucket=dataset.bucket)
    order = list(sampler)
    return sampler, (dataset.__getitems__(order[i:i + batch_size]) for i in range(0, len(order), batch_size))


def main() -> None:
    args = arguments(__doc__, "recipes-batch", batch_size=(32, "samples per request (default 32)"),
                     workers=(2, "DataLoader workers, with torch (default 2)"), seed=(0, "sampler seed"))
    s3 = boto3.client("s3")
    keys = upload(s3, args.bucket)
    print(f"wrote {len(keys)} samples to s3://{args.bucket}/samples/; torch: "
          f"{'DataLoader' if DataLoader is not None else 'not installed, batches cut by hand'}")
    index = {key: i for i, key in enumerate(keys)}
    dataset = BatchDataset(args.bucket, keys, transform=lambda key, data: (key, data))
    sampler, epoch = batches(dataset, keys, args.batch_size, args.workers, args.seed)
    start = time.perf_counter()
    seen, requests, size = [], 0, 0
    for batch in epoch:
        requests += 1
        for key, data in batch:
            same_bytes(key, data, payload(key, size_of(index[key])))
            seen.append(key)
            size += len(data)
    seconds = time.perf_counter() - start
    check(sorted(seen) == keys, f"the epoch read {len(seen)} samples ({len(set(seen))} distinct) of {len(keys)}")
    print(f"batched epoch: {len(seen)} samples in {requests} requests of up to {args.batch_size}, "
          f"{rate(len(seen), size, seconds)}")
    check(sampler.epoch_id, "HintedSampler registered no epoch: is the admin API reachable?")
    print(epoch_line(last_epoch(args.bucket, sampler.epoch_id)))
    start = time.perf_counter()
    for key in keys:
        same_bytes(key, s3.get_object(Bucket=args.bucket, Key=key)["Body"].read(), payload(key, size_of(index[key])))
    print(f"one GET per sample: {len(keys)} requests, {rate(len(keys), size, time.perf_counter() - start)}")
    print(f"OK: batch data set verified {len(seen)} samples")


if __name__ == "__main__":
    main()
