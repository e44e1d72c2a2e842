"""Which node keeps a piece: rendezvous hashing over a table of slots.

A piece (a managed extent's cache name, a mounted object's mount and key)
hashes to one of ``SLOTS`` slots; each slot's owner is the rendezvous
(highest random weight) winner for that slot among the live nodes. A
lookup is a hash and two index reads, whatever the number of nodes (under
a microsecond); the table is built when membership changes.

Rendezvous over slots keeps what rendezvous over pieces gave: a node that
joins takes only the slots it wins, a node that leaves gives up only its
own, each to the node that ranked next. 65,536 slots keep the shares even
where it matters: within 2% of an even share at 4 nodes, and at 1,024 nodes
(64 slots a node on average) the busiest node holds about 1.6 times an
even share, the idlest about half (``tests/unit/tiering/test_placement.py``
bounds them at 1.75 and a quarter).

A node's weight for a slot is compared in three parts: two bytes
(``_weights``: one SHAKE-128 stream of two bytes a slot per node, made in
one call), then an 8-byte hash of (node, slot) for the rare ties, then the
node id, so that every node ranks the same way. The first byte lets a
build find each slot's winner without comparing every node for every slot
(``_build``): the nodes whose first byte is 255 for a slot are its only
candidates if there are any, then those with 254, and so on; at 1,024
nodes four levels decide every slot. Building the whole table costs about 0.3 s
at 1,024 nodes, a join or a leave a few milliseconds to some tens
(``benchmarks/owner_lookup.py``).

Tables are values: ``changed`` returns a new one, so a reader holding the
old one keeps a consistent view.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Sequence
from functools import lru_cache

SLOTS = 1 << 16
_SEED = b"tierstore slot weights\0"
_FULL_BUILD = 16  # more nodes joining at once than this: build the table anew
_NONE = 0xFFFF  # no owner (a table without nodes)


def slot_of(piece: str) -> int:
    """The slot a piece falls in."""
    return int.from_bytes(hashlib.blake2b(piece.encode(), digest_size=8).digest(), "big") & (SLOTS - 1)


def _weights(node: str) -> bytes:
    """The first two bytes of ``node``'s weight for every slot: the first
    byte of slot ``s`` at ``s``, the second at ``SLOTS + s``."""
    return hashlib.shake_128(_SEED + node.encode()).digest(2 * SLOTS)


def _fine(node: str, slot: int) -> tuple[bytes, str]:
    """The rest of ``node``'s weight for ``slot``, compared on a tie."""
    return hashlib.blake2b(f"{node}\0{slot}".encode(), digest_size=8).digest(), node


