"""The background revalidation of mounted objects (tiering/mounts/revalidate.py):
one sweep of listing pages over a data set past its freshness, however
the reads that queue its keys arrive."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

from tiering.meta import MountedObject
from tiering.mounts.revalidate import PAGE, Revalidator
from tiering.mounts.source import SourceObject, SourcePage

MOUNT = "m"


class Known:
    """The index's mounted records, in memory (what Revalidator reads and writes)."""

    def __init__(self, keys: list[str]) -> None:
        self.records = {key: MountedObject(key, 1, f"e-{key}", 1_000, validated_ms=0) for key in keys}

    def get_mounted(self, name: str, key: str) -> MountedObject | None:
        assert name == MOUNT
        return self.records.get(key)

    def put_mounted(self, name: str, *records: MountedObject) -> None:
        for record in records:
            self.records[record.key] = record


class Source:
    """ListObjectsV2 over ``objects`` (sorted keys). While a page is asked
    for, ``reads_per_page`` more of ``reads`` arrive: a read whose record
    is past its freshness queues its key, as ``Mounts._current`` does."""

    def __init__(self, objects: dict[str, SourceObject], known: Known, revalidator: list[Revalidator],
                 reads: list[str], reads_per_page: int) -> None:
        self.objects = objects
        self.keys = sorted(objects)
        self.known = known
        self.revalidator = revalidator
        self.reads = reads
        self.reads_per_page = reads_per_page
        self.pages = 0

    def read(self) -> None:
        key = self.reads.pop()
        record = self.known.records.get(key)
        if record is not None and not record.validated_ms:
            self.revalidator[0].add(MOUNT, key)

    async def page(self, prefix: str, delimiter: str, start_after: str, max_keys: int) -> SourcePage:
        self.pages += 1
        for _ in range(min(self.reads_per_page, len(self.reads))):
            self.read()
        await asyncio.sleep(0)
        listed = [key for key in self.keys if key > start_after][:max_keys]
        truncated = bool(listed) and listed[-1] != self.keys[-1]
        return SourcePage([self.objects[key] for key in listed], [], truncated)


def sweep(keys: list[str], changed: set[str], deleted: set[str], reads_per_page: int,
          read: list[str] | None = None) -> tuple[int, Known, set[str]]:
    """Every key (or those of ``read``) read once in a random order while
    stale; the listing pages asked, the records after, and the keys dropped."""
    known = Known(keys)
    objects = {key: SourceObject(key, 1, f"e-{key}" + ("-new" if key in changed else ""), 1_000)
               for key in keys if key not in deleted}
    reads = (read or keys)[:]
    random.Random(3).shuffle(reads)
    holder: list[Revalidator] = []
    source = Source(objects, known, holder, reads, reads_per_page)
    dropped: set[str] = set()

    async def client(name: str) -> Source:
        return source

    async def forget(name: str, record: MountedObject) -> None:
        dropped.add(record.key)
        del known.records[record.key]

    async def go() -> None:
        revalidator = Revalidator(known, client, forget)  # type: ignore[arg-type]
        holder.append(revalidator)
        while reads or revalidator._tasks:
            if not revalidator._tasks:  # the reads between sweeps
                source.read()
            await revalidator.idle()

    asyncio.run(go())
    return source.pages, known, dropped


def test_a_data_set_past_its_freshness_is_revalidated_in_one_sweep_of_pages() -> None:
    keys = [f"set/{i:05d}" for i in range(20_000)]
    pages, known, dropped = sweep(keys, changed=set(), deleted=set(), reads_per_page=200)
    # 20 pages cover the set. The sweep starts at the first key read; the
    # keys below it, read meanwhile, take a second one: a few pages more
    # than one pass, not a pass per round (54 pages before the sweep).
    assert pages <= len(keys) // PAGE + 5, pages
    assert not dropped
    assert all(record.validated_ms > 0 for record in known.records.values())


def test_changed_and_deleted_objects_are_dropped_by_the_sweep() -> None:
    keys = [f"set/{i:05d}" for i in range(5_000)]
    changed, deleted = {"set/00007", "set/03333"}, {"set/01000", "set/04999"}
    pages, known, dropped = sweep(keys, changed=changed, deleted=deleted, reads_per_page=50)
    assert dropped == changed | deleted
    assert pages <= 2 * (len(keys) // PAGE) + 2, pages  # 17 before the sweep
    assert all(record.validated_ms > 0 for record in known.records.values())
    assert all(replace(known.records[key], validated_ms=0) == Known([key]).records[key]
               for key in keys if key not in dropped)


def test_a_few_stale_keys_far_apart_cost_a_page_each() -> None:
    keys = [f"set/{i:06d}" for i in range(100_000)]
    read = ["set/000500", "set/000501", "set/040000", "set/099999"]
    pages, known, _ = sweep(keys, changed=set(), deleted=set(), reads_per_page=4, read=read)
    assert pages <= 3, pages  # the two neighbours share one; nothing is listed between them
    assert all(known.records[key].validated_ms for key in read)
