"""Every cache is bounded in bytes: filled past its bound through its own
API, it holds at most the bound, the oldest entries going first; the
registry reports each kind and shrinks them all under memory pressure."""

from __future__ import annotations

import gc
import weakref

import pytest

from tiering.index.record_cache import RecordCache
from tiering.memo import KINDS, MIN_BOUND, ByIdentity, Caches, Kept, default_bounds, weigh
from tiering.meta import Chunk, Extent, ObjectMeta

KiB = 1024


def _meta(i: int, chunks: int = 1) -> ObjectMeta:
    extents = tuple(Chunk(8 << 20, None, Extent(f"seg-{i:06d}", n << 23, 8 << 20, 8 << 20)) for n in range(chunks))
    return ObjectMeta("bkt", f"train/{i:08d}.jpg", 65536, "%032x" % i, 1_700_000_000_000, i, chunks=extents)


@pytest.fixture
def caches() -> Caches:
    registry = Caches()
    registry.configure({"records": 64 * KiB, "heads": 16 * KiB})
    return registry


def test_a_record_weighs_what_it_holds() -> None:
    one, many = weigh(_meta(1)), weigh(_meta(1, chunks=100))
    assert 800 < one < 4 * KiB  # about a kilobyte: the old per-entry estimate
    assert many > 30 * one  # an object of many extents weighs its extents (about 450 bytes each)


def test_a_cache_filled_past_its_bound_stays_under_it(caches: Caches) -> None:
    kept: Kept[int, ObjectMeta] = Kept("records", registry=caches)
    for i in range(1000):
        kept.put(i, _meta(i))
        assert kept.bytes <= 64 * KiB
    assert 0 < len(kept) < 1000
    assert kept.get(999) is not None and kept.get(0) is None  # the oldest went first
    assert kept.bytes == sum(kept._weigh(k, v) for k, v in kept.items.items())  # the count is exact


def test_an_entry_larger_than_the_bound_is_not_kept(caches: Caches) -> None:
    kept: Kept[int, ObjectMeta] = Kept("heads", registry=caches)
    assert not kept.put(1, _meta(1, chunks=1000))
    assert len(kept) == 0 and kept.bytes == 0


def test_replacing_and_dropping_keep_the_count(caches: Caches) -> None:
    kept: Kept[int, ObjectMeta] = Kept("records", entries=3, registry=caches)
    for i in range(5):
        kept.put(i, _meta(i))
    assert list(kept.items) == [2, 3, 4]  # and at most its entries
    kept.put(3, _meta(3, chunks=4))
    kept.pop(2)
    kept.pop(42)
    assert kept.bytes == weigh_pair(kept, 3) + weigh_pair(kept, 4)
    kept.clear()
    assert kept.bytes == 0 and not kept.items


def weigh_pair(kept: Kept[int, ObjectMeta], key: int) -> int:
    return kept._weigh(key, kept.items[key])


def test_the_registry_lists_each_kind_and_squeezes_them_all(caches: Caches) -> None:
    records: Kept[int, ObjectMeta] = Kept("records", registry=caches)
    more: Kept[int, ObjectMeta] = Kept("records", registry=caches)
    for i in range(200):
        records.put(i, _meta(i))
        more.put(i, _meta(i))
    stats = caches.stats()
    assert stats["records"]["caches"] == 2 and stats["records"]["bound"] == 64 * KiB
    assert stats["records"]["bytes"] == records.bytes + more.bytes <= 2 * 64 * KiB
    assert stats["heads"]["entries"] == 0  # configured, none alive
    caches.squeeze(0.25)
    assert records.bytes <= 16 * KiB and more.bytes <= 16 * KiB
    assert caches.stats()["records"]["bound"] == 16 * KiB
    caches.squeeze(1.0)
    assert records.bound == 64 * KiB
    del more
    gc.collect()
    assert caches.stats()["records"]["caches"] == 1  # a cache gone is forgotten


def test_by_identity_is_bounded_in_bytes(caches: Caches) -> None:
    memo: ByIdentity[ObjectMeta, bytes] = ByIdentity(0, "heads")
    memo._kept = Kept("heads", registry=caches)  # in the test's registry
    records = [_meta(i) for i in range(200)]
    for record in records * 2:  # kept from the second derivation on
        assert memo.get(record, lambda r: r.key.encode() * 10) == record.key.encode() * 10
    assert 0 < memo._kept.bytes <= 16 * KiB
    assert len(memo) < len(records)


