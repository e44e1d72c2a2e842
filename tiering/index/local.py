"""The index's node-local records: mounts and what each knows of its
objects, and pins. None of them goes into segment footers: a mount's source
bucket is the record of its objects, and pins are this node's cache policy.
Mixed into ``Index``, which owns the database, its lock and the record
cache (mounted objects' records are kept there decoded, like objects')."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rocksdict import WriteBatch

from tiering.errors import InsufficientStorage, NoSuchBucket, ServiceUnavailable, SlowDown
from tiering.index.keys import SEP, bkey, hkey, mkey, nkey
from tiering.meta import Mount, MountedObject

if TYPE_CHECKING:
    from rocksdict import Rdict

    from tiering.index.record_cache import Batch, RecordCache


class LocalRecords:
    """Mount and pin methods of ``Index`` (see there for locking and
    durability); ``Index`` provides the attributes declared here."""

    _db: Rdict
    _lock: object
    records: RecordCache

    if TYPE_CHECKING:
        def _batch(self) -> Batch: ...
        def _write(self, batch: Batch, sync: bool = True) -> None: ...
        def _store(self, raw: WriteBatch, sync: bool = True, seq: int = 0, behind: bool = False) -> None: ...
        def _scan(self, start: bytes, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...
        def _cached_read(self, raw_key: bytes, decode: Callable[[bytes], object]) -> object | None: ...

    # -- mounts (node-local: the source bucket is the record of its objects) -

    def add_mount(self, mount: Mount) -> bool:
        """Record a mount; False if the name is taken (by a bucket or mount)."""
        with self._lock:
            if self._db.get(bkey(mount.name)) is not None or self._db.get(mkey(mount.name)) is not None:
                return False
            self._store(_one(mkey(mount.name), mount.to_bytes()))
            return True

    def get_mount(self, name: str) -> Mount | None:
        raw = self._db.get(mkey(name))
        return Mount.from_bytes(raw) if raw is not None else None

    def list_mounts(self) -> list[Mount]:
        return [Mount.from_bytes(v) for _, v in self._scan(b"M", b"M")]

    def remove_mount(self, name: str) -> list[MountedObject]:
        """Forget a mount and what it knew of its objects; those objects."""
        with self._lock:
            batch = self._batch()
            batch.delete(mkey(name))
            known = []
            for raw_key, value in self._scan(nkey(name), nkey(name)):
                known.append(MountedObject.from_bytes(value))
                batch.delete(raw_key)
            for pin, _ in self._scan(hkey(name), hkey(name)):
                batch.delete(pin)
            self._write(batch)
            return known

    def get_mounted(self, mount: str, key: str) -> MountedObject | None:
        return self._cached_read(nkey(mount, key), MountedObject.from_bytes)  # type: ignore[no-any-return]

    def cached_mounted(self, mount: str, key: str) -> MountedObject | None:
        """The mounted object's record if the record cache holds it (no
        database read: safe on the event loop), else None."""
        return self.records.get(nkey(mount, key))  # type: ignore[no-any-return]

    def put_mounted(self, mount: str, *objects: MountedObject, held: bool = False) -> None:
        """Put the descriptions of mounted objects (one just read or written,
        or a revalidation's page of renewals) in one unsynced write, and keep
        them decoded in the record cache: the next read of each key (an
        epoch's next, say) then stays on the event loop instead of reading
        the database in the pool. Not synced: a lost record costs one
        revalidation, never data; nor is one the disk has no room for
        (the read that learnt it is answered all the same). With ``held``,
        of the objects :meth:`hold_mounted` held only those no write or
        delete of their key replaced since."""
        encoded: dict[bytes, bytes] = {}  # outside the lock
        records: dict[bytes, MountedObject] = {}
        for obj in objects:
            raw_key = nkey(mount, obj.key)
            encoded[raw_key], records[raw_key] = obj.to_bytes(), obj

        def write(records: dict[bytes, MountedObject]) -> None:
            batch = WriteBatch(raw_mode=True)
            for raw_key in records:
                batch.put(raw_key, encoded[raw_key])
            self._store(batch, sync=False, behind=True)

        if records:
            try:
                self.records.write_through(write, records, held)
            except _NO_ROOM:
                pass

    def hold_mounted(self, mount: str, obj: MountedObject) -> None:
        """On the event loop: answer ``obj`` as the mounted object's record
        from memory now, before ``put_mounted(..., held=True)`` writes it."""
        self.records.hold(nkey(mount, obj.key), obj)

    def delete_mounted(self, mount: str, key: str) -> None:
        """Forget what the index knew of a mounted key. On a full disk the
        record stays: its ETag no longer matches the source's, so the
        next read drops it again."""
        raw_key = nkey(mount, key)
        batch = WriteBatch(raw_mode=True)
        batch.delete(raw_key)
        try:
            self._store(batch, sync=False, behind=True)
        except _NO_ROOM:
            return
        self.records.drop((raw_key,))

    # -- pins (node-local cache policy: not in footers) ----------------------

    def add_pin(self, bucket: str, prefix: str) -> bool:
        """Record a pin; False if it was there already."""
        with self._lock:
            if self._db.get(bkey(bucket)) is None:
                raise NoSuchBucket(BucketName=bucket)
            if self._db.get(hkey(bucket, prefix)) is not None:
                return False
            self._store(_one(hkey(bucket, prefix), b""))
            return True

    def remove_pin(self, bucket: str, prefix: str) -> bool:
        """Remove a pin; False if there was none."""
        with self._lock:
            if self._db.get(hkey(bucket, prefix)) is None:
                return False
            batch = WriteBatch(raw_mode=True)
            batch.delete(hkey(bucket, prefix))
            self._store(batch)
            return True

    def list_pins(self) -> list[tuple[str, str]]:
        """Every (bucket, prefix) pinned, in order."""
        pins = []
        for raw, _ in self._scan(b"H", b"H"):
            bucket, _, prefix = raw[1:].partition(SEP)
            pins.append((bucket.decode(), prefix.decode()))
        return pins


# What a write the disk has no room for raises (tiering/index/room.py).
_NO_ROOM = (SlowDown, InsufficientStorage, ServiceUnavailable)


def _one(key: bytes, value: bytes) -> WriteBatch:
    batch = WriteBatch(raw_mode=True)
    batch.put(key, value)
    return batch
