"""PyTorch-style data sets over a tierstore bucket, with or without torch:
a map-style data set (one GET per sample) read in a random order that
``gateway.client.hints.HintedSampler`` registers with the gateway, and an iterable
data set that splits its objects across workers. With torch installed both
go into ``torch.utils.data.DataLoader``; without it the recipe drives them by
hand. Every sample is checked, and the epoch is shown as ``GET /epochs``
reports it.

    eval "$(tierstore env)"
    python examples/torch_datasets.py --bucket recipes-torch --workers 2
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from typing import Any

import boto3

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
    from torch.utils.data import (
        DataLoader,
        Dataset,
        IterableDataset,
        RandomSampler,
        get_worker_info,
    )
except ImportError:  # the same classes, driven by hand
    DataLoader = None
    Dataset = IterableDataset = object  # type: ignore[assignment,misc]

    def get_worker_info() -> Any:
        return None

SAMPLES = 128


def size_of(index: int) -> int:
    return KiB * (1 + index * 7 % 16)


class _S3:
    """One boto3 client per process, made on first use: a client must not
    cross a fork or be pickled into a DataLoader worker."""

    _client: Any = None

    def get(self, bucket: str, key: str) -> bytes:
        if self._client is None:
            self._client = boto3.client("s3")
        return self._client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def __getstate__(self) -> dict[str, Any]:
        return {}


class ObjectDataset(Dataset):
    """Map-style: sample ``i`` is the object ``keys[i]``."""

    def __init__(self, bucket: str, keys: list[str]) -> None:
        self.bucket, self.keys, self.s3 = bucket, keys, _S3()

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> tuple[str, bytes]:
        return self.keys[index], self.s3.get(self.bucket, self.keys[index])


class ObjectStream(IterableDataset):
    """Iterable: worker ``w`` of ``n`` reads keys ``w, w+n, w+2n, ...``.
    Under a DataLoader, torch says which worker this is; by hand, ``worker``
    does."""

    def __init__(self, bucket: str, keys: list[str], worker: tuple[int, int] = (0, 1)) -> None:
        self.bucket, self.keys, self.worker, self.s3 = bucket, keys, worker, _S3()

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        info = get_worker_info()
        index, count = (info.id, info.num_workers) if info is not None else self.worker
        for key in self.keys[index::count]:
            yield key, self.s3.get(self.bucket, key)


def upload(bucket: str) -> list[str]:
    s3 = boto3.client("s3")
    create_bucket(s3, bucket)
    keys = [f"samples/{i:05d}.bin" for i in range(SAMPLES)]

    def put(i: int) -> None:
        s3.put_object(Bucket=bucket, Key=keys[i], Body=payload(keys[i], size_of(i)))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(SAMPLES)))
    return keys


def verify(samples: Any, keys: list[str]) -> tuple[list[str], int]:
    """Check each (key, bytes) against what was written; the keys in read order."""
    index = {key: i for i, key in enumerate(keys)}
    seen, size = [], 0
    for key, data in samples:
        same_bytes(key, data, payload(key, size_of(index[key])))
        seen.append(key)
        size += len(data)
    return seen, size


def map_style_epoch(bucket: str, keys: list[str], workers: int, seed: int) -> HintedSampler:
    dataset = ObjectDataset(bucket, keys)
    if DataLoader is not None:
        base = RandomSampler(dataset, generator=Generator().manual_seed(seed))
        sampler = HintedSampler(base, keys, bucket=bucket, readers=workers)
        # batch_size=None hands index i to worker i % workers: the readers the hint names.
        samples = DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=workers)
    else:
        sampler = HintedSampler(RandomIndices(len(dataset), seed), keys, bucket=bucket)
        samples = (dataset[i] for i in sampler)
    start = time.perf_counter()
    seen, size = verify(samples, keys)
    seconds = time.perf_counter() - start
    check(sorted(seen) == keys, f"the epoch read {len(seen)} samples "
          f"({len(set(seen))} distinct) of {len(keys)}")
    print(f"map-style epoch: {len(seen)} samples in random order, {rate(len(seen), size, seconds)}")
    return sampler


def iterable_epoch(bucket: str, keys: list[str], workers: int) -> None:
    if DataLoader is not None:
        samples = DataLoader(ObjectStream(bucket, keys), batch_size=None, num_workers=workers)
    else:
        streams = [ObjectStream(bucket, keys, worker=(w, workers)) for w in range(workers)]
        samples = chain.from_iterable(streams)
    seen, _ = verify(samples, keys)
    check(sorted(seen) == keys, f"{workers} workers read {len(seen)} samples "
          f"({len(set(seen))} distinct) of {len(keys)}")
    print(f"iterable epoch: {len(seen)} samples split across {workers} workers, each read once")


def main() -> None:
    args = arguments(__doc__, "recipes-torch", workers=(2, "DataLoader workers (default 2)"),
                     seed=(0, "sampler seed (default 0)"))
    keys = upload(args.bucket)
    print(f"wrote {len(keys)} samples to s3://{args.bucket}/samples/; torch: "
          f"{'DataLoader' if DataLoader is not None else 'not installed, plain loops'}")
    sampler = map_style_epoch(args.bucket, keys, args.workers, args.seed)
    check(sampler.epoch_id, "HintedSampler registered no epoch: is the admin API reachable?")
    print(epoch_line(last_epoch(args.bucket, sampler.epoch_id)))
    iterable_epoch(args.bucket, keys, args.workers)
    print(f"OK: torch-style data sets verified {2 * len(keys)} reads")


if __name__ == "__main__":
    main()
