"""Members of a mounted bucket's batch that other nodes keep, gathered from
them in runs.

On a cluster node, most members of a mounted batch are owned by other
nodes (``tiering/mounts/owners.py``). Read one by one, each would cost a
request to its owner; instead the batch's known, small members are grouped
by owner into runs (``Gather.runs``: up to a few dozen members or a few
MiB each), and a run is asked of its owner in one request
(``Gather.fetch``: a batch that the owner reads through its own tier, each
member only at the version this node knows) as soon as the first of its
members comes within the batch's read-ahead. A member the run did not
bring (the owner refused, could not be reached, found another version, or
sent other bytes than the size known here) is read as a GET reads it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from tiering.batch.member import Member, ReadOne, planned
from tiering.meta import ObjectMeta
from tiering.reads.plan import ReadTally

# Positions grouped into runs at once: a run holds at most this many of a
# batch's members, and grouping them costs the loop a few microseconds each.
BLOCK = 128


class Run(Protocol):
    """Members of one batch kept by one other node, asked of it at once."""

    node: str
    positions: list[int]  # their places in the batch, ascending
    metas: list[ObjectMeta]  # each as this node knows it


class Gather(Protocol):
    """Where a mounted batch's members are kept, and asking their owners."""

    def runs(self, bucket: str, keys: Sequence[str], start: int, end: int) -> dict[int, Run]:
        """Position -> the run it belongs to, for the members of
        ``keys[start:end]`` worth gathering (on the event loop: a few
        microseconds a key)."""
        ...

    async def fetch(self, bucket: str, run: Run) -> list[bytes | memoryview | None]:
        """Each member's bytes as its owner sent them (checked for length),
        None for one it did not send."""
        ...


class Gathered:
    """One batch's runs, each fetched once, when its first member comes near."""

    def __init__(self, gather: Gather, bucket: str, keys: Sequence[str], read_one: ReadOne,
                 tally: ReadTally) -> None:
        self._gather = gather
        self._bucket = bucket
        self._keys = keys
        self._read_one = read_one
        self._tally = tally
        self._runs: dict[int, Run] = {}
        self._planned = 0  # positions before this one have been grouped into runs
        self._fetches: dict[int, asyncio.Task[list[bytes | memoryview | None]]] = {}
        self.gathered = 0  # members that came in runs

    async def member(self, position: int) -> Member:
        key = self._keys[position]
        while position >= self._planned:  # grouped a block at a time, as the batch reaches it
            end = min(len(self._keys), self._planned + BLOCK)
            self._runs.update(self._gather.runs(self._bucket, self._keys, self._planned, end))
            self._planned = end
        run = self._runs.pop(position, None)
        if run is None:
            return await planned(key, self._read_one, self._tally)
        fetch = self._fetches.get(id(run))
        if fetch is None:
            fetch = self._fetches[id(run)] = asyncio.create_task(self._gather.fetch(self._bucket, run))
        bodies = await asyncio.shield(fetch)
        at = run.positions.index(position)
        body = bodies[at]
        if body is None:
            return await planned(key, self._read_one, self._tally)
        self.gathered += 1
        self._tally.peer += len(body)  # from the hot tier of the node that keeps it
        return Member(key, run.metas[at], body)  # type: ignore[arg-type]

    async def close(self) -> None:
        """Cancel the runs still being fetched (the batch ended early)."""
        for fetch in self._fetches.values():
            fetch.cancel()
        await asyncio.gather(*self._fetches.values(), return_exceptions=True)
