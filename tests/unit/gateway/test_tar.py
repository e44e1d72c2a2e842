"""gateway/tar.py: what it writes, read back by the standard library."""

from __future__ import annotations

import io
import tarfile

import pytest

from gateway import tar


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
