"""Bucket policies and pins on the object service, without HTTP: layout
overrides reach the segments, pins keep data hot through eviction and
restarts, evict and unpin act on a prefix only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from tiering.capacity import LocalDirStore
from tiering.jobs import Job
from tiering.maintenance.residency import PinTooLarge
from tiering.meta import ObjectMeta
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node as TieringNode
from tiering.settings import TierSettings

MiB = 1024 * 1024


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


class Node:
    """An object service on a local capacity directory, driven synchronously."""

    def __init__(self, root: Path, hot_size: int = 1 << 30) -> None:
        self.root = root
        self.hot_size = hot_size
        self.loop = asyncio.new_event_loop()
        self.service = self._open()

    def _open(self) -> TieringNode:
        capacity = LocalDirStore(self.root.parent / "capacity")
        settings = TierSettings(hot_size=self.hot_size, flush_delay=3600.0, part_size=5 * MiB)
        service = TieringNode(self.root, settings, capacity)
        self.run(service.start())
        return service

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def put(self, bucket: str, key: str, data: bytes) -> ObjectMeta:
        integrity = Integrity(expected_size=len(data))
        return self.run(self.service.objects.put(bucket, key, _body(data), NewObject(), integrity))

    def get(self, bucket: str, key: str) -> bytes:
        meta = self.run(self.service.objects.head(bucket, key))
        return self.run(self.service.objects.read_all(meta))

    def states(self, bucket: str, key: str) -> list[str]:
        return self.service.tiers.residency.states(self.run(self.service.objects.head(bucket, key)))

    def restart(self) -> None:
        self.run(self.service.close())
        self.service = self._open()

    def close(self) -> None:
        self.run(self.service.close())
        self.loop.close()


@pytest.fixture
def node(tmp_path: Path):  # type: ignore[no-untyped-def]
    n = Node(tmp_path / "data")
    yield n
    n.close()


def test_bucket_overrides_reach_the_layout(node: Node) -> None:
    service = node.service
    node.run(service.objects.create_bucket("plain", compression=False, part_size=6 * MiB))
    node.run(service.objects.create_bucket("default"))
    text = b"the same words again and again " * 40_000  # ~1.2 MB, compresses well
    node.put("plain", "t", text)
    node.put("default", "t", text)
    large = node.put("plain", "large", b"z" * (13 * MiB))
    assert [c.size for c in large.chunks] == [6 * MiB, 6 * MiB, 1 * MiB]
    node.run(service.tiers.flush())
    plain = node.run(service.objects.head("plain", "t")).chunks[0].extent
    default = node.run(service.objects.head("default", "t")).chunks[0].extent
    assert plain is not None and default is not None
    assert plain.codec == "none" and plain.stored == len(text)
    assert default.codec == "zstd" and default.stored < len(text) // 10
    info = node.run(service.objects.bucket("plain"))
    changed = node.run(service.objects.set_policy(replace(info, compression=None)))
    assert service.policies.settings("plain").compression is True, "None follows the node again"
    assert changed.part_size == 6 * MiB


def test_pin_pulls_cold_objects_in_and_eviction_spares_them(node: Node) -> None:
    service = node.service
    node.run(service.objects.create_bucket("data"))
    for i in range(6):
        node.put("data", f"train/{i}", bytes([i]) * 100_000)
        node.put("data", f"val/{i}", bytes([i]) * 100_000)
    node.run(service.tiers.flush())
    node.run(service.tiers.residency.evict())
    assert node.states("data", "train/0") == ["capacity"]

    job = Job("t", "pin", {})
    report = node.run(service.tiers.residency.pin("data", "train/", job))
    assert (report.objects, report.bytes, report.fetched_bytes) == (6, 600_000, 600_000)
    assert (job.items_total, job.items_done, job.bytes_done) == (6, 6, 600_000)
    assert service.hot.pinned == 600_000
    assert node.states("data", "train/5") == ["cached"]

    for i in range(6):
        assert node.get("data", f"val/{i}") == bytes([i]) * 100_000  # cached, unpinned
    node.run(service.tiers.reader.drain())  # a read's cache fill ends after its answer
    evicted = node.run(service.tiers.residency.evict("data", ""))
    assert (evicted.evicted_bytes, evicted.skipped_pinned_bytes) == (600_000, 600_000)
    assert node.run(service.tiers.residency.evict()).evicted_bytes == 0
    assert node.states("data", "train/0") == ["cached"] and node.states("data", "val/0") == ["capacity"]

    node.restart()
    assert node.service.hot.pinned == 600_000, "pins come back from the index"
    assert node.service.policies.pins() == [("data", "train/")]
    assert node.run(node.service.tiers.residency.unpin("data", "train/")) == 600_000
    assert node.run(node.service.tiers.residency.evict()).evicted_bytes == 600_000
    with pytest.raises(KeyError):
        node.run(node.service.tiers.residency.unpin("data", "train/"))


def test_writes_and_reads_under_a_pin_stay_pinned(node: Node) -> None:
    service = node.service
    node.run(service.objects.create_bucket("hotset"))
    node.run(service.tiers.residency.hold("hotset", ""))
    node.put("hotset", "a", b"a" * 50_000)
    node.run(service.tiers.flush())
    assert service.hot.pinned == 50_000, "a flushed staged file becomes pinned cache"
    node.run(service.tiers.residency.unpin("hotset", ""))
    node.run(service.tiers.residency.evict())
    node.run(service.tiers.residency.hold("hotset", ""))
    assert node.get("hotset", "a") == b"a" * 50_000  # a miss, fetched and cached pinned
    node.run(service.tiers.reader.drain())
    assert service.hot.pinned == 50_000


def test_a_pin_larger_than_the_hot_tier_fails_and_says_so(tmp_path: Path) -> None:
    node = Node(tmp_path / "small", hot_size=1_000_000)
    try:
        service = node.service
        node.run(service.objects.create_bucket("big"))
        for i in range(4):
            node.put("big", f"o{i}", bytes([i]) * 300_000)
        node.run(service.tiers.flush())
        node.run(service.tiers.residency.evict())
        with pytest.raises(PinTooLarge, match="does not fit"):
            node.run(service.tiers.residency.pin("big", ""))
        assert service.hot.pinned <= service.hot.high
        for i in range(4):  # still served, pinned or not
            assert node.get("big", f"o{i}") == bytes([i]) * 300_000
    finally:
        node.close()