class Placement:
    """The owner of every slot among a set of nodes."""

    __slots__ = ("_best", "_names", "_owner", "_without", "nodes")

    def __init__(self, nodes: Iterable[str] = ()) -> None:
        self.nodes: tuple[str, ...] = tuple(sorted(set(nodes)))
        self._names: list[str | None] = list(self.nodes)  # node index -> id (None: a free index)
        self._owner = array("H", [_NONE]) * SLOTS  # slot -> node index
        self._best = array("H", [0]) * SLOTS  # slot -> its owner's first two weight bytes
        self._without: dict[str, Placement] = {}
        if self.nodes:
            self._build()

    def owner(self, piece: str) -> str:
        """The node that keeps ``piece``. ValueError without nodes."""
        name = self._names[self._owner[slot_of(piece)]] if self.nodes else None
        if name is None:
            raise ValueError("no node to place a piece on")
        return name

    def slot_owner(self, slot: int) -> str | None:
        index = self._owner[slot]
        return None if index == _NONE else self._names[index]

    def changed(self, nodes: Iterable[str]) -> Placement:
        """The table for ``nodes``: this one with the nodes that left
        removed and those that joined added (only the slots they lose or
        win move)."""
        wanted = set(nodes)
        joined = sorted(wanted - set(self.nodes))
        left = set(self.nodes) - wanted
        if not left and not joined:
            return self
        if not self.nodes or len(joined) > _FULL_BUILD or len(left) == len(self.nodes):
            return Placement(wanted)
        new = self._copy(tuple(sorted(wanted)))
        new._remove(left)
        for node in joined:
            new._add(node)
        return new

    def without(self, node: str) -> Placement:
        """The table without ``node`` (who would keep a piece if it left),
        kept once made: as long to make as a leave (up to a second of CPU
        at 1,024 nodes), so the peer client makes it in the pool when the
        peers change (``PeerClient.follow``)."""
        table = self._without.get(node)
        if table is None:
            table = self._without[node] = self.changed(n for n in self.nodes if n != node)
        return table

    # -- building ------------------------------------------------------------------------

    def _copy(self, nodes: tuple[str, ...]) -> Placement:
        new = Placement.__new__(Placement)
        new.nodes = nodes
        new._names = list(self._names)
        new._owner = array("H", self._owner)
        new._best = array("H", self._best)
        new._without = {}
        return new

    def _build(self) -> None:
        """Every slot's winner, level by level of the first weight byte: at
        each level, the slots still open where some node has that byte go
        to the best of those nodes."""
        weights = [_weights(node) for node in self.nodes]
        open_slots = SLOTS
        decided = bytearray(SLOTS)
        for level in range(255, -1, -1):
            mark = bytes((level,))
            found: dict[int, list[int]] = {}
            for index, weight in enumerate(weights):
                at = weight.find(mark, 0, SLOTS)
                while at >= 0:
                    if not decided[at]:
                        found.setdefault(at, []).append(index)
                    at = weight.find(mark, at + 1, SLOTS)
            for slot, candidates in found.items():
                self._place(slot, [(index, weights[index]) for index in candidates])
                decided[slot] = 1
            open_slots -= len(found)
            if not open_slots:
                return

    def _place(self, slot: int, candidates: Sequence[tuple[int, bytes]]) -> None:
        """Give ``slot`` to the best of ``candidates`` (node index, weights)."""
        key, index = max((weight[slot] << 8 | weight[SLOTS + slot], index) for index, weight in candidates)
        tied = [i for i, weight in candidates if weight[slot] << 8 | weight[SLOTS + slot] == key]
        if len(tied) > 1:
            names = self._names
            index = max(tied, key=lambda i: _fine(names[i], slot))  # type: ignore[arg-type]
        self._owner[slot] = index
        self._best[slot] = key

    def _add(self, node: str) -> None:
        """``node`` joins: it takes the slots where it outranks the owner."""
        index = self._free_index(node)
        weight = _weights(node)
        owner, best, names = self._owner, self._best, self._names
        for level in range(255, (min(best) >> 8) - 1, -1):
            mark = bytes((level,))
            at = weight.find(mark, 0, SLOTS)
            while at >= 0:
                key, held = level << 8 | weight[SLOTS + at], best[at]
                if key > held or (key == held and _fine(node, at) > _fine(names[owner[at]], at)):  # type: ignore[arg-type]
                    owner[at] = index
                    best[at] = key
                at = weight.find(mark, at + 1, SLOTS)

    def _free_index(self, node: str) -> int:
        try:
            index = self._names.index(None)
        except ValueError:
            index = len(self._names)
            if index >= _NONE:
                raise ValueError(f"more than {_NONE} nodes") from None
            self._names.append(node)
            return index
        self._names[index] = node
        return index

    def _remove(self, left: set[str]) -> None:
        """The nodes of ``left`` leave: each of their slots goes to the best
        of the nodes that stay."""
        gone = {index for index, name in enumerate(self._names) if name in left}
        for index in gone:
            self._names[index] = None
        moved = [slot for slot, index in enumerate(self._owner) if index in gone]
        if not moved:
            return
        staying = [(index, _weights(name)) for index, name in enumerate(self._names) if name is not None]
        for slot in moved:
            self._place(slot, staying)


@lru_cache(maxsize=16)
def _table(nodes: tuple[str, ...]) -> Placement:
    return Placement(nodes)


def owner(piece: str, nodes: Sequence[str]) -> str:
    """The node among ``nodes`` that keeps ``piece`` (the table of those
    nodes, made once for the last few sets asked about)."""
    return _table(tuple(sorted(set(nodes)))).owner(piece)
