"""Amazon's S3 connector for PyTorch against a tierstore gateway: the
``s3torchconnectorclient`` client (Rust, Mountpoint's; needs no torch) puts,
heads, lists and gets objects, whole and by range; when ``s3torchconnector``
(which needs torch) is installed, ``S3MapDataset`` and ``S3IterableDataset``
read the same prefix. Every byte is checked.

    eval "$(tierstore env)"
    python examples/s3torch_client.py --bucket recipes-s3torch

The client takes its key pair from the environment, and its endpoint from
AWS_ENDPOINT_URL too, but it addresses buckets virtual-host style
(``bucket.host``) unless told ``force_path_style=True``: against a gateway
on ``localhost`` or a plain host name that fails to resolve. Both are given
explicitly here.
"""

from __future__ import annotations

import boto3
from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

from _recipe import (
    KiB,
    MiB,
    arguments,
    check,
    create_bucket,
    endpoint,
    mib,
    payload,
    region,
    same_bytes,
)

PREFIX = "images/"
OBJECTS = {f"{PREFIX}{i:03d}.jpg": 20 * KiB + 997 * i for i in range(8)}
OBJECTS[f"{PREFIX}large.bin"] = 9 * MiB + 5  # two parts of the client's 8 MiB


def client() -> MountpointS3Client:
    return MountpointS3Client(region(), endpoint=endpoint(), force_path_style=True)


def put(s3: MountpointS3Client, bucket: str) -> None:
    """``put_object`` is a stream: one PUT, or a multipart upload of 8 MiB
    parts (the client's part size) for more."""
    for key, size in OBJECTS.items():
        stream = s3.put_object(bucket, key)
        data = payload(key, size)
        for start in range(0, size, 4 * MiB):
            stream.write(data[start:start + 4 * MiB])
        stream.close()


def listed(s3: MountpointS3Client, bucket: str) -> dict[str, int]:
    pages = s3.list_objects(bucket, PREFIX, max_keys=4)
    return {o.key: o.size for page in pages for o in page.object_info}


def read_back(s3: MountpointS3Client, bucket: str) -> None:
    for key, size in OBJECTS.items():
        head = s3.head_object(bucket, key)
        check(head.size == size, f"{key}: HEAD says {head.size} bytes, wrote {size}")
        same_bytes(key, b"".join(s3.get_object(bucket, key)), payload(key, size))
    large = f"{PREFIX}large.bin"
    check(s3.head_object(bucket, large).etag.endswith('-2"'), f"{large}: not a 2-part upload")
    start, end = 8 * MiB - 1000, 8 * MiB + 1000  # end exclusive, unlike HTTP's Range
    got = b"".join(s3.get_object(bucket, large, start=start, end=end))
    same_bytes(f"{large}[{start}:{end}]", got, payload(large, OBJECTS[large])[start:end])


def key_and_bytes(reader) -> tuple[str, bytes]:
    """The data sets' transform: a module-level function, so workers can pickle it."""
    return reader.key, reader.read()


def torch_datasets(bucket: str) -> bool:
    """S3MapDataset and S3IterableDataset over the prefix; False without them."""
    try:
        from s3torchconnector import S3ClientConfig, S3IterableDataset, S3MapDataset
        from torch.utils.data import DataLoader
    except ImportError:
        return False
    options = {"region": region(), "endpoint": endpoint(), "transform": key_and_bytes,
               "s3client_config": S3ClientConfig(force_path_style=True)}
    uri = f"s3://{bucket}/{PREFIX}"
    mapped = S3MapDataset.from_prefix(uri, **options)
    check(len(mapped) == len(OBJECTS), f"S3MapDataset found {len(mapped)} objects")
    for key, data in (mapped[i] for i in range(len(mapped))):
        same_bytes(f"S3MapDataset {key}", data, payload(key, OBJECTS[key]))
    # enable_sharding: without it every DataLoader worker reads the whole prefix.
    stream = S3IterableDataset.from_prefix(uri, enable_sharding=True, **options)
    # The client's native threads do not survive a fork: workers are spawned.
    loader = DataLoader(stream, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    seen = []
    for key, data in loader:
        same_bytes(f"S3IterableDataset {key}", data, payload(key, OBJECTS[key]))
        seen.append(key)
    check(sorted(seen) == sorted(OBJECTS), f"S3IterableDataset with 2 workers read {sorted(seen)}")
    print(f"S3MapDataset and S3IterableDataset (2 workers, sharded) "
          f"read {len(OBJECTS)} objects each")
    return True


def main() -> None:
    args = arguments(__doc__, "recipes-s3torch",
                     skip_datasets=(False, "the client only, even with torch installed"))
    create_bucket(boto3.client("s3"), args.bucket)  # the client has no CreateBucket
    s3 = client()
    put(s3, args.bucket)
    total = sum(OBJECTS.values())
    print(f"put {len(OBJECTS)} objects ({mib(total)}) to s3://{args.bucket}/{PREFIX} "
          "with MountpointS3Client")
    found = listed(s3, args.bucket)
    check(found == OBJECTS, f"list_objects found {sorted(found.items())}")
    read_back(s3, args.bucket)
    print(f"listed, headed and read back {len(OBJECTS)} objects, "
          "and a range across a part boundary")
    if args.skip_datasets:
        print("data sets skipped (--skip-datasets)")
    elif not torch_datasets(args.bucket):
        print("s3torchconnector (needs torch) not installed: data sets skipped")
    print(f"OK: s3torchconnector verified {len(OBJECTS)} objects")


if __name__ == "__main__":
    main()
