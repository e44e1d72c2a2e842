"""Decoded index records kept in memory, exact by the index's commits.

A hot GET's record (an object's, or a mounted object's last known
description) costs a rocksdict read and a msgpack decode into frozen
dataclasses: tens of microseconds, which is why it runs in the thread pool.
Kept decoded here, a hot GET finds its record in a dict on the event loop.

Exactness: every index write that puts or deletes a cached kind of record
goes through :class:`Batch` (or :meth:`RecordCache.drop` for a single
put), and once the write is in the database its keys are dropped from the
cache. A reader that decoded a record from the database stores it with
:meth:`RecordCache.keep` only if no write committed since it started
reading (``commits`` unchanged, checked under the lock the writers take to
drop): a record read before a write cannot be stored after that write's
drop. A record is therefore never served from here once the write that
replaced it has returned, which is when the gateway acknowledges it.

Held records: a cold read of a mounted object learns its description and
answers at once; the database write of the description runs later, with
those of other reads, on the fills' writer thread. Meanwhile the record is
*held*: served from here (:meth:`RecordCache.hold`), and written only if no
other write or drop of its key came after it (:meth:`RecordCache.write_through`
with ``held``), so a late write never puts back what a newer one replaced.

Bounded in bytes (the ``records`` kind of ``tiering/memo.py``, each
record weighed when kept) and by entries; the oldest kept is dropped first
(no reordering on a hit, so a hit is one dict lookup and takes no lock).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from rocksdict import WriteBatch

from tiering.index.generations import Generations
from tiering.memo import Kept

# Prefix bytes of the records kept (tiering/index/keys.py): objects, mounted objects.
CACHED_KINDS = (b"O"[0], b"N"[0])


class RecordCache:
    """raw index key -> decoded record, for the kinds in CACHED_KINDS."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._kept: Kept[bytes, Any] = Kept("records", entries)
        self._records = self._kept.items  # the same dict: a hit is one lookup
        self._lock = threading.Lock()
        self._held: dict[bytes, Any] = {}  # records on their way to the database
        self.commits = 0  # writes that dropped keys, so far
        # Set while read workers run: every write of a cached kind of record
        # also moves its key's shared counter (tiering/index/generations.py).
        self.generations: Generations | None = None

    def share(self, generations: Generations | None) -> None:
        """Move ``generations``'s counters on every write from now on (None:
        stop; no write is moving them once this returns)."""
        with self._lock:
            self.generations = generations

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: bytes) -> Any:
        """The decoded record, or None when it is not kept."""
        return self._records.get(key)

    def keep(self, key: bytes, record: Any, seen: int) -> None:
        """Store ``record``, decoded from the database after :attr:`commits`
        was ``seen``, unless a write committed since."""
        if self.entries <= 0:
            return
        with self._lock:
            if self.commits == seen and key not in self._held:
                self._put(key, record)

    def hold(self, key: bytes, record: Any) -> None:
        """Serve ``record`` from now on, before the database has it: its
        write follows (``write_through`` with ``held``)."""
        with self._lock:
            self._held[key] = record
            if self.entries > 0:
                self._put(key, record)

    def write_through(self, write: Callable[[dict[bytes, Any]], None], records: dict[bytes, Any],
                      held: bool = False) -> None:
        """Run ``write`` (a database write of the records it is given,
        encoded) of ``records`` and keep them as the new decoded values. The
        write runs under the lock: another writer's write of one of these
        keys, before or after it, is followed by that writer's drop, so the
        cache never holds a value the database no longer has. With
        ``held``, only the records still held as :meth:`hold` left them are
        written: one whose key was written or dropped since is older than
        the database's."""
        with self._lock:
            if held:
                records = {key: record for key, record in records.items() if self._held.get(key) is record}
                if not records:
                    return
            for key in records:
                self._held.pop(key, None)
            try:
                write(records)
            except BaseException:
                if held:  # served from memory only while on their way
                    for key in records:
                        self._kept.pop(key)
                raise
            self.commits += 1
            if self.generations is not None:
                self.generations.bump(records)
            if self.entries > 0:
                for key, record in records.items():
                    self._put(key, record)

    def _put(self, key: bytes, record: Any) -> None:
        """Under the lock: store, dropping the oldest kept when full. A
        record kept already (a held one, now written) is not weighed again:
        about 10 us a record."""
        if self._records.get(key) is not record:
            self._kept.put(key, record)

    def drop(self, keys: Iterable[bytes]) -> None:
        """Forget ``keys`` after a write of them reached the database."""
        keys = tuple(keys)
        with self._lock:
            for key in keys:
                self._held.pop(key, None)
            self.commits += 1
            if self.generations is not None:
                self.generations.bump(keys)
            for key in keys:
                self._kept.pop(key)


class Batch:
    """A rocksdict WriteBatch that remembers which cached records it writes."""

    __slots__ = ("raw", "touched", "seq")

    def __init__(self) -> None:
        self.raw = WriteBatch(raw_mode=True)
        self.touched: list[bytes] = []
        self.seq = 0  # the sequence number it stores, if any

    def put(self, key: bytes, value: bytes) -> None:
        self.raw.put(key, value)
        if key[0] in CACHED_KINDS:
            self.touched.append(key)

    def delete(self, key: bytes) -> None:
        self.raw.delete(key)
        if key[0] in CACHED_KINDS:
            self.touched.append(key)
