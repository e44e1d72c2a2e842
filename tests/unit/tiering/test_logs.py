"""Small cached pieces in shared log files (tiering/hot/logs.py): written
into one open file, read back at their offsets, evicted a log at a time,
read back after a restart, and never served wrong after a crash that cut
an append short."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest

from tiering import files as files_module
from tiering.hot import logs as logs_module
from tiering.hot.logs import KEY, LOG_MIN, Logs
from tiering.hot.restart import CLEAN
from tiering.hot.tier import HotTier
from tiering.maintenance import fsck

BUDGET = 64 * LOG_MIN  # logs of LOG_MIN bytes: pieces of up to LOG_MIN / 8 go to logs


def _tier(root: Path, budget: int = BUDGET) -> HotTier:
    hot = HotTier(root, budget=budget, logs=True)
    hot.resume(set)
    return hot


def _piece(i: int, size: int = 4000) -> bytes:
    return bytes([i % 251]) * size


def _files(hot: HotTier) -> list[Path]:
    return [p for p in hot.cache_root.rglob("*") if p.is_file()]


def _log_files(hot: HotTier) -> list[Path]:
    return sorted((hot.cache_root / logs_module.LOGS).iterdir())


def test_small_pieces_share_one_file_and_read_back(tmp_path: Path) -> None:
    hot = _tier(tmp_path)
    for i in range(40):
        assert hot.fill(f"p{i}", _piece(i))
    assert len(_files(hot)) == 1, "forty pieces, one log file"
    for i in range(40):
        assert hot.is_cached(f"p{i}")
        assert hot.read_cached(f"p{i}", 4000) == _piece(i)
        assert hot.read_now([(None, f"p{i}", 4000)]) == _piece(i)
        opened = hot.open_cached(f"p{i}", 4000)
        assert opened is not None and opened.offset > 0
        assert os.pread(opened.fd, 4000, opened.offset) == _piece(i)
        os.close(opened.fd)
    assert hot.read_now([(None, "p1", 4000), (None, "p2", 4000)]) == _piece(1) + _piece(2)
    # The bytes counted are the log's: every record with its head.
    assert hot.cached == os.path.getsize(_log_files(hot)[0])
    big = b"b" * (LOG_MIN // 8 + 1)
    assert hot.fill("big", big)  # larger pieces keep a file of their own
    assert hot.where(None, "big") == (hot.file_of(None, "big"), 0)
    assert len(_files(hot)) == 2


def _by_log(hot: HotTier, count: int) -> list[list[str]]:
    """The names p0.. p{count - 1} grouped by the log that holds them, oldest first."""
    assert hot.logs is not None
    groups: dict[int, list[str]] = {}
    for i in range(count):
        groups.setdefault(hot.logs.slots[f"p{i}"][0].number, []).append(f"p{i}")
    return [groups[n] for n in sorted(groups)]


def test_a_full_log_is_queued_and_evicted_whole(tmp_path: Path) -> None:
    hot = _tier(tmp_path)
    count = 3 * (LOG_MIN // 4100)
    for i in range(count):
        assert hot.fill(f"p{i}", _piece(i))
    groups = _by_log(hot, count)
    assert len(groups) == len(_log_files(hot)) == 3
    first = _log_files(hot)[0]
    size = os.path.getsize(first)
    freed = hot.evict(hot.cached - 1)  # a byte over: one log goes, the oldest
    assert freed == size == hot.evicted
    assert not first.exists()
    assert not any(hot.is_cached(name) for name in groups[0])
    assert all(hot.is_cached(name) for name in groups[1] + groups[2])


def test_a_hit_keeps_its_log_and_an_advisor_sees_through_logs(tmp_path: Path) -> None:
    hot = _tier(tmp_path)
    count = 3 * (LOG_MIN // 4100)
    for i in range(count):
        hot.fill(f"p{i}", _piece(i))
    groups = _by_log(hot, count)
    assert hot.touch_cached("p0")  # the oldest log is visited: SIEVE passes it over
    hot.evict(hot.cached - 1)
    assert hot.is_cached("p0") and not hot.is_cached(groups[1][0])

    class Wants:
        def wanted(self, name: str) -> bool:
            return name == "p0"

        def furthest(self) -> list[str]:
            return ["p0"]

    hot.advisor = Wants()
    hot.evict(hot.cached - 1)
    assert hot.is_cached("p0"), "a log holding a wanted piece goes last"


def test_dropping_every_piece_of_a_log_removes_it(tmp_path: Path) -> None:
    hot = _tier(tmp_path)
    for i in range(10):
        hot.fill(f"p{i}", _piece(i))
    dropped, kept = hot.drop_cached([f"p{i}" for i in range(9)])
    assert (dropped, kept) == (9 * 4000, 0)
    assert len(_log_files(hot)) == 1 and hot.cached > 0  # one piece left in it
    hot.drop_cached(["p9"])
    assert _log_files(hot) == [] and hot.cached == 0


def test_a_pinned_piece_leaves_its_log(tmp_path: Path) -> None:
    hot = _tier(tmp_path)
    for i in range(5):
        hot.fill(f"p{i}", _piece(i))
    assert hot.pin(["p2"]) == 4000
    assert hot.where(None, "p2") == (hot.file_of(None, "p2"), 0)
    assert hot.read_cached("p2", 4000) == _piece(2)
    hot.evict(0)
    assert hot.read_cached("p2", 4000) == _piece(2) and not hot.is_cached("p1")
    assert hot.pinned == 4000
    assert hot.fill("p9", _piece(9), pin=True)  # a pinned fill never goes to a log
    assert hot.where(None, "p9")[1] == 0


def test_compaction_renames_a_piece_in_place(tmp_path: Path) -> None:
    hot = _tier(tmp_path)
    hot.fill("old", _piece(1))
    hot.rename_cached("old", "new")
    assert not hot.is_cached("old") and hot.read_cached("new", 4000) == _piece(1)


def test_a_clean_restart_reads_the_logs_back(tmp_path: Path) -> None:
    hot = _tier(tmp_path)
    for i in range(60):
        hot.fill(f"p{i}", _piece(i))
    cached = hot.cached
    hot.mark_clean()
    again = _tier(tmp_path)
    assert again.cached == cached
    assert all(again.read_cached(f"p{i}", 4000) == _piece(i) for i in range(60))
    assert again.fill("later", _piece(99))  # appends go to a new log
    assert again.where(None, "later")[0] not in {str(p) for p in _log_files(hot)[:-1]}
    again.evict(0)
    assert again.cached == 0 and _log_files(again) == []


def test_a_crash_mid_append_serves_no_wrong_byte(tmp_path: Path) -> None:
    """A writer killed between its data and its head (or with its head half
    written): after the restart, that piece and what followed it in the
    log are misses; everything before reads right."""
    hot = _tier(tmp_path)
    for i in range(3):
        hot.fill(f"p{i}", _piece(i))
    logs = hot.logs
    assert logs is not None
    append, _ = logs.reserve("cut", _piece(7))
    start = append.offset + len(append.head)
    os.pwrite(append.fd, _piece(7), start)  # the data landed, the head never did
    hot.fill("after", _piece(8))  # the next writer's record is whole
    # No clean-shutdown marker: a crash. The same boot: logs are kept.
    again = _tier(tmp_path)
    assert [again.read_cached(f"p{i}", 4000) for i in range(3)] == [_piece(i) for i in range(3)]
    assert not again.is_cached("cut") and not again.is_cached("after")
    # A head torn half way is no record either.
    path, data_at = again.where(None, "p2")
    with open(path, "r+b") as f:
        f.seek(data_at - len("p2") - 10)  # inside p2's head
        f.write(b"\xff\xff")
    third = _tier(tmp_path)
    assert third.read_cached("p1", 4000) == _piece(1) and not third.is_cached("p2")


def _first_format_head(name: bytes, data: bytes) -> bytes:
    """A record head as the first logs wrote it: magic TSL1, zlib's CRC32."""
    fields = struct.pack("<4sIIH", b"TSL1", len(data), zlib.crc32(data), len(name))
    return fields + struct.pack("<I", zlib.crc32(name, zlib.crc32(fields))) + name