def test_by_identity_keeps_no_record_alive(caches: Caches) -> None:
    """A value goes with its record (an overwritten version the record
    cache dropped), not when the bound pushes it out; the record itself
    is not kept alive by the memo."""
    memo: ByIdentity[ObjectMeta, bytes] = ByIdentity(0, "heads")
    memo._kept = Kept("heads", registry=caches)
    records = [_meta(i) for i in range(10)]
    for record in records * 2:
        memo.get(record, lambda r: r.key.encode())
    assert len(memo) == 10
    gone = weakref.ref(records[3])
    del records[:5], record
    gc.collect()
    assert gone() is None  # the memo held it weakly
    kept = records[0]
    assert memo.get(kept, lambda r: b"derived again") == kept.key.encode()  # a hit stays a hit
    new = _meta(99)
    memo.get(new, lambda r: b"x")
    memo.get(new, lambda r: b"x")  # a store drops the entries of records gone
    assert len(memo) == 6
    assert memo._kept.bytes == sum(memo._kept._sizes.values())


def test_by_identity_weighs_a_value_by_what_it_adds(caches: Caches) -> None:
    """A derived value made of its record's own strings (a mounted object's
    ObjectMeta) is weighed by the weigher it is given, not walked whole."""
    weighed: list[bytes] = []

    def shell(value: bytes) -> int:
        weighed.append(value)
        return 100

    memo: ByIdentity[ObjectMeta, bytes] = ByIdentity(0, "heads", shell)
    memo._kept = Kept("heads", registry=caches, weigh=memo._weigh_derived)
    records = [_meta(i) for i in range(3)]
    for record in records * 3:
        memo.get(record, lambda r: r.key.encode() * 1000)
    assert len(weighed) == 3  # once each, when kept
    every = memo._kept.bytes // 3
    assert 100 < every < 1000  # the value's 100, its reference and entry; not its 17,000 bytes


def test_by_identity_holds_what_takes_no_weak_reference(caches: Caches) -> None:
    memo: ByIdentity[tuple[str, int], str] = ByIdentity(0, "memos")
    memo._kept = Kept("memos", registry=caches)
    record = ("key", 1)  # a tuple takes no weak reference
    assert memo.get(record, lambda r: "derived once") == "derived once"
    assert memo.get(record, lambda r: "value") == "value"
    assert memo.get(record, lambda r: "derived again") == "value"


def test_by_identity_keeps_a_value_from_its_second_derivation(caches: Caches) -> None:
    """An epoch reads each object once: a record derived once is only
    remembered, and its value kept when it is derived again."""
    memo: ByIdentity[ObjectMeta, bytes] = ByIdentity(0, "heads")
    memo._kept = Kept("heads", registry=caches)
    once, twice = _meta(1), _meta(2)
    derived: list[str] = []

    def derive(record: ObjectMeta) -> bytes:
        derived.append(record.key)
        return record.key.encode()

    memo.get(once, derive)
    memo.get(twice, derive)
    assert len(memo) == 0 and memo._kept.bytes == 0
    assert memo.get(twice, derive) == twice.key.encode()
    assert len(memo) == 1
    assert memo.get(twice, derive) == twice.key.encode()  # kept: not derived again
    assert derived == [once.key, twice.key, twice.key]


def test_the_record_cache_is_bounded_in_bytes(caches: Caches, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tiering.memo.CACHES", caches)
    cache = RecordCache(100_000)
    for i in range(2000):
        cache.keep(b"O" + i.to_bytes(4, "big"), _meta(i), cache.commits)
        cache.hold(b"N" + i.to_bytes(4, "big"), _meta(i))
    assert cache._kept.bytes <= 64 * KiB
    assert 0 < len(cache) < 4000
    assert cache.get(b"N" + (1999).to_bytes(4, "big")) is not None


def test_default_bounds_are_shares_of_memory_capped() -> None:
    small, large = default_bounds(512 << 20), default_bounds(1 << 40)
    assert set(small) == set(KINDS)
    assert small["records"] == 8 << 20 and small["heads"] == MIN_BOUND
    assert large["records"] == KINDS["records"][1]  # the cap
