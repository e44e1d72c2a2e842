"""gateway/s3/tar.py: what it writes, read back by the standard library."""

from __future__ import annotations

import io
import tarfile

import pytest

from gateway.handlers import batch
from gateway.s3 import tar
from tiering.batch.member import Member
from tiering.errors import NoSuchKey
from tiering.meta import ObjectMeta


def archive(*members: tuple[str, bytes, int]) -> bytes:
    out = b""
    for name, body, mtime in members:
        out += tar.header(name, len(body), mtime) + body + tar.padding(len(body))
    return out + tar.END


@pytest.mark.parametrize("name", [
    "a", "dir/file.jpg", "x" * 100, "y" * 101, "d/" + "z" * 1000, "été/日本語.txt", "sp ace=&+%",
    "trailing/", "\u00ff" * 60,
])
def test_names_sizes_and_times_read_back(name: str) -> None:
    body = bytes(range(256)) * 3 + b"tail"
    data = archive((name, body, 1_700_000_123), ("next", b"", 0))
    assert len(data) % tar.BLOCK == 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as read:
        first, second = read.getmembers()
        assert (first.name, first.size, first.mtime, first.mode, first.isreg()) == (name, len(body), 1_700_000_123,
                                                                                    0o644, True)
        assert read.extractfile(first).read() == body  # type: ignore[union-attr]
        assert (second.name, second.size) == ("next", 0)


def test_ustar_names_have_one_header_and_others_a_pax_header_first() -> None:
    assert len(tar.header("x" * 100, 5, 0)) == tar.BLOCK
    assert len(tar.header("x" * 101, 5, 0)) == 3 * tar.BLOCK  # pax header, its records, the member
    assert len(tar.header("é", 5, 0)) == 3 * tar.BLOCK


def test_a_size_past_ustar_travels_in_pax() -> None:
    size = 9 * 1024**3
    head = tar.header("big", size, 0)
    with tarfile.open(fileobj=io.BytesIO(head + bytes(tar.BLOCK)), mode="r|") as read:
        member = read.next()
        assert member is not None and member.size == size


def test_padding() -> None:
    assert [len(tar.padding(n)) for n in (0, 1, 511, 512, 513)] == [0, 511, 1, 0, 511]


def test_a_hot_batch_layout_writes_every_byte_of_its_unzeroed_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hot batch's runs are not zeroed when made (tiering.files.unfilled):
    the headers, the padding and the end blocks are written by the layout,
    the bodies by the reads. Made from a buffer of 0xff bytes here, the tar
    must still be byte for byte the one the same members make."""
    monkeypatch.setattr(batch, "unfilled", lambda size: bytearray(b"\xff" * size))
    sizes = [0, 1, 511, 512, 513, 70_000, 300_000, 700_000, 5]
    members = [Member(f"k{i}", meta(f"k{i}", size)) for i, size in enumerate(sizes)]
    members.insert(3, Member("gone", error=NoSuchKey(Key="gone")))
    layout = batch._Layout(members, now=1_700_000_000)
    assert len(layout.runs) > 1
    sent = b""
    for run in layout.runs:
        buffer, views = batch._Layout.fill(run)
        for view in views:
            if view is not None:
                view[:] = b"b" * len(view)
        sent += bytes(buffer)
    expected = b""
    for member in members:
        if member.error is not None:
            expected += tar.header(batch.ERRORS + member.key, 9, 1_700_000_000) + b"NoSuchKey" + tar.padding(9)
        else:
            size = member.meta.size  # type: ignore[union-attr]
            expected += tar.header(member.key, size, 1_700_000) + b"b" * size + tar.padding(size)
    assert sent == expected + tar.END


def meta(key: str, size: int) -> ObjectMeta:
    return ObjectMeta(bucket="b", key=key, size=size, etag="0" * 32, last_modified_ms=1_700_000_000, seq=1)
