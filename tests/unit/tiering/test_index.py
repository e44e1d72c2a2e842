"""The index's listing against a brute-force model of S3's listing rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiering.errors import (
    BucketNotEmpty,
    ConditionalConflict,
    NoSuchBucket,
    NoSuchKey,
    PreconditionFailed,
)
from tiering.index.db import Index, successor
from tiering.index.room import MEMTABLE_BYTES
from tiering.meta import BucketInfo, Chunk, ObjectMeta, Part, Upload
from tiering.model.conditions import WriteConditions


def meta(key: str, bucket: str = "bkt", size: int = 1) -> ObjectMeta:
    return ObjectMeta(bucket, key, size, "e" * 32, 1_700_000_000_000, 0, chunks=(Chunk(size, "f" + key),))


@pytest.fixture
def index(tmp_path: Path):
    idx = Index(tmp_path / "index")
    idx.create_bucket(BucketInfo("bkt", 1))
    yield idx
    idx.close()


def model_page(keys, prefix, delimiter, marker, max_keys):
    """S3's rules, computed over the whole sorted key list."""
    entries = []  # (sort key, kind, value)
    seen = set()
    for key in sorted(keys):
        if not key.startswith(prefix):
            continue
        cut = key.find(delimiter, len(prefix)) if delimiter else -1
        if cut >= 0:
            common = key[: cut + len(delimiter)]
            if common not in seen:
                seen.add(common)
                entries.append((common, "p"))
        else:
            entries.append((key, "k"))
    entries = [e for e in entries if e[0] > marker]
    page = entries[:max_keys]
    return (
        [v for v, kind in page if kind == "k"],
        [v for v, kind in page if kind == "p"],
        len(entries) > max_keys,
    )


def walk(index, prefix, delimiter, max_keys):
    """All pages, following ``last`` as the marker, as clients do."""
    keys, prefixes, marker = [], [], ""
    for _ in range(10_000):
        page = index.list_objects("bkt", prefix, delimiter, marker, max_keys)
        keys += [e.key for e in page.contents]
        prefixes += page.prefixes
        if not page.truncated:
            return keys, prefixes
        marker = page.last
    raise AssertionError("listing did not terminate")


KEYS = st.lists(st.text(alphabet="ab/._é\U0001f600", min_size=1, max_size=8), max_size=40, unique=True)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(keys=KEYS, prefix=st.sampled_from(["", "a", "a/", "b/"]), delimiter=st.sampled_from(["", "/", "//", "a/"]),
       marker=st.text(alphabet="ab/", max_size=3), max_keys=st.integers(0, 5))
def test_page_matches_model(tmp_path_factory, keys, prefix, delimiter, marker, max_keys) -> None:
    index = Index(tmp_path_factory.mktemp("idx") / "index")
    try:
        index.create_bucket(BucketInfo("bkt", 1))
        for key in keys:
            index.put_object(meta(key))
        page = index.list_objects("bkt", prefix, delimiter, marker, max_keys)
        want_keys, want_prefixes, truncated = model_page(keys, prefix, delimiter, marker, max_keys)
        assert [e.key for e in page.contents] == want_keys
        assert page.prefixes == want_prefixes
        assert page.truncated == truncated
        if max_keys:
            got = walk(index, prefix, delimiter, max_keys)
            full = model_page(keys, prefix, delimiter, "", 10**9)
            assert got == (full[0], full[1])
    finally:
        index.close()


def test_other_buckets_are_invisible(index: Index) -> None:
    index.create_bucket(BucketInfo("bkt2", 1))
    index.put_object(meta("x", "bkt2"))
    index.put_object(meta("y"))
    assert [e.key for e in index.list_objects("bkt").contents] == ["y"]
    assert [e.key for e in index.list_objects("bkt2").contents] == ["x"]


def test_put_returns_replaced_version_and_assigns_seq(index: Index) -> None:
    first, old = index.put_object(meta("k", size=1))
    assert old is None and first.seq > 0
    second, old = index.put_object(meta("k", size=2))
    assert old == first and second.seq > first.seq


