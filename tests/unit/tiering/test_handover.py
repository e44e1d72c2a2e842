"""A joining node's share handed over by the nodes that kept it
(tiering/mounts/owners.py): asked of the node that would own the object
without this one, from its memory alone (``hot``), only for objects this
node owns, and no longer once asks keep finding nothing (a cluster's first
start, where no node holds anything)."""

from __future__ import annotations

import asyncio

import pytest

from tiering.cluster import handover as handover_module
from tiering.cluster.handover import HANDOVER_MISSES
from tiering.cluster.peers import HOT, PeerGroup, PeerRefused, owner
from tiering.meta import ObjectMeta
from tiering.mounts.owners import MountOwners

NODES = {"a": "http://a", "b": "http://b", "c": "http://c"}


class FakePeers:
    """The peer client's calls the owners make: answers from ``held``
    (node -> keys it holds), each call recorded."""

    def __init__(self, me: str, held: dict[str, set[str]]) -> None:
        self.group = PeerGroup(me, NODES)
        self.held = held
        self.calls: list[tuple[str, str, str]] = []  # (node, key, mode)

    async def first(self, node: str, bucket: str, key: str, length: int,
                    mode: str) -> tuple[dict[str, str], int, bytes]:
        self.calls.append((node, key, mode))
        if key not in self.held.get(node, set()):
            raise PeerRefused(f"{node}: 503")
        return {"etag": '"e"', "content-range": "bytes 0-2/3"}, 3, b"abc"[:length]

    async def get(self, node: str, bucket: str, key: str, etag: str, start: int, end: int,
                  mode: str) -> bytes | None:
        self.calls.append((node, key, mode))
        return b"abc"[start:end] if key in self.held.get(node, set()) else None


def _keys_owned_by(node: str, count: int) -> list[str]:
    keys = (f"k{i}" for i in range(100_000))
    return [k for k in keys if owner(f"m\0{k}", sorted(NODES)) == node][:count]


def test_a_joined_node_asks_the_previous_owner_for_what_it_owns_now() -> None:
    mine = _keys_owned_by("a", 3)
    before = {key: owner(f"m\0{key}", ["b", "c"]) for key in mine}
    peers = FakePeers("a", {node: set(mine) for node in ("b", "c")})
    owners = MountOwners(peers)  # type: ignore[arg-type]
    for key in mine:
        found = asyncio.run(owners.handed_first("m", key, 1 << 20))
        assert found is not None and found[0].size == 3 and found[1] == b"abc"
    meta = ObjectMeta(bucket="m", key=mine[0], size=3, etag="e", last_modified_ms=0, seq=0)
    assert asyncio.run(owners.handed_piece(meta, 0, 3)) == b"abc"
    assert [(node, key) for node, key, _ in peers.calls] == [(before[k], k) for k in [*mine, mine[0]]]
    assert {mode for _, _, mode in peers.calls} == {HOT}  # memory alone: never the source there
    assert owners.handed == 4
    # An object another node owns is that node's to fetch: nothing to hand over.
    assert owners.before("m", _keys_owned_by("b", 1)[0]) is None


def test_asks_that_keep_finding_nothing_stop_the_handover() -> None:
    mine = _keys_owned_by("a", HANDOVER_MISSES + 2)
    peers = FakePeers("a", {})  # a cluster's first start: nobody holds anything
    owners = MountOwners(peers)  # type: ignore[arg-type]
    for key in mine[:HANDOVER_MISSES - 1]:
        assert asyncio.run(owners.handed_first("m", key, 1)) is None
    peers.held = {node: {mine[HANDOVER_MISSES - 1]} for node in ("b", "c")}
    assert asyncio.run(owners.handed_first("m", mine[HANDOVER_MISSES - 1], 1)) is not None  # a find resets
    peers.held = {}
    for key in mine[:HANDOVER_MISSES]:
        assert asyncio.run(owners.handed_first("m", key, 1)) is None
    asked = len(peers.calls)
    assert owners.before("m", mine[-1]) is None
    assert asyncio.run(owners.handed_first("m", mine[-1], 1)) is None and len(peers.calls) == asked


def test_the_handover_ends_after_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    mine = _keys_owned_by("a", 1)
    owners = MountOwners(FakePeers("a", {"b": set(mine), "c": set(mine)}))  # type: ignore[arg-type]
    assert owners.before("m", mine[0]) is not None
    now = handover_module.time.monotonic()
    monkeypatch.setattr(handover_module.time, "monotonic", lambda: now + handover_module.HANDOVER_S + 1)
    assert owners.before("m", mine[0]) is None


def test_a_lone_node_has_no_one_to_ask() -> None:
    peers = FakePeers("a", {})
    peers.group = PeerGroup("a", {"a": "http://a"})
    assert MountOwners(peers).before("m", "k0") is None  # type: ignore[arg-type]
