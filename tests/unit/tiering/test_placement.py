"""The owner table (``tiering/cluster/placement.py``): shares even at 4
and at 1,024 nodes, a join or a leave moving only the slots of the node
that joined or left, and a table changed step by step equal to one built
anew."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tiering.cluster.peers import PeerGroup
from tiering.cluster.placement import SLOTS, Placement, owner, slot_of


def owners(table: Placement) -> list[str | None]:
    return [table.slot_owner(slot) for slot in range(SLOTS)]


def shares(table: Placement) -> Counter[str | None]:
    return Counter(owners(table))


def test_four_nodes_share_the_slots_within_two_percent() -> None:
    table = Placement(["n1", "n2", "n3", "n4"])
    counted = shares(table)
    assert set(counted) == {"n1", "n2", "n3", "n4"}
    assert max(counted.values()) <= 1.02 * SLOTS / 4 and min(counted.values()) >= 0.98 * SLOTS / 4


def test_a_thousand_nodes_each_hold_a_share_within_bounds() -> None:
    """64 slots a node on average: binomial spread, no node above 1.75x
    its share or below a quarter of it."""
    nodes = [f"node-{i:04d}" for i in range(1024)]
    counted = shares(Placement(nodes))
    assert set(counted) == set(nodes)
    mean = SLOTS / len(nodes)
    assert max(counted.values()) <= 1.75 * mean and min(counted.values()) >= 0.25 * mean


@pytest.mark.parametrize("count", [2, 4, 7, 40])
def test_a_join_or_a_leave_moves_only_that_nodes_slots(count: int) -> None:
    nodes = [f"n{i}" for i in range(count)]
    table = Placement(nodes)
    before = owners(table)

    joined = table.changed([*nodes, "new"])
    after = owners(joined)
    moved = [slot for slot in range(SLOTS) if before[slot] != after[slot]]
    assert moved and all(after[slot] == "new" for slot in moved)
    assert after == owners(Placement([*nodes, "new"]))  # the same as a table built anew

    left = table.changed(nodes[1:])
    after = owners(left)
    moved = [slot for slot in range(SLOTS) if before[slot] != after[slot]]
    assert moved and all(before[slot] == nodes[0] for slot in moved)
    assert {before[slot] for slot in range(SLOTS)} - {after[slot] for slot in range(SLOTS)} == {nodes[0]}
    assert after == owners(Placement(nodes[1:]))
    assert shares(table)[nodes[0]] == len(moved)  # every slot it held, and only those


def test_a_table_changed_step_by_step_is_the_table_built_anew() -> None:
    rng = random.Random(54)
    pool = [f"node-{i}" for i in range(30)]
    live = set(rng.sample(pool, 6))
    table = Placement(live)
    for _ in range(12):
        joining = set(rng.sample(sorted(set(pool) - live), rng.randint(0, 3)))
        leaving = set(rng.sample(sorted(live), rng.randint(0, min(3, len(live) - 1))))
        live = (live - leaving) | joining
        table = table.changed(live)
        assert set(table.nodes) == live
    assert owners(table) == owners(Placement(live))


def test_lookups_answer_the_slots_owner_and_the_group_uses_the_table() -> None:
    nodes = ["a", "b", "c"]
    table = Placement(nodes)
    pieces = [f"bucket\0key-{i}" for i in range(500)]
    assert all(table.owner(p) == table.slot_owner(slot_of(p)) for p in pieces)
    assert all(owner(p, ["c", "a", "b"]) == table.owner(p) for p in pieces)  # order does not matter
    group = PeerGroup("a", {"a": "http://a", "b": "http://b", "c": "http://c"})
    assert group.nodes == nodes and all(group.owner(p) == table.owner(p) for p in pieces)
    # Without a: each of a's pieces goes where a table without a puts it, the others stay.
    without = Placement(["b", "c"])
    assert all(group.previous_owner(p) == without.owner(p) for p in pieces)
    assert PeerGroup("a", {"a": "http://a"}).previous_owner(pieces[0]) is None
    with pytest.raises(ValueError):
        Placement().owner("x")
