"""The hot tier's budget: staged bytes are never evicted, cached extents
go least recently used first, between the watermarks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiering.errors import SlowDown
from tiering.hot.tier import HotTier
from tiering.model.digests import Digests


def test_cache_evicts_least_recently_used_down_to_the_low_watermark(tmp_path: Path) -> None:
    hot = HotTier(tmp_path, budget=1000, high=0.9, low=0.5)
    for name in "abcdefgh":
        assert hot.fill(name, b"x" * 100)
    assert hot.cached == 800
    assert hot.read_cached("a", 100) is not None  # "a" is now the most recent
    hot.fill("i", b"x" * 100)  # 900 = high: still fits
    hot.fill("j", b"x" * 100)  # past high: evict to make room
    assert hot.cached <= 900
    assert hot.read_cached("a", 100) is not None, "recently read, kept"
    assert hot.read_cached("b", 100) is None, "least recently used, evicted first"
    hot.evict()
    assert hot.used <= 500


def test_staged_bytes_are_never_evicted_and_bound_new_writes(tmp_path: Path) -> None:
    hot = HotTier(tmp_path, budget=1000)
    for name in "abc":
        hot.fill(name, b"c" * 100)
    assert hot.reserve(700)
    writer = hot.writer(part_size=256, digests=Digests(), reserved=700)
    writer.write(b"s" * 700)
    chunks = writer.finish()
    assert [c.size for c in chunks] == [256, 256, 188]
    assert hot.staged == 700 and hot.reserved == 0
    hot.evict(0)
    assert hot.cached == 0 and hot.staged == 700
    assert not hot.reserve(400), "staged data and this write would pass the budget"
    writer = hot.writer(part_size=256, digests=Digests())
    with pytest.raises(SlowDown):
        writer.write(b"t" * 400)  # an unannounced body longer than the room left
    writer.abort()
    assert hot.staged == 700


def test_removing_staged_files_twice_counts_them_once(tmp_path: Path) -> None:
    """A staged file already gone (removed by an earlier forget) is passed
    over: the model test found the second removal raising."""
    hot = HotTier(tmp_path, budget=1000)
    assert hot.reserve(300)
    writer = hot.writer(part_size=100, digests=Digests(), reserved=300)
    writer.write(b"s" * 300)
    chunks = writer.finish()
    hot.remove(chunks[:1])
    assert hot.staged == 200
    hot.remove(chunks)
    assert hot.staged == 0


def test_torn_cache_file_is_a_miss(tmp_path: Path) -> None:
    hot = HotTier(tmp_path, budget=1000)
    hot.fill("seg-10-20", b"y" * 32)
    hot.cache_path("seg-10-20").write_bytes(b"y" * 5)  # what a crash can leave
    assert hot.read_cached("seg-10-20", 32) is None
    assert not hot.cache_path("seg-10-20").exists()


def test_cache_survives_a_process_crash_but_not_a_reboot(tmp_path: Path, monkeypatch) -> None:
    hot = HotTier(tmp_path, budget=1000)
    hot.resume(set)  # first start records the boot id
    hot.fill("kept", b"z" * 10)
    again = HotTier(tmp_path, budget=1000)  # no clean-shutdown marker: a crash
    again.resume(set)
    assert again.read_cached("kept", 10) == b"z" * 10
    monkeypatch.setattr("tiering.hot.restart._boot_id", lambda: "another boot")
    rebooted = HotTier(tmp_path, budget=1000)
    rebooted.resume(set)
    assert rebooted.read_cached("kept", 10) is None
    assert rebooted.cached == 0


def test_pinned_files_are_never_evicted_and_count_against_the_budget(tmp_path: Path) -> None:
    hot = HotTier(tmp_path, budget=1000, high=0.9, low=0.5)
    assert hot.fill("p1", b"p" * 300, pin=True)
    assert hot.fill("c1", b"c" * 300)
    assert (hot.pinned, hot.cached) == (300, 600)
    assert hot.evict(0) == 300, "only the unpinned file goes"
    assert hot.read_cached("p1", 300) == b"p" * 300
    assert hot.fill("p2", b"p" * 500, pin=True)
    assert not hot.fill("p3", b"p" * 200, pin=True), "pinned data may not pass the high watermark"
    assert hot.staging_room() == 200 and not hot.reserve(201), "writes get what pins leave"
    assert hot.unpin(["p1", "missing"]) == 300
    assert hot.pinned == 500 and hot.evict(0) == 300, "unpinned files are evictable again"


def test_pin_keeps_across_rename_and_drop_can_spare_pinned_files(tmp_path: Path) -> None:
    hot = HotTier(tmp_path, budget=1000)
    hot.fill("old", b"x" * 100)
    hot.fill("other", b"y" * 50)
    assert hot.pin(["old", "not-cached"]) == 100
    hot.rename_cached("old", "new")
    assert hot.pinned == 100 and hot.is_cached("new") and not hot.is_cached("old")
    assert hot.drop_cached(["new", "other"], keep_pinned=True) == (50, 100)
    assert hot.is_cached("new") and not hot.is_cached("other")
    assert hot.drop_cached(["new"]) == (100, 0), "a superseded extent goes, pinned or not"
    assert (hot.pinned, hot.cached) == (0, 0)


def test_pins_are_forgotten_by_a_restart(tmp_path: Path) -> None:
    """The hot tier does not persist pins: the service pins again from the index."""
    hot = HotTier(tmp_path, budget=1000)
    hot.fill("p", b"x" * 100, pin=True)
    hot.mark_clean()
    again = HotTier(tmp_path, budget=1000)
    again.resume(set)
    assert again.cached == 100 and again.pinned == 0


def test_read_now_of_an_extent_not_cached_opens_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A piece this node does not hold (another node keeps it) is a miss from
    memory: no open() that fails, on the event loop, on every peer hit."""
    hot = HotTier(tmp_path, budget=10_000, high=0.9, low=0.5)
    assert hot.fill("here", b"x" * 100)
    opened: list[str] = []
    real = hot.open_files.read

    def counted(path: str, size: int, exact: bool, offset: int = 0) -> bytearray | None:
        opened.append(path)
        return real(path, size, exact, offset)

    monkeypatch.setattr(hot.open_files, "read", counted)
    assert hot.read_now([(None, "elsewhere", 100)]) is None
    assert hot.read_now([(None, "here", 100), (None, "elsewhere", 100)]) is None
    assert opened == []
    assert hot.read_now([(None, "here", 100)]) == b"x" * 100
    assert len(opened) == 1
