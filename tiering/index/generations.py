"""Write generations of object keys, shared with read workers.

A read worker (``gateway/workers/worker.py``) keeps the writer's answers to its
lookups (an object's record and hot files) so that the next GET of the key
needs no lookup. To serve such an answer it must know that no write of the
key was acknowledged since it was given. The writer keeps, in a file both
sides map, a table of counters: every index write that puts or deletes an
object's or mounted object's record (the writes the record cache drops,
``tiering/index/record_cache.py``) adds one to the counter of each key's slot,
after the write is in the database and before the gateway acknowledges it.

A worker reads the slot's counter *before* it asks the writer, keeps the
answer with that value, and serves it only while the counter still has it:
a write committed after the value was read moves the counter; one committed
before it is in the writer's answer. So a worker never serves a record that
an acknowledged write replaced, with no message between the processes. Keys
sharing a slot only cost each other a lookup.

The counters are plain 64-bit words in shared memory: a worker's read of a
word the writer is changing sees the old or the new value (aligned words on
every platform Python runs on here), and only the writer writes them, under
the record cache's lock.
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Iterable
from pathlib import Path

from tiering.index.keys import okey

SLOTS = 1 << 18  # 2 MiB of counters
_MASK = SLOTS - 1


def slot_of(bucket: str, key: str) -> int:
    """The slot of bucket/key: its object record's index key, kind byte
    aside (a mounted object's record differs only in that byte)."""
    return _slot(okey(bucket, key))


def _slot(raw_key: bytes) -> int:
    return zlib.crc32(raw_key[1:]) & _MASK


class Generations:
    """The shared table: written by the writer (:meth:`bump`), read by
    workers (:meth:`at`)."""

    def __init__(self, path: Path, create: bool = False) -> None:
        size = SLOTS * 8
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._words = memoryview(self._map).cast("Q")

    def close(self) -> None:
        self._words.release()
        self._map.close()

    def at(self, slot: int) -> int:
        return self._words[slot]

    def bump(self, raw_keys: Iterable[bytes]) -> None:
        """A write of these index keys (an object's or mounted object's
        record: one kind byte, then ``bucket + NUL + key``) is in the
        database. The caller holds the lock every such write takes."""
        words = self._words
        for raw_key in raw_keys:
            words[_slot(raw_key)] += 1
