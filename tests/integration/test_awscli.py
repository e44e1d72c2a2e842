"""The AWS CLI (v1, botocore + s3transfer) against a real gateway process."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tests.integration.helpers import random_file, sha256_file, tree_digest

MiB = 1024 * 1024


def _ls_lines(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.strip()]


def test_mb_cp_ls_head_rm_rb(aws, s3, tmp_path: Path) -> None:
    # Each CLI start costs ~1-2 s here, so every call counts; checks that
    # need no CLI go through boto3.
    name = "awscli-life-cycle"
    aws("s3", "mb", f"s3://{name}")
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]

    small = tmp_path / "small.txt"
    small.write_bytes(b"hello from the aws cli\n")
    big = tmp_path / "big.bin"
    big_sha = random_file(big, 20 * MiB)  # above the CLI's 8 MiB multipart threshold

    aws.parallel(
        ("s3", "cp", str(small), f"s3://{name}/docs/small.txt", "--content-type", "text/x-cli",
         "--metadata", "origin=cli"),
        ("s3", "cp", str(big), f"s3://{name}/blobs/big.bin"),
    )
    s3.put_object(Bucket=name, Key="top.txt", Body=b"top")
    head = s3.head_object(Bucket=name, Key="docs/small.txt")
    assert head["ContentType"] == "text/x-cli"
    assert head["Metadata"] == {"origin": "cli"}
    assert head["ETag"] == f'"{hashlib.md5(small.read_bytes()).hexdigest()}"'

    down = tmp_path / "down"
    head_out, _, _, top_out, recursive_out, _ = aws.parallel(
        ("s3api", "head-object", "--bucket", name, "--key", "blobs/big.bin"),
        ("s3", "cp", f"s3://{name}/docs/small.txt", str(down / "small.txt")),
        ("s3", "cp", f"s3://{name}/blobs/big.bin", str(down / "big.bin")),
        ("s3", "ls", f"s3://{name}"),
        ("s3", "ls", f"s3://{name}", "--recursive"),
        # Server-side copy; above 8 MiB the CLI uses UploadPartCopy with ranges.
        ("s3", "cp", f"s3://{name}/blobs/big.bin", f"s3://{name}/copies/big.bin"),
    )
    copied = s3.get_object(Bucket=name, Key="copies/big.bin")
    assert copied["ETag"].endswith('-3"')
    assert hashlib.sha256(copied["Body"].read()).hexdigest() == big_sha
    s3.delete_object(Bucket=name, Key="copies/big.bin")
    head = json.loads(head_out.stdout)
    assert head["ContentLength"] == 20 * MiB
    assert head["ETag"].endswith('-3"')  # 8 + 8 + 4 MiB parts
    assert (down / "small.txt").read_bytes() == small.read_bytes()
    assert sha256_file(down / "big.bin") == big_sha

    top = _ls_lines(top_out.stdout)
    assert ["PRE", "blobs/"] in top
    assert ["PRE", "docs/"] in top
    assert [line[-1] for line in top if line[0] != "PRE"] == ["top.txt"]
    listed = {line[-1]: int(line[-2]) for line in _ls_lines(recursive_out.stdout)}
    # The server-side copy ran alongside the listing: absent, or there whole.
    assert listed.pop("copies/big.bin", 20 * MiB) == 20 * MiB
    assert listed == {
        "blobs/big.bin": 20 * MiB,
        "docs/small.txt": small.stat().st_size,
        "top.txt": 3,
    }

    aws("s3", "rm", f"s3://{name}/blobs", "--recursive")
    remaining = [o["Key"] for o in s3.list_objects_v2(Bucket=name)["Contents"]]
    assert remaining == ["docs/small.txt", "top.txt"]

    # --force empties the bucket, then removes it.
    aws("s3", "rb", f"s3://{name}", "--force")
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_sync_up_and_down(aws, s3, bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "src"
    files = {
        "a.txt": b"a" * 10,
        "nested/b.bin": os.urandom(300_000),
        "nested/deeper/c.txt": b"c\n",
        "nested/deeper/empty": b"",
        "with space/d e.txt": b"spaces",
        "unicode/ü-日本.txt": "unicode ✓".encode(),
        "big/part.bin": os.urandom(9 * MiB),  # multipart through sync
    }
    for rel, data in files.items():
        path = source / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    up = aws("s3", "sync", str(source), f"s3://{bucket}/mirror")
    assert up.stdout.count("upload:") == len(files)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == sorted(f"mirror/{rel}" for rel in files)

    target = tmp_path / "dst"
    aws("s3", "sync", f"s3://{bucket}/mirror", str(target))
    assert tree_digest(target) == tree_digest(source)

    # A changed and a deleted file propagate with --delete; the rest is skipped.
    (source / "a.txt").write_bytes(b"changed content")
    (source / "nested/deeper/c.txt").unlink()
    changed = aws("s3", "sync", str(source), f"s3://{bucket}/mirror", "--delete")
    assert changed.stdout.count("upload:") == 1
    assert changed.stdout.count("delete:") == 1
    assert s3.get_object(Bucket=bucket, Key="mirror/a.txt")["Body"].read() == b"changed content"
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == sorted(f"mirror/{rel}" for rel in files if rel != "nested/deeper/c.txt")