def test_records_of_the_first_format_still_read_back_and_check(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Logs written before records moved to CRC32C (a restart onto the new
    code in the same boot) are read back, served, and checked by fsck
    with the CRC they were written with; a new record in the same tier
    uses CRC32C."""
    monkeypatch.setattr(logs_module, "head", _first_format_head)
    hot = _tier(tmp_path)
    for i in range(3):
        hot.fill(f"p{i}", _piece(i))
    path, at = hot.where(None, "p0")
    with open(path, "rb") as f:
        f.seek(at - len("p0") - 18)
        assert f.read(4) == b"TSL1"
    hot.mark_clean()
    monkeypatch.undo()
    again = _tier(tmp_path)
    assert [again.read_cached(f"p{i}", 4000) for i in range(3)] == [_piece(i) for i in range(3)]
    assert again.logs is not None and again.logs.verify() == []
    assert again.fill("new", _piece(5))
    path, at = again.where(None, "new")
    with open(path, "rb") as f:
        f.seek(at - len("new") - 18)
        assert f.read(4) == b"TSL2"
    slot = again.logs.where("p1")
    assert slot is not None
    with open(slot[0], "r+b") as f:  # an old record gone bad is found by its own CRC
        f.seek(slot[1] + 100)
        f.write(b"\x00\x01")
    assert again.logs.verify() == [f"cache log {Path(slot[0]).name}: p1 fails its CRC"]


def test_a_new_boot_drops_the_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hot = _tier(tmp_path)
    hot.fill("p", _piece(1))
    monkeypatch.setattr("tiering.hot.restart._boot_id", lambda: "another boot")
    again = _tier(tmp_path)
    assert not again.is_cached("p") and _log_files(again) == [] and again.cached == 0


def test_fsck_checks_every_record(tmp_path: Path) -> None:
    logs = Logs(tmp_path / "logs", LOG_MIN)
    for i in range(3):
        append, _ = logs.reserve(f"p{i}", _piece(i))
        Logs.write_many([append], [_piece(i)])
        logs.publish(f"p{i}", append, 4000)
    assert logs.verify() == []
    slot = logs.where("p1")
    assert slot is not None
    with open(slot[0], "r+b") as f:
        f.seek(slot[1] + 100)
        f.write(b"\x00\x01")
    assert logs.verify() == [f"cache log {Path(slot[0]).name}: p1 fails its CRC"]


def test_fsck_of_a_data_dir_names_a_log_record_gone_bad(tmp_path: Path) -> None:
    hot = _tier(tmp_path / "hot")
    hot.fill("p", _piece(1))
    where = hot.where(None, "p")
    with open(where[0], "r+b") as f:
        f.seek(where[1])
        f.write(b"\x00\x00\x00")
    (tmp_path / "hot" / CLEAN).write_text("0")
    assert any("fails its CRC" in p for p in fsck.check(tmp_path)), fsck.check(tmp_path)
    assert KEY == "log:"


def test_a_batch_of_fills_is_one_write_a_log_and_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fill_many``, as the fills' writer hands a batch over: the small
    unpinned pieces land with one ``pwritev`` and one head ``pwrite`` for
    each log they fill; the rest are ``fill``'s, each with its outcome."""
    hot = _tier(tmp_path)
    assert hot.fill("known", _piece(1))
    writes: list[int] = []
    real = logs_module.pwritev_all
    monkeypatch.setattr(logs_module, "pwritev_all",
                        lambda fd, parts, offset: writes.append(len(parts)) or real(fd, parts, offset))
    per_log = LOG_MIN // 4100  # records of 4,000 bytes and a head that one log takes
    batch = [(f"p{i}", _piece(i), False) for i in range(per_log + 5)]  # past the open log's end
    big = b"b" * (LOG_MIN // 8 + 1)
    outcomes = hot.fill_many([*batch, ("known", _piece(1), False), ("big", big, False), ("kept", _piece(3), True)])
    assert outcomes == [True] * (len(batch) + 3)
    assert len(writes) == 2  # one run in the log that was open, one in the next
    assert sum(writes) == 2 * len(batch) - 2  # each run: its first data, then heads and data
    assert hot.reserved == 0 and not any(hot.is_filling(name) for name, _, _ in batch)
    assert all(hot.read_cached(f"p{i}", 4000) == _piece(i) for i in range(len(batch)))
    assert hot.read_cached("big", len(big)) == big and hot.where(None, "big")[1] == 0
    assert hot.where(None, "kept")[1] == 0  # pinned: a file of its own
    hot.mark_clean()
    again = _tier(tmp_path)
    assert all(again.read_cached(f"p{i}", 4000) == _piece(i) for i in range(len(batch)))
    assert again.cached == hot.cached


def test_a_batch_cut_short_before_its_first_head_is_no_record(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer killed after a batch's one ``pwritev`` (the later records'
    heads landed with it) and before the first head: after the restart,
    the whole batch is missing, nothing is read wrong, what came before
    it reads right."""
    hot = _tier(tmp_path)
    assert hot.fill("before", _piece(1))

    def killed(fd: int, data: bytes, offset: int) -> int:
        raise SystemExit("killed")  # what a SIGKILL leaves: nothing after this ran

    monkeypatch.setattr(logs_module.os, "pwrite", killed)
    with pytest.raises(SystemExit):
        hot._append_many([(f"p{i}", _piece(i)) for i in range(5)])
    monkeypatch.undo()
    again = _tier(tmp_path)  # no clean-shutdown marker: a crash, the same boot
    assert again.read_cached("before", 4000) == _piece(1)
    assert not any(again.is_cached(f"p{i}") for i in range(5))


def test_a_batch_the_disk_refuses_caches_none_and_the_next_goes_on(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC from a batch's write: each of its pieces gets the error (the
    fills' writer logs it and answers False), no room stays reserved, the
    log takes no more appends; the next batch writes to a new log."""
    hot = _tier(tmp_path)

    def full(fd: int, parts: object, offset: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(logs_module, "pwritev_all", full)
    outcomes = hot.fill_many([(f"p{i}", _piece(i), False) for i in range(3)])
    assert [type(o) for o in outcomes] == [OSError] * 3
    assert hot.reserved == 0 and not any(hot.is_cached(f"p{i}") or hot.is_filling(f"p{i}") for i in range(3))
    monkeypatch.undo()
    assert hot.fill_many([(f"p{i}", _piece(i), False) for i in range(3)]) == [True] * 3
    assert all(hot.read_cached(f"p{i}", 4000) == _piece(i) for i in range(3))
    assert [p.name for p in _log_files(hot)] == ["00000002"]  # the first, empty and sealed, went


def test_pwritev_all_writes_every_byte_when_the_kernel_takes_a_few(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    parts = [b"abc", b"", bytearray(b"defgh"), memoryview(b"ij"), b"k" * 3000]
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    real = os.pwritev
    calls: list[int] = []

    def few(fd: int, buffers: list[memoryview], offset: int) -> int:
        calls.append(len(buffers))
        return real(fd, [memoryview(b"".join(buffers))[:4]], offset)

    monkeypatch.setattr(files_module.os, "pwritev", few)
    files_module.pwritev_all(fd, parts, 10)
    monkeypatch.undo()
    assert os.pread(fd, 4000, 10) == b"".join(parts) and len(calls) == -(-3010 // 4)
    os.close(fd)
