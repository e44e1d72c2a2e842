"""The batch archive reader (tiering/model/archive.py) against tar files
written by the standard library and by the gateway's own writer."""

from __future__ import annotations

import io
import tarfile

import pytest

from gateway.s3 import tar
from tiering.model.archive import ERRORS, BadArchive, members


def written(entries: list[tuple[str, bytes]]) -> bytes:
    out = b"".join(tar.header(name, len(body), 0) + body + tar.padding(len(body)) for name, body in entries)
    return out + tar.END


def test_members_of_the_gateways_archive_in_order() -> None:
    long = "d/" + "x" * 150 + "/é.bin"  # past ustar's 100 bytes, and not ASCII: a pax path
    entries = [("a/0.bin", b"zero"), (long, b"long" * 300), ("empty", b""), (ERRORS + "gone", b"NoSuchKey")]
    assert [(n, bytes(b)) for n, b in members(written(entries))] == entries


def test_members_of_a_standard_pax_tar() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, body in (("k1", b"one"), ("ü/" + "y" * 120, b"two" * 200)):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    assert [(n, bytes(b)) for n, b in members(buffer.getvalue())] == [("k1", b"one"), ("ü/" + "y" * 120, b"two" * 200)]


@pytest.mark.parametrize("cut", [0, 100, 512, 700, 1024])
def test_an_archive_cut_short_is_refused(cut: int) -> None:
    data = written([("a", b"x" * 600)])
    with pytest.raises(BadArchive):
        list(members(data[:cut]))


def test_a_link_member_is_refused() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("link")
        info.type = tarfile.SYMTYPE
        info.linkname = "elsewhere"
        archive.addfile(info)
    with pytest.raises(BadArchive):
        list(members(buffer.getvalue()))
