"""An object far larger than the hot tier: it streams through to the
capacity tier as it arrives, and reads back intact while the hot tier's
cache evicts behind the reader. Its size, past 2 GiB so that offsets
overflow 32 bits, is ``TIERSTORE_LARGE_GIB`` GiB and a few bytes (2; 5 in
``scripts/release-check``)."""

from __future__ import annotations

import hashlib
import io
import os
import random
from pathlib import Path

import pytest

from tests.conftest import assert_consistent, make_client
from tests.servers import Gateway

MiB = 1024 * 1024
GiB = 1024 * MiB
LARGE = int(os.environ.get("TIERSTORE_LARGE_GIB", "2")) * GiB + 12345
_BLOCK = MiB


class Generated(io.RawIOBase):
    """``size`` reproducible bytes, produced on demand (never all in memory).
    Block i is a rotation of one random MiB, so every block differs."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size = size
        self._base = random.Random(seed).randbytes(_BLOCK)
        self._pos = 0
        self._cached = (-1, b"")

    def block(self, index: int) -> bytes:
        if self._cached[0] != index:  # clients read in small pieces: build each block once
            turn = (index * 7919) % _BLOCK
            self._cached = (index, self._base[turn:] + self._base[:turn])
        return self._cached[1]

    def slice(self, start: int, end: int) -> bytes:
        out = bytearray()
        while start < end:
            index, offset = divmod(start, _BLOCK)
            piece = self.block(index)[offset : offset + end - start]
            out += piece
            start += len(piece)
        return bytes(out)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self._pos + n)
        data = self.slice(self._pos, end)
        self._pos = end
        return data

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def __len__(self) -> int:
        return self.size


@pytest.mark.slow
def test_a_put_of_gibs_through_a_512_mib_hot_tier(tmp_path: Path) -> None:
    size = LARGE
    gw = Gateway(
        tmp_path / "data",
        extra_args=["--hot-size", "512M", "--capacity", (tmp_path / "capacity").as_uri()],
    ).start()
    try:
        s3 = make_client(gw.endpoint)
        s3.create_bucket(Bucket="big")
        body = Generated(size)
        etag = s3.put_object(Bucket="big", Key="blob", Body=body, ContentLength=size)["ETag"]
        status = gw.admin("GET", "/tiers").json()
        assert status["hot_staged"] == 0, "the body went straight to the capacity tier"
        assert status["hot_used"] <= 512 * MiB
        assert s3.head_object(Bucket="big", Key="blob")["ContentLength"] == size

        response = s3.get_object(Bucket="big", Key="blob")
        assert response["ETag"] == etag
        stream, offset, md5 = response["Body"], 0, hashlib.md5()
        while chunk := stream.read(8 * MiB):
            assert chunk == body.slice(offset, offset + len(chunk)), f"bytes differ near offset {offset}"
            md5.update(chunk)
            offset += len(chunk)
        assert offset == size
        assert etag == f'"{md5.hexdigest()}"'
        status = gw.admin("GET", "/tiers").json()
        assert status["hot_used"] <= 512 * MiB, "reading it never grew the hot tier past its budget"
        assert status["evicted"] > 0

        tail = s3.get_object(Bucket="big", Key="blob", Range=f"bytes={size - 100}-")["Body"].read()
        assert tail == body.slice(size - 100, size)
    finally:
        gw.stop()
    assert_consistent(gw)
