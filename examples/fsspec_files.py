"""s3fs / fsspec against a tierstore gateway: write and read files through
``fsspec.open("s3://...")`` and an ``S3FileSystem``, glob, ls, and read a
range of a large file after a seek; every byte is checked.

    eval "$(tierstore env)"
    python examples/fsspec_files.py --bucket recipes-fsspec

s3fs creates its client through aiobotocore, which reads AWS_ENDPOINT_URL
and the key pair from the environment, so neither ``S3FileSystem()`` nor
``fsspec.open("s3://...")`` needs arguments.
"""

from __future__ import annotations

import fsspec
import s3fs

from _recipe import MiB, arguments, check, mib, payload, same_bytes

TEXTS = {f"text/part-{i:02d}.txt": f"line {i}\n" * (50 + i) for i in range(6)}
BIG, BIG_SIZE = "arrays/big.bin", 6 * MiB + 7
BLOCK = 5 * MiB  # s3fs's write block: a file larger than one is a multipart upload


def write(fs: s3fs.S3FileSystem, bucket: str) -> None:
    for key, text in TEXTS.items():
        with fsspec.open(f"s3://{bucket}/{key}", "w") as f:
            f.write(text)
    with fs.open(f"{bucket}/{BIG}", "wb", block_size=BLOCK) as f:
        data = payload(BIG, BIG_SIZE)
        for start in range(0, BIG_SIZE, MiB):  # written in pieces, as a training job would
            f.write(data[start:start + MiB])


def read_back(fs: s3fs.S3FileSystem, bucket: str) -> None:
    found = sorted(fs.glob(f"{bucket}/text/*.txt"))
    check(found == sorted(f"{bucket}/{k}" for k in TEXTS), f"glob found {found}")
    for key, text in TEXTS.items():
        with fsspec.open(f"s3://{bucket}/{key}", "r") as f:
            check(f.read() == text, f"{key}: text read back differs")
    top = sorted(fs.ls(bucket, detail=False))
    check(top == [f"{bucket}/arrays", f"{bucket}/text"], f"ls {bucket}: {top}")
    info = fs.info(f"{bucket}/{BIG}")
    check(info["size"] == BIG_SIZE, f"{BIG}: size {info['size']}, wrote {BIG_SIZE}")
    check(info["ETag"].endswith('-2"'), f"{BIG}: ETag {info['ETag']} is not a 2-part upload's")


def read_ranges(fs: s3fs.S3FileSystem, bucket: str) -> int:
    """A seek then a read, and ``cat_file`` of a range: each a ranged GET."""
    want = payload(BIG, BIG_SIZE)
    with fs.open(f"{bucket}/{BIG}", "rb", block_size=MiB) as f:
        f.seek(5 * MiB - 10)
        same_bytes(f"{BIG} after seek", f.read(4096), want[5 * MiB - 10:5 * MiB - 10 + 4096])
    # By keyword: s3fs's cat_file takes version_id before start and end (end exclusive).
    got = fs.cat_file(f"{bucket}/{BIG}", start=123, end=65_659)
    same_bytes(f"{BIG} cat_file range", got, want[123:65_659])
    same_bytes(f"{BIG} whole", fs.cat_file(f"{bucket}/{BIG}"), want)
    return BIG_SIZE


def main() -> None:
    args = arguments(__doc__, "recipes-fsspec")
    fs = s3fs.S3FileSystem()
    if not fs.exists(args.bucket):
        fs.mkdir(args.bucket)
    write(fs, args.bucket)
    print(f"wrote {len(TEXTS)} text files and {BIG} ({mib(BIG_SIZE)}, {BLOCK // MiB} MiB blocks) "
          f"to s3://{args.bucket}")
    read_back(fs, args.bucket)
    print(f"glob, ls and info agree; read back {len(TEXTS)} text files")
    read_ranges(fs, args.bucket)
    print(f"seek + read and ranged cat_file of {BIG} match")
    print(f"OK: fsspec verified {len(TEXTS) + 1} objects")


if __name__ == "__main__":
    main()
