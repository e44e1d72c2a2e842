"""The object service without HTTP: durability order, cleanup, verification."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from packer.ranges import ByteRange
from tiering.capacity import LocalDirStore
from tiering.errors import (
    BadDigest,
    IncompleteBody,
    NoSuchKey,
    PayloadHashMismatch,
    PreconditionFailed,
    SlowDown,
)
from tiering.maintenance import fsck
from tiering.model.conditions import WriteConditions
from tiering.model.inputs import Integrity, NewObject
from tiering.model.uploads import MIN_PART_SIZE, ChosenPart
from tiering.node import Node
from tiering.reads.plan import SMALL_READ, Read
from tiering.settings import TierSettings


async def body(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


_loop: asyncio.AbstractEventLoop | None = None


@pytest.fixture(autouse=True)
def event_loop():
    """One loop per test: the service's background tasks live across calls."""
    global _loop
    _loop = asyncio.new_event_loop()
    yield _loop
    _loop.close()
    _loop = None


def run(coro):
    assert _loop is not None
    return _loop.run_until_complete(coro)


def new_service(root: Path, hot_budget: int = 1 << 30, **settings) -> Node:
    """A service on ``root`` whose capacity tier is a directory beside it."""
    capacity = LocalDirStore(root.parent / f"{root.name}-capacity")
    settings.setdefault("flush_delay", 3600.0)  # flush only when a test asks
    return Node(root, TierSettings(hot_size=hot_budget, **settings), capacity)


def close(svc: Node) -> None:
    run(svc.close())


def crash(svc: Node) -> None:
    """Stop without the clean shutdown: no marker, nothing flushed."""
    run(svc.tiers.stop())
    svc.index.close()


@pytest.fixture
def service(tmp_path: Path):
    svc = new_service(tmp_path)
    run(svc.start())
    run(svc.objects.create_bucket("bkt"))
    yield svc
    close(svc)
    assert fsck.check(tmp_path) == []


def hot_files(root: Path) -> list[str]:
    """Staged files (the hot tier's cache tree and marker files excluded)."""
    return sorted(p.name for p in (root / "hot").glob("??/*") if p.is_file())


async def put(svc: Node, key: str, data: bytes, **integrity) -> object:
    return await svc.objects.put("bkt", key, body(data), NewObject(), Integrity(expected_size=len(data), **integrity))


def test_put_read_range_and_overwrite_drops_old_file(service: Node, tmp_path: Path) -> None:
    async def go():
        first = await put(service, "k", b"0123456789")
        assert first.etag == hashlib.md5(b"0123456789").hexdigest()
        assert await service.objects.read_all(first, ByteRange(2, 5)) == b"234"
        files_before = hot_files(tmp_path)
        second = await put(service, "k", b"abc")
        assert await service.objects.read_all(await service.objects.head("bkt", "k")) == b"abc"
        assert second.seq > first.seq
        assert len(hot_files(tmp_path)) == len(files_before) == 1
        assert hot_files(tmp_path) != files_before

    run(go())


def test_large_body_in_many_pieces(service: Node) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    pieces = [data[i : i + 65536] for i in range(0, len(data), 65536)]

    async def go():
        meta = await service.objects.put("bkt", "big", body(*pieces), NewObject(), Integrity(expected_size=len(data)))
        assert await service.objects.read_all(meta) == data

    run(go())


@pytest.mark.parametrize(
    "integrity, error",
    [
        (dict(content_md5=base64.b64encode(b"x" * 16).decode()), BadDigest),
        (dict(checksum_algorithm="CRC32", checksum_value="AAAAAA=="), BadDigest),
        (dict(payload_sha256="0" * 64), PayloadHashMismatch),
    ],
)
def test_failed_verification_leaves_nothing(service: Node, tmp_path: Path, integrity, error) -> None:
    async def go():
        await put(service, "k", b"old")
        with pytest.raises(error):
            await put(service, "k", b"new", **integrity)
        assert await service.objects.read_all(await service.objects.head("bkt", "k")) == b"old"

    run(go())
    assert len(hot_files(tmp_path)) == 1


def test_short_body_is_incomplete(service: Node, tmp_path: Path) -> None:
    async def go():
        with pytest.raises(IncompleteBody):
            await service.objects.put("bkt", "k", body(b"abc"), NewObject(), Integrity(expected_size=10))
        with pytest.raises(NoSuchKey):
            await service.objects.head("bkt", "k")

    run(go())
    assert hot_files(tmp_path) == []


