"""A write lease held in the capacity store itself, by compare-and-swap.

Many gateway nodes over one capacity store must never both write one
managed bucket. The lease is a small object (``leases/<bucket>``) naming
its holder, a term and an expiry; every change to it is a conditional
write (S3 If-None-Match / If-Match on the ETag), so of two nodes racing for
it exactly one write lands, with no service beyond the store.

- ``acquire``: read the lease; create it if there is none, renew it if it
  is ours, take it over if it expired (the term goes up), else report the
  holder.
- ``renew``: extend the expiry, only if the lease is still the version we
  wrote; a conflict means another node took it: we hold nothing from then.
- ``release``: expire it now, so a waiting node need not wait out the TTL.

Clocks: the expiry is wall-clock milliseconds, judged by other nodes'
clocks. A node therefore counts its own lease as held only until its own
monotonic clock says ``ttl - skew`` has passed since the write that
renewed it, and a node takes a lease over only ``skew`` after its expiry:
clocks may differ by up to ``skew`` without two holders.

A conditional write whose answer was lost and that was retried may be told
it conflicted with itself; the lease reads the object back and compares it
with what it wrote (the record carries a random nonce) before concluding.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

from tiering.capacity import CapacityStore
from tiering.errors import CapacityConflict, CapacityError, CapacityNotFound

PREFIX = "leases/"


async def check_conditional_writes(store: CapacityStore, node: str) -> None:
    """Raise CapacityError unless ``store`` honours conditional writes: a
    create (If-None-Match: *) of an object that exists must conflict.
    A store that ignores the condition (rclone serve s3 does) would let
    every node that races for a lease believe it holds it."""
    probe = f"{PREFIX}_probe/{node}"
    try:
        await store.put_conditional(probe, node.encode(), None)
    except CapacityConflict:
        pass  # left by an earlier start of this node
    try:
        await store.put_conditional(probe, node.encode(), None)
    except CapacityConflict:
        return
    raise CapacityError(
        f"the capacity store {store.describe()} ignores conditional writes (If-None-Match: *): gateways "
        "started with --node-id need them for their write leases; use a store that has them, or one "
        "gateway without --node-id", name=probe,
    )


@dataclass(frozen=True)
class LeaseRecord:
    """The lease object's content."""

    holder: str  # the node that holds (or last held) the lease
    term: int  # goes up by one at every change of holder
    expires_ms: int  # wall clock; 0 when released
    nonce: str  # tells this write from any other with the same fields

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> LeaseRecord:
        plain = json.loads(data)
        return cls(str(plain["holder"]), int(plain["term"]), int(plain["expires_ms"]), str(plain["nonce"]))


class Lease:
    """``node``'s view of the lease on ``bucket`` in ``store``."""

    def __init__(
        self,
        store: CapacityStore,
        bucket: str,
        node: str,
        ttl: float = 30.0,
        skew: float = 5.0,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < skew < ttl:
            raise ValueError(f"need 0 < skew < ttl, got skew={skew} ttl={ttl}")
        self.store = store
        self.name = PREFIX + bucket
        self.node = node
        self.ttl = ttl
        self.skew = skew
        self._wall = wall
        self._monotonic = monotonic
        self.record: LeaseRecord | None = None  # as last read or written
        self._tag: str | None = None  # its version tag
        self._valid_until = 0.0  # monotonic; ours until then

    @property
    def held(self) -> bool:
        """True while this node may write: it holds the lease and its own
        clock says the lease has not run out (less the skew allowance)."""
        return (self.record is not None and self.record.holder == self.node
                and self._monotonic() < self._valid_until)

    @property
    def holder(self) -> str | None:
        return self.record.holder if self.record is not None else None

    async def read(self) -> LeaseRecord | None:
        """The lease as the store has it now (None: never taken). Changes
        nothing, but a node that finds another holder no longer holds it."""
        try:
            data, tag = await self.store.read_versioned(self.name)
        except CapacityNotFound:
            self.record, self._tag = None, None
            return None
        record = LeaseRecord.decode(data)
        if record != self.record:
            self.record, self._tag = record, tag
            if record.holder != self.node:
                self._valid_until = 0.0
        return record

    async def acquire(self, new_term: Callable[[int], Awaitable[int]] | None = None) -> bool:
        """Hold the lease if it is free, ours or expired; True if held.

        With ``new_term``, every acquisition, even of a lease this node
        still holds from before a restart, writes a fresh term: the one
        ``new_term`` returns for the current term (0 for none), which
        must be higher."""
        try:
            data, tag = await self.store.read_versioned(self.name)
        except CapacityNotFound:
            return await self._write(term=await new_term(0) if new_term else 1, expect=None)
        current = LeaseRecord.decode(data)
        self.record, self._tag = current, tag
        mine = current.holder == self.node and current.expires_ms > 0
        if not mine and not self.takeable(current):
            return False
        if new_term is not None:
            term = await new_term(current.term)
            if term <= current.term:
                raise ValueError(f"a new term must be above {current.term}, got {term}")
            return await self._write(term=term, expect=tag)
        return await self._write(term=current.term if mine else current.term + 1, expect=tag)

    def takeable(self, record: LeaseRecord) -> bool:
        """True once ``record`` has expired by more than the skew allowance
        on this node's clock: another node may take the lease over."""
        return self._wall() * 1000 > record.expires_ms + self.skew * 1000

    async def renew(self) -> bool:
        """Extend the lease we hold; False (and not held) if it was taken."""
        if self.record is None or self.record.holder != self.node or self._tag is None:
            return False
        return await self._write(term=self.record.term, expect=self._tag)

    async def release(self) -> None:
        """Give the lease up now (if still ours): others may take it at once."""
        if self.record is None or self.record.holder != self.node or self._tag is None:
            return
        await self._write(term=self.record.term, expect=self._tag, expires_ms=0)

    async def _write(self, term: int, expect: str | None, expires_ms: int | None = None) -> bool:
        started = self._monotonic()
        if expires_ms is None:
            expires_ms = int((self._wall() + self.ttl) * 1000)
        record = LeaseRecord(self.node, term, expires_ms, secrets.token_hex(8))
        try:
            tag = await self.store.put_conditional(self.name, record.encode(), expect)
        except CapacityConflict:
            # Lost, unless the conflict was our own earlier attempt landing.
            try:
                data, tag = await self.store.read_versioned(self.name)
            except CapacityNotFound:
                self.record, self._tag, self._valid_until = None, None, 0.0
                return False
            self.record, self._tag = LeaseRecord.decode(data), tag
            if self.record != record:
                self._valid_until = 0.0
                return False
        self.record, self._tag = record, tag
        # Counted from before the write: the store may have applied it at once.
        self._valid_until = started + self.ttl - self.skew if expires_ms else 0.0
        return expires_ms > 0
