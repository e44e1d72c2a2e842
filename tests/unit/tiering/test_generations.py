"""The shared table of write generations: what a writer's index write moves,
as a read worker's own mapping of the table sees it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiering.index.db import Index
from tiering.index.generations import Generations, _slot, slot_of
from tiering.index.keys import nkey, okey
from tiering.meta import BucketInfo, Chunk, MountedObject, ObjectMeta


def _meta(key: str, etag: str) -> ObjectMeta:
    return ObjectMeta("bkt", key, 1, etag, 1_700_000_000_000, 0, chunks=(Chunk(1, "f" + etag),))


@pytest.fixture
def shared(tmp_path: Path):  # type: ignore[no-untyped-def]
    """An index whose writes move a table, and a second mapping of it (a worker's)."""
    index = Index(tmp_path / "index", cached_records=100)
    index.create_bucket(BucketInfo("bkt", 1))
    writer = Generations(tmp_path / "generations", create=True)
    index.records.share(writer)
    worker = Generations(tmp_path / "generations")
    yield index, worker
    index.records.share(None)
    worker.close()
    writer.close()
    index.close()


def test_each_write_of_a_key_moves_its_slot_and_no_other(shared) -> None:  # type: ignore[no-untyped-def]
    index, worker = shared
    k, other = slot_of("bkt", "k"), slot_of("bkt", "other")
    assert k != other
    assert (worker.at(k), worker.at(other)) == (0, 0)
    index.put_object(_meta("k", "a" * 32))
    assert (worker.at(k), worker.at(other)) == (1, 0)
    index.get_object("bkt", "k")  # a read moves nothing
    index.put_object(_meta("k", "b" * 32))
    index.delete_object("bkt", "k")
    assert (worker.at(k), worker.at(other)) == (3, 0)


def test_a_mounted_record_shares_the_slot_of_its_key(shared) -> None:  # type: ignore[no-untyped-def]
    index, worker = shared
    slot = slot_of("m", "train/0")
    index.put_mounted("m", MountedObject(key="train/0", size=1, etag="a", last_modified_ms=1, validated_ms=1))
    assert worker.at(slot) == 1
    index.delete_mounted("m", "train/0")
    assert worker.at(slot) == 2
    # The slot is the index key's, kind byte aside, for both kinds.
    assert _slot(okey("m", "train/0")) == _slot(nkey("m", "train/0")) == slot


def test_writes_stop_moving_the_table_once_unshared(shared) -> None:  # type: ignore[no-untyped-def]
    index, worker = shared
    index.records.share(None)
    index.put_object(_meta("k", "a" * 32))
    assert worker.at(slot_of("bkt", "k")) == 0


def test_a_worker_cannot_create_the_table_twice(tmp_path: Path) -> None:
    table = Generations(tmp_path / "g", create=True)
    with pytest.raises(FileExistsError):
        Generations(tmp_path / "g", create=True)
    table.close()