def test_body_error_midway_leaves_nothing(service: Node, tmp_path: Path) -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"x" * 2_000_000
        raise ConnectionResetError("client went away")

    async def go():
        with pytest.raises(ConnectionResetError):
            await service.objects.put("bkt", "k", failing(), NewObject(), Integrity())

    run(go())
    assert hot_files(tmp_path) == []


def test_budget_refuses_with_slowdown(tmp_path: Path) -> None:
    svc = new_service(tmp_path, 100)
    try:
        async def go():
            await svc.start()
            await svc.objects.create_bucket("bkt")
            with pytest.raises(SlowDown):
                await svc.objects.put("bkt", "k", body(b"x" * 200), NewObject(), Integrity(expected_size=200))

        run(go())
    finally:
        close(svc)


def test_if_none_match_star(service: Node) -> None:
    async def go():
        once = WriteConditions(if_none_match=True)
        await service.objects.put("bkt", "k", body(b"a"), NewObject(), Integrity(), once)
        with pytest.raises(PreconditionFailed):
            await service.objects.put("bkt", "k", body(b"b"), NewObject(), Integrity(), once)

    run(go())


def test_sweep_removes_orphans_after_crash(tmp_path: Path) -> None:
    svc = new_service(tmp_path, 1 << 30)
    run(svc.start())
    run(svc.objects.create_bucket("bkt"))
    run(put(svc, "k", b"kept"))
    # A write that crashed before its index commit leaves a file behind.
    orphan = svc.hot.path_of("0000000000000000deadbeef")
    orphan.write_bytes(b"junk")
    crash(svc)  # the clean-shutdown marker is never written
    assert any("referenced by nothing" in p for p in fsck.check(tmp_path))
    svc = new_service(tmp_path, 1 << 30)
    run(svc.start())
    assert not orphan.exists()
    assert svc.hot.used == 4
    assert run(svc.objects.read_all(run(svc.objects.head("bkt", "k")))) == b"kept"
    close(svc)
    assert fsck.check(tmp_path) == []


def test_fsck_reports_missing_and_resized_files(service: Node, tmp_path: Path) -> None:
    meta = run(put(service, "k", b"abc"))
    path = service.hot.path_of(meta.chunks[0].file_id)
    path.write_bytes(b"abcd")
    close(service)
    assert any("has 4 bytes" in p for p in fsck.check(tmp_path))
    path.unlink()
    assert any("is missing" in p for p in fsck.check(tmp_path))
    path.write_bytes(b"abc")  # restore, so the fixture's final check passes
    service.index = type(service.index)(tmp_path / "index")


def test_multipart_complete_uses_part_files_and_drops_unused(service: Node, tmp_path: Path) -> None:
    part1 = os.urandom(MIN_PART_SIZE)

    async def go():
        upload = await service.objects.create_upload("bkt", "mp", NewObject())
        p1 = await service.objects.upload_part("bkt", "mp", upload.upload_id, 1, body(part1), Integrity())
        p2 = await service.objects.upload_part("bkt", "mp", upload.upload_id, 2, body(b"tail"), Integrity())
        await service.objects.upload_part("bkt", "mp", upload.upload_id, 3, body(b"unused"), Integrity())
        meta = await service.objects.complete_upload(
            "bkt", "mp", upload.upload_id, [ChosenPart(1, p1.etag), ChosenPart(2, p2.etag)]
        )
        want = hashlib.md5(bytes.fromhex(p1.etag) + bytes.fromhex(p2.etag)).hexdigest() + "-2"
        assert meta.etag == want
        assert await service.objects.read_all(meta) == part1 + b"tail"
        assert await service.objects.read_all(meta, ByteRange(MIN_PART_SIZE - 2, MIN_PART_SIZE + 2)) == part1[-2:] + b"ta"

    run(go())
    assert len(hot_files(tmp_path)) == 2


