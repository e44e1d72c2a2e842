"""Write terms and seals: the store-wide numbering that keeps writers'
segments apart, and the marks that end a term.

- Every acquisition of a bucket's lease claims a new term number
  (``leases/_terms/<term>``, created once by a conditional write, naming the
  bucket and the node). A segment's name is its term in the top 24 bits and a
  sequence in the low 40, so writers never collide; term 0 is a single
  gateway's and may mix buckets.
- A seal (``leases/_seals/<term>``) names the last valid segment of an ended
  term. A segment that lands after its term's seal is counted by no node.

``Cluster`` (``cluster.py``) claims, follows and seals terms; recovery
(``tiering/maintenance/recover.py``) asks which listed segments still count.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from tiering.capacity import CapacityStore
from tiering.cluster.lease import PREFIX as LEASE_PREFIX
from tiering.errors import CapacityConflict, CapacityNotFound
from tiering.index.keys import term_of

log = logging.getLogger("tierstore.cluster")

TERMS = LEASE_PREFIX + "_terms/"  # + term in 8 hex digits: {"bucket", "node"}
SEALS = LEASE_PREFIX + "_seals/"  # + term in 8 hex digits: its last valid segment ("" for none)
LEGACY = 0  # a single gateway's term: its segments may mix buckets
TERM_READS = 16  # term records read at once (a new node reads every one)


def term_prefix(term: int) -> str:
    """The hex digits every segment name of ``term`` starts with."""
    return f"{term:06x}"


async def cluster_store(capacity: CapacityStore) -> bool:
    """True if gateways with node ids have used this store (a term exists)."""
    async for _ in capacity.list(TERMS):
        return True
    return False


@dataclass(frozen=True, slots=True)
class Term:
    number: int
    bucket: str
    node: str  # the node that claimed it


class Terms:
    """The store's write terms, each claimed once (by conditional create)
    for one bucket; numbered densely from 1, so a claim that lands later
    than another always has the higher number."""

    def __init__(self, capacity: CapacityStore) -> None:
        self._capacity = capacity
        self.known: dict[int, Term] = {}
        self.last = 0
        self._newest: dict[str, int] = {}  # bucket -> its newest term

    async def refresh(self) -> None:
        """Read the terms claimed since the last refresh (a node's first
        reads them all), ``TERM_READS`` at a time."""
        after = f"{TERMS}{self.last:08x}" if self.last else ""
        paths = [path async for path, _ in self._capacity.list(TERMS, after=after)]
        limit = asyncio.Semaphore(TERM_READS)

        async def read(path: str) -> Term:
            async with limit:
                data, _ = await self._capacity.read_versioned(path)
            plain = json.loads(data)
            return Term(int(path[len(TERMS):], 16), str(plain["bucket"]), str(plain["node"]))

        for term in await asyncio.gather(*(read(path) for path in paths)):
            self._add(term)

    async def claim(self, bucket: str, node: str, above: int) -> int:
        """A new term for ``bucket``, higher than ``above`` and every term
        claimed so far."""
        while True:
            await self.refresh()
            number = max(self.last, above) + 1
            body = json.dumps({"bucket": bucket, "node": node}).encode()
            try:
                await self._capacity.put_conditional(f"{TERMS}{number:08x}", body, None)
            except CapacityConflict:
                continue  # claimed by another node (or our own retried write): the next one
            self._add(Term(number, bucket, node))
            return number

    def _add(self, term: Term) -> None:
        self.known[term.number] = term
        self.last = max(self.last, term.number)
        self._newest[term.bucket] = max(self._newest.get(term.bucket, 0), term.number)

    def bucket(self, term: int) -> str | None:
        """The bucket of ``term`` (None for term 0 or a term not seen yet)."""
        found = self.known.get(term)
        return found.bucket if found is not None else None

    def of(self, bucket: str) -> list[int]:
        return sorted(t.number for t in self.known.values() if t.bucket == bucket)

    def is_newest(self, term: int, bucket: str) -> bool:
        """True if no later term of ``bucket`` has been claimed (as last read)."""
        return self._newest.get(bucket, 0) <= term


class Seals:
    """The seals of ended terms in one store, each read once it exists."""

    def __init__(self, capacity: CapacityStore) -> None:
        self._capacity = capacity
        self._known: dict[int, str] = {}

    async def get(self, term: int) -> str | None:
        """The last valid segment of ended ``term`` ("" for none; None: not sealed yet)."""
        if term not in self._known:
            try:
                data, _ = await self._capacity.read_versioned(f"{SEALS}{term:08x}")
            except CapacityNotFound:
                return None
            self._known[term] = data.decode()
        return self._known[term]

    def known(self) -> set[int]:
        """The terms whose seal this node has read (or written)."""
        return set(self._known)

    async def write(self, term: int, name: str) -> str:
        """Seal ended ``term`` at ``name``; the seal that holds (an earlier one stays)."""
        try:
            await self._capacity.put_conditional(f"{SEALS}{term:08x}", name.encode(), None)
            self._known[term] = name
        except CapacityConflict:
            written = await self.get(term)
            assert written is not None
            if written != name:
                log.warning("term %d was sealed at %r, this node applied up to %r", term, written, name)
            return written
        return name


async def valid_segments(capacity: CapacityStore, names: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Leave out the segments no node counts: each upload that landed after
    its term was sealed. (A term not sealed yet counts whole: whoever takes
    its bucket over applies all of it.)"""
    seals = Seals(capacity)
    kept = []
    for name, size in names:
        seal = await seals.get(term_of(name))
        if seal is None or name <= seal:
            kept.append((name, size))
    return kept
