"""How many pieces of one object a read keeps in flight: the source's
bandwidth-delay product, bounded per object and for the node.

A read of a large object streams its pieces in order and fetches the next
ones meanwhile. Too few in flight and the client waits a round trip at
each piece; too many and they split the store's bandwidth, so the piece
being sent arrives slower, and memory holds pieces nobody sends yet.

The window is what Little's law asks of a pipe: to keep bytes flowing at
the rate ``B`` the source delivers them, ``B x T`` bytes must be on the
way, ``T`` being how long a piece holds its place: the round trip to its
first byte ``L`` and its ``P`` bytes at one stream's rate ``r``. In
pieces, plus the one being sent and one for the spread of ``T`` about its
mean: ``2 + ceil(B x (L + P / r) / P)``: the
bandwidth-delay product of the source, where a stream slower than the
source (S3 gives one connection about 100 MB/s) counts as delay too.
``B``, ``L`` and ``r`` are measured on this node's own fetches (moving
averages: ``L`` from each GET's request to its first byte, ``r`` from its
first byte to its last, ``B`` from the bytes landed per second while
pieces were in flight), starting from the configured ``fetch_concurrency``
until the first piece came in. A fast or distant source gets more pieces
in flight; a slow near one fewer (less memory, and the piece being sent
does not share the source's bandwidth with pieces nobody sends yet).

Bounds: ``most`` pieces per object (``fetch_concurrency``), and a
node-wide number of pieces in flight at once (:meth:`slot`), so many
readers cannot together hold more than ``node_most`` pieces of memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator

_WEIGHT = 0.2  # of a new sample in the moving averages


class Window:
    """Pieces in flight for one object's read, from the source's bandwidth-delay product."""

    def __init__(self, piece: int, most: int, node_most: int | None = None) -> None:
        self._piece = piece
        self._most = max(1, most)
        self._node_most = node_most if node_most is not None else 4 * self._most
        self._slots: asyncio.Semaphore | None = None  # made on the loop, at the first fetch
        self.latency: float | None = None  # seconds to a GET's first byte
        self.rate: float | None = None  # bytes a second landed while pieces were in flight
        self.stream: float | None = None  # bytes a second of one piece's GET, first byte to last
        self._busy = 0  # pieces in flight on the node
        self._busy_since = 0.0
        self._busy_bytes = 0

    def pieces(self) -> int:
        """How many pieces a read keeps in flight, the one being sent included."""
        if self.latency is None or self.rate is None or self.stream is None:
            return self._most
        # Each piece holds its place for the round trip to its first byte and
        # the time its bytes take at one stream's rate (Little's law).
        held = self.latency + self._piece / self.stream
        return max(2, min(self._most, 2 + math.ceil(self.rate * held / self._piece)))

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Fetch]:
        """One piece in flight; waits while the node has ``node_most``."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._node_most)
        async with self._slots:
            fetch = Fetch()
            self._began()
            try:
                yield fetch
            finally:
                self._ended(fetch)

    def _began(self) -> None:
        if self._busy == 0:
            self._busy_since, self._busy_bytes = time.monotonic(), 0
        self._busy += 1

    def _ended(self, fetch: Fetch) -> None:
        self._busy -= 1
        self._busy_bytes += fetch.bytes
        now = time.monotonic()
        if fetch.first_at is not None:
            self.latency = _moved(self.latency, fetch.first_at - fetch.began_at)
            if fetch.bytes >= self._piece // 2 and now > fetch.first_at:
                self.stream = _moved(self.stream, fetch.bytes / (now - fetch.first_at))
        # The node's rate over the stretch its fetches kept it busy, sampled when one ends
        # (and the stretch long enough to say something: a piece's worth at least).
        if self._busy_bytes >= self._piece and now > self._busy_since:
            self.rate = _moved(self.rate, self._busy_bytes / (now - self._busy_since))
        if self._busy == 0:
            self._busy_bytes = 0


class Fetch:
    """One piece's GET: when it began, when its first byte came, bytes landed."""

    __slots__ = ("began_at", "first_at", "bytes")

    def __init__(self) -> None:
        self.began_at = time.monotonic()
        self.first_at: float | None = None
        self.bytes = 0

    def landed(self, count: int) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
        self.bytes += count


def _moved(average: float | None, sample: float) -> float:
    return sample if average is None else average + _WEIGHT * (sample - average)
