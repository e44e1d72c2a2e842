"""The index's object versions: Enabled and Suspended writes and deletes,
delete markers, promotion, ListObjectVersions against a model (property
test), and recovery's arrangement of versions (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiering.index.db import Index
from tiering.maintenance.recover import _arrange
from tiering.meta import BucketInfo, Chunk, ObjectMeta
from tiering.model.versions import ENABLED, SUSPENDED


def meta(key: str, body: str = "x", bucket: str = "bkt") -> ObjectMeta:
    return ObjectMeta(bucket=bucket, key=key, size=len(body), etag=body, last_modified_ms=0, seq=0,
                      chunks=(Chunk(len(body), file_id=f"f-{key}-{body}"),))


def open_index(path: Path) -> Index:
    index = Index(path / "index")
    index.create_bucket(BucketInfo("bkt", 0))
    return index


@pytest.fixture
def index(tmp_path: Path):
    idx = open_index(tmp_path)
    yield idx
    idx.close()


def listed(index: Index, **kw: object) -> list[tuple[str, str, bool, bool]]:
    page = index.list_versions("bkt", **kw)  # type: ignore[arg-type]
    return [(e.key, e.version, e.latest, e.marker) for e in page.entries]


def test_enabled_keeps_versions_and_deletes_put_markers(index: Index) -> None:
    index.put_object(meta("k", "a"))  # before versioning: the null version
    index.set_versioning("bkt", ENABLED)
    v1, gone = index.put_object(meta("k", "b"))
    assert gone is None and v1.version is not None and v1.vseq == v1.seq
    deletion = index.delete_object("bkt", "k")
    assert deletion.marker and not deletion.gone
    assert index.get_object("bkt", "k") is None
    assert index.latest_marker("bkt", "k") is not None
    assert listed(index) == [("k", deletion.version, True, True), ("k", v1.version, False, False),
                             ("k", "null", False, False)]
    # Deleting the marker brings v1 back as the current version.
    again = index.delete_object("bkt", "k", version=deletion.version)
    assert again.marker and index.get_object("bkt", "k").version == v1.version  # type: ignore[union-attr]
    # Deleting the current version by id promotes the null version.
    index.delete_object("bkt", "k", version=v1.version)
    assert index.get_object("bkt", "k").etag == "a"  # type: ignore[union-attr]
    assert index.delete_object("bkt", "k", version="00000000000000ff").gone == ()
    assert index.has_objects("bkt")


def test_suspended_replaces_the_null_version_only(index: Index) -> None:
    index.set_versioning("bkt", ENABLED)
    v1, _ = index.put_object(meta("k", "a"))
    index.set_versioning("bkt", SUSPENDED)
    n1, gone = index.put_object(meta("k", "b"))
    assert n1.version == "null" and gone is None
    n2, gone = index.put_object(meta("k", "c"))
    assert gone is not None and gone.etag == "b"  # the null version replaced
    marker = index.delete_object("bkt", "k")
    assert marker.version == "null" and [m.etag for m in marker.gone] == ["c"]
    assert listed(index) == [("k", "null", True, True), ("k", v1.version, False, False)]


def test_flush_queue_finds_a_version_that_stopped_being_current(index: Index) -> None:
    index.set_versioning("bkt", ENABLED)
    v1, _ = index.put_object(meta("k", "a"))
    index.put_object(meta("k", "b"))
    queued = {item.meta.etag for item in index.flush_queue(10) if item.meta is not None}
    assert queued == {"a", "b"}  # v1 is noncurrent and still gets flushed
    assert index.find_vseq("bkt", "k", v1.vseq)[1].etag == "a"  # type: ignore[index]
    assert {f"f-k-{b}" for b in "ab"} <= index.referenced_files()


OPS = st.lists(st.tuples(st.sampled_from(["put", "delete", "delete-version", "enable", "suspend"]),
                         st.sampled_from(["a", "a/b", "a/c", "b", "c/d/e"]), st.integers(0, 5)), max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS, st.integers(1, 4), st.sampled_from(["", "/"]), st.sampled_from(["", "a", "c/"]))
def test_list_versions_pages_match_a_model(tmp_path_factory, ops, size, delimiter, prefix) -> None:  # type: ignore[no-untyped-def]
    """Whatever happened to the keys, a listing paged by any size with its
    markers is the whole listing, which matches a model of S3's rules."""
    index = open_index(tmp_path_factory.mktemp("v"))
    model: dict[str, list[tuple[str, bool]]] = {}  # key -> [(version, marker)], newest first
    status = None
    try:
        for n, (op, key, pick) in enumerate(ops):
            if op in ("enable", "suspend"):
                status = ENABLED if op == "enable" else SUSPENDED
                index.set_versioning("bkt", status)
            elif op == "put":
                written, _ = index.put_object(meta(key, str(n)))
                rows = model.setdefault(key, [])
                if status != ENABLED:
                    rows[:] = [r for r in rows if r[0] != "null"]
                rows.insert(0, (written.version or "null", False))
            elif op == "delete":
                deletion = index.delete_object("bkt", key)
                if status is None:
                    model.pop(key, None)
                else:
                    rows = model.setdefault(key, [])
                    if status == SUSPENDED:
                        rows[:] = [r for r in rows if r[0] != "null"]
                    rows.insert(0, (deletion.version, True))
            elif model.get(key):
                version = model[key][pick % len(model[key])][0]
                index.delete_object("bkt", key, version=version)
                model[key] = [r for r in model[key] if r[0] != version]
            if key in model and not model[key]:
                del model[key]
        expected: list[tuple[str, str, bool, bool]] = []
        commons: list[str] = []
        for key in sorted(model):
            if not key.startswith(prefix):
                continue
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            if cut >= 0:
                common = key[: cut + 1]
                if common not in commons:
                    commons.append(common)
                continue
            expected += [(key, v, i == 0, m) for i, (v, m) in enumerate(model[key])]
        assert listed(index, prefix=prefix, delimiter=delimiter) == expected
        assert index.list_versions("bkt", prefix, delimiter).prefixes == commons
        seen: list[tuple[str, str, bool, bool]] = []
        key_marker = version_marker = ""
        for _ in range(200):
            page = index.list_versions("bkt", prefix, delimiter, key_marker, version_marker, size)
            seen += [(e.key, e.version, e.latest, e.marker) for e in page.entries]
            if not page.truncated:
                break
            key_marker, version_marker = page.next_key or "", page.next_version or ""
        assert seen == expected
    finally:
        index.close()


def test_recovery_keeps_the_newest_null_and_makes_the_newest_current() -> None:
    def version(vseq: int, version: str | None, marker: bool = False) -> ObjectMeta:
        return ObjectMeta("b", "k", 0, "", 0, vseq, version=version, vseq=vseq, delete_marker=marker)

    current, noncurrent, lost = _arrange({("b", "k"): [version(3, None), version(5, "null"), version(7, "v7"),
                                                       version(9, "v9", marker=True)]}, ())
    assert current == [] and [m.vseq for m in noncurrent] == [9, 7, 5] and lost == 0
    current, noncurrent, _ = _arrange({("b", "k"): [version(2, "v2"), version(4, "v4")]}, ())
    assert [m.vseq for m in current] == [4] and [m.vseq for m in noncurrent] == [2]
