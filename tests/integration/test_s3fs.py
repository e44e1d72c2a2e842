"""s3fs (aiobotocore underneath) against a real gateway process."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

MiB = 1024 * 1024


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "a.txt": b"alpha\n",
        "b.bin": os.urandom(70_000),
        "sub/c.txt": b"gamma " * 100,
        "sub/deeper/d.json": b'{"d": 4}',
        "sub/deeper/e.txt": b"",
        "other/f.txt": b"foxtrot",
    }
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


@pytest.fixture
def tree(fs, bucket: str) -> dict[str, bytes]:
    """A small tree of objects under <bucket>/data/."""
    files = {
        "data/x/1.txt": b"one",
        "data/x/2.txt": b"two!",
        "data/x/y/3.csv": b"a,b\n1,2\n",
        "data/z.txt": b"zed" * 10,
        "top.txt": b"top level",
    }
    for rel, data in files.items():
        fs.pipe_file(f"{bucket}/{rel}", data)
    return files


def test_ls_info_exists(fs, bucket: str, tree: dict[str, bytes]) -> None:
    assert sorted(fs.ls(bucket, detail=False)) == [f"{bucket}/data", f"{bucket}/top.txt"]
    detailed = {e["name"]: e for e in fs.ls(f"{bucket}/data/x", detail=True)}
    assert detailed[f"{bucket}/data/x/y"]["type"] == "directory"
    one = detailed[f"{bucket}/data/x/1.txt"]
    assert (one["type"], one["size"]) == ("file", 3)

    info = fs.info(f"{bucket}/data/z.txt")
    assert info["type"] == "file"
    assert info["size"] == 30
    assert info["ETag"].strip('"') == _md5(b"zed" * 10)
    assert fs.info(f"{bucket}/data/x")["type"] == "directory"
    assert fs.info(bucket)["type"] == "directory"

    assert fs.exists(f"{bucket}/top.txt")
    assert fs.exists(f"{bucket}/data/x")  # a prefix counts as a directory
    assert not fs.exists(f"{bucket}/nothing.txt")
    assert not fs.exists(f"{bucket}/data/nothing/")
    assert fs.exists(bucket)
    assert not fs.exists(bucket + "-missing")
    with pytest.raises(FileNotFoundError):
        fs.info(f"{bucket}/nothing.txt")
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{bucket}/nothing.txt")


def test_find_glob_du_walk(fs, bucket: str, tree: dict[str, bytes]) -> None:
    everything = sorted(f"{bucket}/{k}" for k in tree)
    assert fs.find(bucket) == everything
    assert fs.find(f"{bucket}/data/x") == [f"{bucket}/data/x/1.txt", f"{bucket}/data/x/2.txt",
                                           f"{bucket}/data/x/y/3.csv"]
    sizes = fs.find(f"{bucket}/data", detail=True)
    assert {k: v["size"] for k, v in sizes.items()} == {
        f"{bucket}/{k}": len(v) for k, v in tree.items() if k.startswith("data/")
    }
    assert sorted(fs.glob(f"{bucket}/data/x/*.txt")) == [f"{bucket}/data/x/1.txt", f"{bucket}/data/x/2.txt"]
    assert sorted(fs.glob(f"{bucket}/**/*.csv")) == [f"{bucket}/data/x/y/3.csv"]
    assert sorted(fs.glob(f"{bucket}/*.txt")) == [f"{bucket}/top.txt"]
    assert fs.du(bucket) == sum(len(v) for v in tree.values())
    assert fs.du(f"{bucket}/data/x") == 3 + 4 + 8

    walked = {root: (sorted(dirs), sorted(files)) for root, dirs, files in fs.walk(bucket)}
    assert walked == {
        bucket: (["data"], ["top.txt"]),
        f"{bucket}/data": (["x"], ["z.txt"]),
        f"{bucket}/data/x": (["y"], ["1.txt", "2.txt"]),
        f"{bucket}/data/x/y": ([], ["3.csv"]),
    }


def test_cat_file_ranges_and_seek(fs, bucket: str) -> None:
    data = os.urandom(3 * MiB + 321)
    path = f"{bucket}/ranged.bin"
    fs.pipe_file(path, data)
    assert fs.cat_file(path) == data
    assert fs.cat_file(path, start=10, end=20) == data[10:20]
    assert fs.cat_file(path, start=MiB - 3, end=2 * MiB + 3) == data[MiB - 3 : 2 * MiB + 3]
    assert fs.cat_file(path, start=len(data) - 100) == data[-100:]
    assert fs.cat_file(path, start=-50) == data[-50:]
    assert fs.cat_file(path, start=0, end=len(data) + 1000) == data

    with fs.open(path, "rb", block_size=256 * 1024) as f:
        assert f.size == len(data)
        assert f.read(10) == data[:10]
        f.seek(2 * MiB + 7)
        assert f.read(1000) == data[2 * MiB + 7 : 2 * MiB + 1007]
        f.seek(-50, os.SEEK_END)
        assert f.read() == data[-50:]
        f.seek(100)
        assert f.tell() == 100
        assert f.read(MiB) == data[100 : MiB + 100]
        f.seek(len(data))
        assert f.read(10) == b""


def test_open_wb_multipart_20mib(fs, s3, bucket: str) -> None:
    data = os.urandom(20 * MiB + 5)
    path = f"{bucket}/written/big.bin"
    block = 5 * MiB
    with fs.open(path, "wb", block_size=block) as f:
        for offset in range(0, len(data), 3 * MiB):  # writes not aligned to parts
            f.write(data[offset : offset + 3 * MiB])
    head = s3.head_object(Bucket=bucket, Key="written/big.bin")
    assert head["ContentLength"] == len(data)
    # s3fs folds the short tail into the last part: 4 parts (5, 5, 5, 5 MiB + 5).
    assert re.fullmatch(r'"[0-9a-f]{32}-4"', head["ETag"]), head["ETag"]
    assert fs.info(path)["size"] == len(data)
    assert hashlib.sha256(fs.cat_file(path)).digest() == hashlib.sha256(data).digest()
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=bucket)
    with fs.open(path, "rb") as f:
        f.seek(15 * MiB - 1)
        assert f.read(2) == data[15 * MiB - 1 : 15 * MiB + 1]

    # A small file through open('wb') is one PutObject.
    with fs.open(f"{bucket}/written/small.txt", "wb") as f:
        f.write(b"small")
    assert fs.cat_file(f"{bucket}/written/small.txt") == b"small"


def test_put_get_rm_recursive(fs, bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "src"
    files = _make_tree(source)
    fs.put(str(source) + "/", f"{bucket}/tree/", recursive=True)
    assert sorted(fs.find(f"{bucket}/tree")) == sorted(f"{bucket}/tree/{rel}" for rel in files)
    for rel, data in files.items():
        assert fs.cat_file(f"{bucket}/tree/{rel}") == data

    target = tmp_path / "dst"
    fs.get(f"{bucket}/tree/", str(target) + "/", recursive=True)
    got = {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    assert got == files

    fs.pipe_file(f"{bucket}/keep.txt", b"keep")
    fs.rm(f"{bucket}/tree", recursive=True)
    assert fs.find(bucket) == [f"{bucket}/keep.txt"]
    assert not fs.exists(f"{bucket}/tree")
    fs.rm(f"{bucket}/keep.txt")
    assert fs.find(bucket) == []


def test_copy_move_touch(fs, bucket: str) -> None:
    fs.pipe_file(f"{bucket}/orig.txt", b"original")
    fs.copy(f"{bucket}/orig.txt", f"{bucket}/copied.txt")
    fs.mv(f"{bucket}/copied.txt", f"{bucket}/moved/here.txt")
    fs.touch(f"{bucket}/empty")
    assert fs.find(bucket) == [f"{bucket}/empty", f"{bucket}/moved/here.txt", f"{bucket}/orig.txt"]
    assert fs.cat_file(f"{bucket}/moved/here.txt") == b"original"
    assert fs.cat_file(f"{bucket}/empty") == b""
    assert fs.info(f"{bucket}/empty")["size"] == 0
    assert fs.cat([f"{bucket}/orig.txt", f"{bucket}/empty"]) == {
        f"{bucket}/orig.txt": b"original", f"{bucket}/empty": b""}


def test_mkdir_rmdir_bucket(fs, s3) -> None:
    name = "s3fs-made-bucket"
    fs.mkdir(name)
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert fs.exists(name)
    fs.pipe_file(f"{name}/f", b"x")
    assert fs.cat_file(f"{name}/f") == b"x"
    fs.rm(f"{name}/f")
    fs.rmdir(name)
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    fs.invalidate_cache()
    assert not fs.exists(name)
