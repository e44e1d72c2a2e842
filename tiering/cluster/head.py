"""The follow head: one small object that tells the nodes a writer changed
something, read conditionally so that an unchanged head costs nothing.

``leases/_head`` (one for the whole store) holds, for every bucket a
writer ever published, that writer's term, the last segment it committed
and how many of the bucket's segments compaction deleted so far::

    {"buckets": {"data": {"term": 7, "segment": "0000070000000012", "deleted": 3}},
     "identity": "5d41...", "nonce": "9f0c..."}

and, once a node changed the identities document (``tiering/identity/store.py``),
the version tag it wrote (``identity``).

- A writer updates its bucket's entry when it takes the bucket's lease (a
  new term), after it commits segments (once per flush: ``Cluster`` gathers
  the commits of a flush into one update) and after compaction deletes
  segments. An update is a compare-and-swap of the whole object, as the
  lease and the identities document are written: on a conflict the writer
  reads the head again and redoes its change on what another writer wrote.
- Every node reads it with ``If-None-Match`` on the ETag it last saw
  (``look``): unchanged, that is a 304 without a body. When another node
  changed it, the node runs a follow round (``cluster.py``), which lists
  and reads exactly what it always did: the head says *when* to look,
  never *what* counts, so the ordering argument of a follow round (the
  listing first, then the registry and lease) is untouched. The head is
  read before the round lists, so whatever was committed before the head
  write it saw is in that listing; a later commit changes the head again.
- ``deleted`` moving tells the followers to forget the segments compaction
  removed (``Cluster._prune``): a full listing only when something was
  deleted, never on a count of rounds.
- ``identity`` moving tells the followers to read the identities document
  (``heard``); it never makes a follow round (``version`` counts changes
  of the buckets' entries only). A node that changes the document updates
  the head after it wrote it, so a head read that sees the new tag is
  followed by a read of the document that sees the change (or a later
  one: two nodes' updates may land in either order, which is why a
  follower reads on any change of the tag, not on a tag it lacks).
  Folding it in saves an idle node one conditional GET per fallback:
  half of what following costs it.

Why one head for the store, not one per bucket, nor the lease: the lease
is rewritten every ttl/3 with a new expiry, so its ETag changes while
nothing happens and a conditional read of it would never be a 304. One
head per bucket costs an idle node one request per bucket per interval,
and a bucket a node has not heard of yet (the push of its new term lost)
would have no head the node knows to read. One head costs an idle node one
conditional GET per interval whatever the number of buckets, and a new
term appears in it. What it costs instead: writers of different buckets
compare-and-swap one object, once per flush each, and retry on a conflict.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass

from tiering.capacity import CapacityStore
from tiering.cluster.lease import PREFIX as LEASE_PREFIX
from tiering.errors import CapacityConflict, CapacityError, CapacityNotFound

log = logging.getLogger("tierstore.cluster")

NAME = LEASE_PREFIX + "_head"
# Conflicting updates in a row before one gives up, and the most a try
# waits before the next (jittered, growing): as the identities document's.
MAX_TRIES = 16
MAX_BACKOFF = 0.5


@dataclass(frozen=True, slots=True)
class Entry:
    """One bucket's line in the head."""

    term: int  # the term its writer published last
    segment: str  # the last segment committed in that term ("" for none yet)
    deleted: int  # segments of the bucket compaction has deleted, all terms together


@dataclass(frozen=True, slots=True)
class Change:
    """What a writer publishes of one bucket: its term, the last segment it
    committed (None: none since the last update) and how many segments it
    deleted since."""

    term: int
    segment: str | None = None
    deleted: int = 0

    def merged(self, later: Change) -> Change:
        """This change and a ``later`` one, as one."""
        if later.term != self.term:  # a bucket taken again meanwhile: the newer term's, every deletion
            newer, older = (later, self) if later.term > self.term else (self, later)
            return Change(newer.term, newer.segment, newer.deleted + older.deleted)
        segments = [s for s in (self.segment, later.segment) if s is not None]
        return Change(self.term, max(segments) if segments else None, self.deleted + later.deleted)

    def applied(self, old: Entry | None) -> Entry:
        """The bucket's entry ``old`` with this change made."""
        segment = self.segment
        if segment is None:
            segment = old.segment if old is not None and old.term == self.term else ""
        return Entry(self.term, segment, (old.deleted if old is not None else 0) + self.deleted)


