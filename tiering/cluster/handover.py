"""A joining node's share, handed over by the nodes that kept it.

When a node joins a running cluster, the owner table moves to it the
pieces it now wins (mounted objects, managed extents), and the nodes that
kept them until then still hold them hot. For a while after it starts
(``HANDOVER_S``), a miss of a piece this node owns first asks the node that
would own it without this one (``Handover.before``), with
``x-tierstore-peer: hot``: that node answers from its memory alone, never
from the store, or 503. What it sends is kept here, checked as the store's
bytes would be, so the moved share comes over once instead of being read
from the store again. A node restarted on its data dir gets back, this
way, what the others took over while it was gone. At a cluster's first
start no node holds anything: after ``HANDOVER_MISSES`` asks in a row that
found nothing, this node stops asking.

Each kind of piece (``tiering/mounts/owners.py`` for mounted objects,
``tiering/managed/backend.py`` for managed extents) keeps a ``Handover`` of
its own, so a run of misses of one kind does not end the other's.
"""

from __future__ import annotations

import time
from typing import TypeVar

from tiering.cluster.peers import PeerClient

__all__ = ["HANDOVER_MISSES", "HANDOVER_S", "Handover"]

T = TypeVar("T")

HANDOVER_S = 600.0  # seconds after this node starts during which it asks a piece's previous owner
HANDOVER_MISSES = 16  # asks in a row that found nothing, after which it stops asking


class Handover:
    """Whom to ask for a piece of this node's share, while it is taking it over."""

    def __init__(self, peers: PeerClient) -> None:
        self._peers = peers
        self._until = time.monotonic() + HANDOVER_S
        self._misses = 0
        self.handed = 0  # pieces of this node's share a previous owner sent

    def before(self, piece: str) -> str | None:
        """For a piece this node owns: the node that would own it without
        this one, while this node may still be taking its share over; None
        otherwise (another node owns it, the window is over, or asks keep
        finding nothing)."""
        if self._misses >= HANDOVER_MISSES or time.monotonic() > self._until:
            return None
        group = self._peers.group
        if group.owner(piece) != group.me:
            return None
        return group.previous_owner(piece)

    def outcome(self, got: T | None) -> T | None:
        """Count an ask's outcome (``got``: None when the previous owner did
        not hold the piece) toward stopping after HANDOVER_MISSES in a row."""
        if got is None:
            self._misses += 1
        else:
            self._misses = 0
            self.handed += 1
        return got