def test_conditional_put(index: Index) -> None:
    """Conditions checked at commit failed because another write came first:
    409 ConditionalRequestConflict (404 for If-Match on a key deleted)."""
    with pytest.raises(NoSuchKey):
        index.put_object(meta("k"), conditions=WriteConditions(if_match="*"))
    index.put_object(meta("k"), conditions=WriteConditions(if_none_match=True))
    with pytest.raises(ConditionalConflict):
        index.put_object(meta("k"), conditions=WriteConditions(if_none_match=True))
    with pytest.raises(ConditionalConflict):
        index.put_object(meta("k"), conditions=WriteConditions(if_match='"nope"'))
    index.put_object(meta("k"), conditions=WriteConditions(if_match=f'"{"e" * 32}"'))
    with pytest.raises(PreconditionFailed):
        index.put_object(meta("k"), expect_etag="nope")


def test_conditional_delete(index: Index) -> None:
    with pytest.raises(NoSuchKey):
        index.delete_object("bkt", "k", WriteConditions(if_match="*"))
    index.put_object(meta("k"))
    with pytest.raises(PreconditionFailed):
        index.delete_object("bkt", "k", WriteConditions(if_match='"0000"'))
    assert index.get_object("bkt", "k") is not None
    assert index.delete_object("bkt", "k", WriteConditions(if_match="e" * 32)) is not None
    assert index.get_object("bkt", "k") is None


def test_retag_keeps_the_version_and_makes_a_new_record(index: Index) -> None:
    first, _ = index.put_object(meta("k"))
    tagged = index.retag("bkt", "k", {"a": "1"})
    assert tagged.tags == {"a": "1"} and tagged.seq > first.seq
    assert (tagged.etag, tagged.last_modified_ms, tagged.chunks) == (first.etag, first.last_modified_ms, first.chunks)
    assert index.get_object("bkt", "k") == tagged
    with pytest.raises(NoSuchKey):
        index.retag("bkt", "missing", {})


def test_bucket_lifecycle(index: Index) -> None:
    assert not index.create_bucket(BucketInfo("bkt", 2))
    index.put_object(meta("k"))
    with pytest.raises(BucketNotEmpty):
        index.delete_bucket("bkt")
    index.delete_object("bkt", "k")
    index.delete_bucket("bkt")
    with pytest.raises(NoSuchBucket):
        index.delete_bucket("bkt")


def test_open_upload_keeps_bucket_non_empty(index: Index) -> None:
    upload = Upload("u1", "bkt", "k", 1)
    index.create_upload(upload)
    with pytest.raises(BucketNotEmpty):
        index.delete_bucket("bkt")
    assert index.delete_upload(upload) == []
    index.delete_bucket("bkt")


def test_parts_replace_and_list_in_order(index: Index) -> None:
    upload = Upload("u1", "bkt", "k", 1)
    index.create_upload(upload)
    for n in (3, 1, 2):
        assert index.put_part(upload, Part(n, 5, "a" * 32, 1, (Chunk(5, f"c{n}"),))) is None
    replaced = index.put_part(upload, Part(2, 6, "b" * 32, 2, (Chunk(6, "c2b"),)))
    assert isinstance(replaced, Part) and replaced.chunks[0].file_id == "c2"
    assert [p.part_number for p in index.list_parts("u1")] == [1, 2, 3]
    assert [p.part_number for p in index.list_parts("u1", after=1, limit=1)] == [2]
    index.delete_upload(upload)
    assert index.put_part(upload, Part(4, 5, "a" * 32, 1, (Chunk(5, "c4"),))) is False


def test_state_survives_reopen(tmp_path: Path) -> None:
    index = Index(tmp_path / "i")
    index.create_bucket(BucketInfo("bkt", 1))
    written, _ = index.put_object(meta("k"))
    index.close()
    index = Index(tmp_path / "i")
    assert index.get_object("bkt", "k") == written
    again, _ = index.put_object(meta("k2"))
    assert again.seq > written.seq
    index.close()


@pytest.mark.parametrize("prefix", ["a/", "z", "é/", "a\U0010ffff"])
def test_successor_bounds_the_prefix(prefix: str) -> None:
    after = successor(prefix)
    assert after > prefix
    assert after > prefix + "\U0010ffff" * 3 or prefix.endswith("\U0010ffff")


def test_the_memory_table_is_bounded(index: Index) -> None:
    """RocksDB's write buffer is MEMTABLE_BYTES, not its default 64 MiB of
    anonymous memory: past it, the writes go to a new memory table (the
    full one is written out)."""
    for i in range((MEMTABLE_BYTES >> 20) + 4):
        index._db.put(b"zz-test-%d" % i, bytes(1 << 20))
    assert index._db.property_int_value("rocksdb.cur-size-active-mem-table") <= MEMTABLE_BYTES + (2 << 20)
