"""Which cache file to evict: the SIEVE policy, and the hint protocol.

SIEVE (Zhang et al., "SIEVE is Simpler than LRU", NSDI 2024) keeps one FIFO
queue and one visited bit per item. A hit only sets the bit; it never moves
the item. A "hand" walks from the oldest item toward the newest: a visited
item loses its bit and stays, the first unvisited item is the victim, and
the hand stays where it stopped (wrapping to the oldest end) for the next
eviction.

Why it replaced LRU here:

- Scan resistance. An item read once (a large sequential read, a listing
  job, a one-off restore) enters unvisited and is the first thing the hand
  finds, while items read again keep their bit and survive the pass. Under
  LRU every new item of a scan pushes the working set one step closer to
  eviction, and a scan larger than the cache flushes it entirely.
- The paper finds it as good as or better than LRU and ARC in miss ratio on
  most web and block traces, with less state than either.
- A hit is a bit set, not a relink: cheap under the hot tier's lock, which
  every reading worker thread takes.

In a cluster, some cached pieces are copies of pieces another node owns
(kept from before a join moved them, or read here when their owner could
not be asked): a ``judge`` says which, as they are queued, and the queue
keeps them apart (``copies``, oldest first) so eviction can take them
before anything of this node's own share. A miss of a copy costs a peer
read; a miss of an owned piece costs every node a store read.

The hot tier may also be given an ``EvictionAdvisor``: a component that knows
which cache files registered future reads will need (a prefetch plan, a
sequential reader) and in what order, so eviction can approach Belady's
optimum (evict what is needed furthest in the future) for those files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol


class EvictionAdvisor(Protocol):
    """Knows the names a registered sequence of future reads will need.

    Both methods are called by the hot tier; neither may take the hot
    tier's lock (``wanted`` is called while it is held, and ``furthest`` is
    iterated between eviction steps that take it)."""

    def wanted(self, name: str) -> bool:
        """True if a registered future read needs ``name``. Called under the
        hot tier's lock for each item the SIEVE hand passes: must be a set
        lookup or as cheap."""
        ...

    def furthest(self) -> Iterable[str]:
        """Names in the registered future, the one needed furthest ahead
        first. May name files that are not cached, or are pinned: the
        caller skips those. Consumed lazily, one name per eviction."""
        ...


class _Node:
    """One queued item. ``older`` points toward the tail (the oldest item),
    ``newer`` toward the head (the newest)."""

    __slots__ = ("name", "size", "visited", "older", "newer")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self.visited = False
        self.older: _Node | None = None
        self.newer: _Node | None = None


class Sieve:
    """The SIEVE queue: O(1) insert, touch and remove; ``victim`` is O(1)
    amortised (each step of the hand clears a bit a hit had to set, or
    evicts). Not thread-safe: the hot tier calls it under its lock."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}
        self._head: _Node | None = None  # newest
        self._tail: _Node | None = None  # oldest
        # Where the next victim search starts; None means at the tail.
        self._hand: _Node | None = None
        self.total = 0  # sum of the sizes
        # True for a name that is a copy of another node's piece; judged as
        # a name is queued, and again for all (``rejudge``) when owners change.
        self.judge: Callable[[str], bool] | None = None
        self.copies: dict[str, None] = {}  # the queued names judged copies, oldest first

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def names(self) -> Iterator[str]:
        """Names from the tail (oldest) to the head (newest). Do not change
        the queue while iterating."""
        node = self._tail
        while node is not None:
            yield node.name
            node = node.newer

    def insert(self, name: str, size: int) -> None:
        """Add ``name`` at the head, unvisited. A name already queued keeps
        its place and its bit; only its size changes."""
        node = self._nodes.get(name)
        if node is not None:
            self.total += size - node.size
            node.size = size
            return
        node = _Node(name, size)
        node.older = self._head
        if self._head is not None:
            self._head.newer = node
        self._head = node
        if self._tail is None:
            self._tail = node
        self._nodes[name] = node
        self.total += size
        if self.judge is not None and self.judge(name):
            self.copies[name] = None

    def rejudge(self, copies: Iterable[str]) -> None:
        """The queued names among ``copies`` are the copies now (judged
        outside the caller's lock over a snapshot of ``names``)."""
        self.copies = {name: None for name in copies if name in self._nodes}

    def copy_victim(self) -> tuple[str, int] | None:
        """Pop the oldest copy, as (name, size); None if there is none."""
        if not self.copies:
            return None
        name = next(iter(self.copies))
        size = self.remove(name)
        assert size is not None  # copies holds queued names only
        return name, size

    def touch(self, name: str) -> bool:
        """Record a hit; False if ``name`` is not queued."""
        node = self._nodes.get(name)
        if node is None:
            return False
        node.visited = True
        return True

    def remove(self, name: str) -> int | None:
        """Take ``name`` out of the queue; its size, or None if absent."""
        node = self._nodes.pop(name, None)
        if node is None:
            return None
        self.copies.pop(name, None)
        self._unlink(node)
        return node.size

    def victim(self, skip: Callable[[str], bool] | None = None) -> tuple[str, int] | None:
        """Pop the next item to evict, as (name, size); None if the queue is
        empty or every item was skipped.

        Items for which ``skip(name)`` is true are passed over like visited
        ones, but the skip itself does not clear their bit (a visited item
        loses it as usual). Two full turns of the hand are enough to clear
        every bit and then see every item unvisited, so the search stops
        after ``2 * len + 1`` steps."""
        node = self._hand or self._tail
        steps = 2 * len(self._nodes) + 1
        while node is not None and steps:
            steps -= 1
            if node.visited:
                node.visited = False
            elif skip is None or not skip(node.name):
                del self._nodes[node.name]
                self.copies.pop(node.name, None)
                self._hand = node
                self._unlink(node)  # moves the hand to the newer neighbour
                return node.name, node.size
            node = node.newer or self._tail
        self._hand = node
        return None

    def _unlink(self, node: _Node) -> None:
        if self._hand is node:
            self._hand = node.newer  # None: the next search wraps to the tail
        if node.older is not None:
            node.older.newer = node.newer
        else:
            self._tail = node.newer
        if node.newer is not None:
            node.newer.older = node.older
        else:
            self._head = node.older
        node.older = node.newer = None
        self.total -= node.size
