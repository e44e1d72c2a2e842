"""One read call: conditions and ranges decided from the metadata before
any byte is read (tiering/reads/plan.py), for staged, cached and cold objects."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tiering.errors import InvalidRange
from tiering.hot.tier import HotTier
from tiering.model.conditions import Conditions
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node
from tiering.reads.fetch import ExtentReader
from tiering.reads.plan import RangeSpec, Read

DATA = bytes(range(256)) * 64  # 16 KiB


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _put(node: Node, key: str, data: bytes = DATA) -> str:
    meta = node.run(node.objects.put("bkt", key, _body(data), NewObject(), Integrity(expected_size=len(data))))  # type: ignore[attr-defined]
    return str(meta.etag)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read of object bytes, from any tier, recorded by name."""
    seen: list[str] = []
    for owner, name in [(HotTier, "read"), (HotTier, "read_now"), (HotTier, "read_cached"), (HotTier, "open"),
                        (HotTier, "pread"), (ExtentReader, "fetch"), (ExtentReader, "open_cached")]:
        original = getattr(owner, name)

        def counted(*args, __original=original, __name=name, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(__name)
            return __original(*args, **kwargs)

        monkeypatch.setattr(owner, name, staticmethod(counted) if name == "pread" else counted)
    return seen


@pytest.mark.parametrize(
    ("conditions", "status"),
    [
        (lambda etag: Conditions(if_none_match=f'"{etag}"'), 304),
        (lambda etag: Conditions(if_modified_since=4_000_000_000), 304),
        (lambda etag: Conditions(if_match='"0000"'), 412),
        (lambda etag: Conditions(if_unmodified_since=1), 412),
    ],
)
def test_a_failed_condition_reads_no_object_bytes(node: Node, reads: list[str], conditions, status) -> None:  # type: ignore[no-untyped-def]
    etag = _put(node, "k")
    reads.clear()
    plan = node.run(node.objects.read(Read("bkt", "k", conditions=conditions(etag))))  # type: ignore[attr-defined]
    assert (plan.status, plan.body, plan.tally.hot, plan.tally.capacity) == (status, None, 0, 0)
    assert reads == []
    plan = node.run(node.objects.read(Read("bkt", "k")))  # type: ignore[attr-defined]
    assert plan.body == DATA and reads  # the counter sees a read when one happens


def test_a_failed_condition_on_a_cold_object_reads_nothing_from_the_store(node: Node, reads: list[str]) -> None:
    etag = _put(node, "k")
    node.run(node.tiers.flush())  # type: ignore[attr-defined]
    node.run(node.tiers.residency.evict("bkt", ""))  # type: ignore[attr-defined]
    reads.clear()
    plan = node.run(node.objects.read(Read("bkt", "k", conditions=Conditions(if_none_match=f'"{etag}"'))))  # type: ignore[attr-defined]
    assert plan.status == 304 and reads == []
    plan = node.run(node.objects.read(Read("bkt", "k")))  # type: ignore[attr-defined]
    assert plan.body == DATA and plan.tally.capacity == len(DATA)


def test_ranges_and_parts_are_resolved_against_the_object(node: Node) -> None:
    _put(node, "k")
    plan = node.run(node.objects.read(Read("bkt", "k", range=RangeSpec(10, 19, "bytes=10-19"))))  # type: ignore[attr-defined]
    assert (plan.status, plan.body, plan.wanted.start, plan.wanted.end) == (206, DATA[10:20], 10, 20)
    plan = node.run(node.objects.read(Read("bkt", "k", range=RangeSpec(None, 5, "bytes=-5"))))  # type: ignore[attr-defined]
    assert (plan.status, plan.body) == (206, DATA[-5:])
    plan = node.run(node.objects.read(Read("bkt", "k", range=RangeSpec(9, 3, "bytes=9-3"))))  # type: ignore[attr-defined]
    assert (plan.status, plan.body) == (200, DATA)  # invalid: ignored, as S3 does
    plan = node.run(node.objects.read(Read("bkt", "k", part_number=1)))  # type: ignore[attr-defined]
    assert (plan.status, plan.parts_count, plan.body) == (206, 1, DATA)
    with pytest.raises(InvalidRange):
        node.run(node.objects.read(Read("bkt", "k", range=RangeSpec(len(DATA), None, "bytes=16384-"))))  # type: ignore[attr-defined]


def test_head_reads_no_body(node: Node, reads: list[str]) -> None:
    _put(node, "k")
    reads.clear()
    plan = node.run(node.objects.read(Read("bkt", "k", body=False)))  # type: ignore[attr-defined]
    assert (plan.status, plan.body, plan.wanted.length) == (200, None, len(DATA))
    assert reads == []