def test_complete_racing_a_flush_of_its_parts_uses_the_flushed_extents(service: Node) -> None:
    """Complete reads the parts, then commits; a flush committing those parts
    in between renames their staged files into the cache. The object must
    point at the extents, not at files that no longer exist."""
    part1 = os.urandom(MIN_PART_SIZE)
    real_list_parts = service.index.list_parts
    flushed = []

    def list_parts_then_flush(upload_id: str, *args: object) -> object:
        parts = real_list_parts(upload_id, *args)
        if not flushed:  # the flush lands right after Complete read the parts
            flushed.append(asyncio.run_coroutine_threadsafe(service.tiers.flush(), _loop).result())
        return parts

    async def go():
        upload = await service.objects.create_upload("bkt", "race", NewObject())
        p1 = await service.objects.upload_part("bkt", "race", upload.upload_id, 1, body(part1), Integrity())
        p2 = await service.objects.upload_part("bkt", "race", upload.upload_id, 2, body(b"end"), Integrity())
        service.index.list_parts = list_parts_then_flush  # type: ignore[method-assign]
        meta = await service.objects.complete_upload(
            "bkt", "race", upload.upload_id, [ChosenPart(1, p1.etag), ChosenPart(2, p2.etag)]
        )
        assert flushed and all(c.file_id is None and c.extent is not None for c in meta.chunks)
        assert await service.objects.read_all(meta) == part1 + b"end"
        again = await service.objects.head("bkt", "race")
        assert again.chunks == meta.chunks

    run(go())


def test_metadata_rewrite_racing_a_flush_keeps_the_flushed_extents(service: Node) -> None:
    async def go():
        source = await put(service, "m", b"metadata only")
        await service.tiers.flush()  # the object now has an extent; `source` still names the file
        meta = await service.objects.rewrite_meta(source, NewObject("text/plain"))
        assert meta.chunks[0].extent is not None and meta.chunks[0].file_id is None
        assert meta.content_type == "text/plain"
        assert await service.objects.read_all(meta) == b"metadata only"

    run(go())


def test_clean_restart_skips_the_sweep_and_keeps_the_byte_count(tmp_path: Path, monkeypatch) -> None:
    svc = new_service(tmp_path, 1 << 30)
    run(svc.start())
    run(svc.objects.create_bucket("bkt"))
    run(put(svc, "k", b"12345"))
    close(svc)
    svc = new_service(tmp_path, 1 << 30)
    monkeypatch.setattr(svc.hot, "sweep", lambda referenced: pytest.fail("swept after a clean shutdown"))
    run(svc.start())
    assert svc.hot.used == 5
    # The marker is consumed: a crash now must lead to a sweep next time.
    crash(svc)
    svc = new_service(tmp_path, 1 << 30)
    swept = []
    monkeypatch.setattr(svc.hot, "sweep", lambda referenced: swept.append(referenced))
    run(svc.start())
    assert len(swept) == 1 and len(swept[0]) == 1
    close(svc)


def test_read_in_flight_survives_a_delete(service: Node) -> None:
    data = os.urandom(3 * 1024 * 1024)

    async def go():
        meta = await put(service, "big", data)
        stream = service.objects.stream(meta, ByteRange(0, len(data)))
        first = await stream.__anext__()
        await service.objects.delete("bkt", "big")
        rest = [piece async for piece in stream]
        assert first + b"".join(rest) == data

    run(go())


def test_read_answers_small_hot_bodies_inline(service: Node) -> None:
    async def go():
        await put(service, "small", b"tiny")
        await put(service, "large", b"x" * (SMALL_READ + 1))
        small = await service.objects.read(Read("bkt", "small"))
        assert (small.status, small.body, small.tally.hot) == (200, b"tiny", 4)
        large = await service.objects.read(Read("bkt", "large"))
        assert not isinstance(large.body, bytes)  # streamed
        assert b"".join([block async for block in large.body]) == b"x" * (SMALL_READ + 1)
        assert large.tally.hot == SMALL_READ + 1
        with pytest.raises(NoSuchKey):
            await service.objects.read(Read("bkt", "missing"))

    run(go())


def test_tags_set_on_a_staged_object_reach_its_manifest(service: Node, tmp_path: Path) -> None:
    """Retagging a staged object makes a new record of the same files; the
    flush then writes the tagged version's manifest, and the index, the
    footers (as recovery reads them) and the files agree."""
    async def go():
        first = await put(service, "k", b"tagged bytes")
        tagged = await service.objects.retag("bkt", "k", {"a": "1"})
        assert tagged.staged and tagged.chunks == first.chunks and tagged.seq > first.seq
        await service.tiers.flush()
        flushed = await service.objects.head("bkt", "k")
        assert flushed.tags == {"a": "1"} and not flushed.staged and flushed.manifest is not None
        assert await service.objects.read_all(flushed) == b"tagged bytes"
        assert (await service.objects.retag("bkt", "k", {})).tags == {}
        await service.tiers.flush()
        assert (await service.objects.tags("bkt", "k")) == {}

    run(go())
