"""boto3 against a tierstore gateway: make a bucket, upload files (one above
boto3's 8 MiB multipart threshold), list them page by page, download them
and read a range across a part boundary; every byte is checked.

    eval "$(tierstore env)"
    python examples/boto3_basics.py --bucket recipes-boto3

boto3 reads AWS_ENDPOINT_URL and the key pair from the environment itself
(releases since autumn 2023), so ``boto3.client("s3")`` needs no arguments.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig

from _recipe import MiB, arguments, check, create_bucket, mib, payload, same_bytes

FILES = {f"docs/page-{i}.txt": 1000 + i for i in range(5)} | {
    "images/cat.jpg": 300 * 1024,
    "blobs/model.bin": 9 * MiB + 123,  # two parts: 8 MiB + the rest
}
PART = 8 * MiB  # boto3's default multipart_threshold and multipart_chunksize


def upload(s3, bucket: str, folder: Path) -> None:
    """``upload_file`` switches to a multipart upload above the threshold."""
    config = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART)
    for key, size in FILES.items():
        path = folder / "up" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload(key, size))
        s3.upload_file(str(path), bucket, key, Config=config)


def listing(s3, bucket: str) -> tuple[dict[str, int], int]:
    """Every key and size, two keys a page to show the paginator at work."""
    paginator = s3.get_paginator("list_objects_v2")
    pages = paginator.paginate(Bucket=bucket, PaginationConfig={"PageSize": 2})
    sizes, count = {}, 0
    for page in pages:
        count += 1
        sizes.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    return sizes, count


def main() -> None:
    args = arguments(__doc__, "recipes-boto3")
    s3 = boto3.client("s3")
    create_bucket(s3, args.bucket)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        upload(s3, args.bucket, folder)
        total = sum(FILES.values())
        print(f"uploaded {len(FILES)} files, {mib(total)}, "
              f"to s3://{args.bucket} at {s3.meta.endpoint_url}")

        etag = s3.head_object(Bucket=args.bucket, Key="blobs/model.bin")["ETag"]
        check(etag.endswith('-2"'), f"blobs/model.bin: ETag {etag} is not that of a 2-part upload")

        sizes, pages = listing(s3, args.bucket)
        check(sizes == FILES, f"listing does not match what was uploaded: {sorted(sizes.items())}")
        print(f"listed {len(sizes)} keys in {pages} pages")

        for key in FILES:
            path = folder / "down" / key
            path.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(args.bucket, key, str(path))
            same_bytes(key, path.read_bytes(), payload(key, FILES[key]))

    # HTTP ranges are inclusive: 100 bytes either side of the part boundary.
    first, last = PART - 100, PART + 99
    key = "blobs/model.bin"
    got = s3.get_object(Bucket=args.bucket, Key=key, Range=f"bytes={first}-{last}")["Body"].read()
    same_bytes(f"range of {key}", got, payload(key, FILES[key])[first:last + 1])
    print(f"downloaded {len(FILES)} files and a {len(got)}-byte range across the part boundary")
    print(f"OK: boto3 verified {len(FILES)} objects, {total} bytes")


if __name__ == "__main__":
    main()