def decode(data: bytes) -> dict[str, Entry]:
    """The entries of a head document; ValueError if it is not one."""
    try:
        plain = json.loads(data)
        return {str(bucket): Entry(int(e["term"]), str(e["segment"]), int(e["deleted"]))
                for bucket, e in plain["buckets"].items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a follow head: {exc!r}") from None


def encode(entries: dict[str, Entry], nonce: str, identity: str | None = None) -> bytes:
    body: dict[str, object] = {"buckets": {bucket: asdict(e) for bucket, e in sorted(entries.items())},
                               "nonce": nonce}
    if identity is not None:
        body["identity"] = identity
    return json.dumps(body, sort_keys=True).encode()


class Head:
    """This node's copy of the store's follow head, and its updates.

    ``version`` goes up each time a read finds the buckets' entries
    changed by another node (or by an earlier process of this one): a
    follower compares it with the version its last complete round started
    from."""

    def __init__(self, store: CapacityStore) -> None:
        self._store = store
        self.entries: dict[str, Entry] = {}
        self.identity: str | None = None  # the identities document's tag the head names
        self._heard: list[Callable[[], None]] = []
        self._tag: str | None = None  # the ETag as last read or written (None: none seen)
        self._nonce = ""  # of the document as last read or written
        self.version = 0
        self.updates = 0  # written by this node
        self._lock = asyncio.Lock()  # a read and an update never interleave

    def heard(self, callback: Callable[[], None]) -> None:
        """``callback()`` when a read finds that another node changed the
        identities document (the head names another tag)."""
        self._heard.append(callback)

    async def look(self) -> bool:
        """Read the head if it changed since this node last read or wrote
        it (a 304 otherwise); True if it did."""
        async with self._lock:
            return await self._read()

    async def _read(self) -> bool:
        try:
            if self._tag is None:
                found: tuple[bytes, str] | None = await self._store.read_versioned(NAME)
            else:
                found = await self._store.read_if_changed(NAME, self._tag)
        except CapacityNotFound:
            if self._tag is None:
                return False  # no writer has published yet
            self.entries, self._tag, self._nonce = {}, None, ""
            self.version += 1
            return True
        if found is None:
            return False
        data, tag = found
        try:
            entries = decode(data)
            plain = json.loads(data)
            nonce, identity = str(plain.get("nonce", "")), plain.get("identity")
            identity = str(identity) if identity is not None else None
            changed = entries != self.entries  # not for the identities alone: no round for them
        except ValueError as exc:
            log.warning("the follow head %s cannot be read (%s); following as if it changed", NAME, exc)
            entries, nonce, identity, changed = {}, "", None, True
        if changed:
            self.version += 1
        self.entries, self._tag, self._nonce = entries, tag, nonce
        if identity != self.identity:
            self.identity = identity
            for callback in self._heard:
                callback()
        return True

    async def publish(self, changes: dict[str, Change], identity: str | None = None) -> None:
        """Apply ``changes`` (bucket -> what its writer changed) and, if
        given, the identities document's new tag in one update.
        CapacityError when other nodes' updates won every try."""
        async with self._lock:
            for attempt in range(MAX_TRIES):
                if attempt:
                    await asyncio.sleep(random.uniform(0, min(MAX_BACKOFF, 0.01 * 2 ** min(attempt, 6))))
                entries = dict(self.entries)
                for bucket, change in changes.items():
                    entries[bucket] = change.applied(entries.get(bucket))
                named = identity if identity is not None else self.identity
                nonce = secrets.token_hex(8)
                try:
                    tag = await self._store.put_conditional(NAME, encode(entries, nonce, named), self._tag)
                except CapacityConflict:
                    await self._read()  # another writer's update (or our own, its answer lost): redo on it
                    if self._nonce == nonce:
                        self.updates += 1
                        return
                    continue
                self.entries, self._tag, self._nonce, self.identity = entries, tag, nonce, named
                self.updates += 1
                return
        raise CapacityError(f"the follow head was changed by other nodes {MAX_TRIES} times in a row", name=NAME)

    def deletions(self, skip: set[str]) -> dict[str, int]:
        """Bucket -> segments deleted so far, for the buckets with deletions
        not in ``skip`` (the node's own)."""
        return {bucket: e.deleted for bucket, e in self.entries.items() if e.deleted and bucket not in skip}
