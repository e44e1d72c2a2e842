"""Mounted buckets: existing S3 data read through the hot tier.

A mount maps a gateway bucket onto ``s3://bucket/prefix`` at some endpoint.
Its objects stay where they are, one object per key; the gateway keeps, per
key it has served, the source's description (size, ETag, metadata) and
caches the bytes it read in the hot tier, one file per ``part_size`` piece,
named by (mount, key, ETag, piece): a new version at the source has new
names, so a stale piece can never be served for it.

Integrity: a piece of a larger object can only be checked for its length
(S3 sends no checksum of a range); a piece that is the whole object is also
checked against the store's checksum of the whole content where the first
GET's answer carried one, else against the ETag where that is the MD5 of
the bytes (``tiering/mounts/checks.py``).

Freshness: an ``immutable`` mount trusts what it validated once; otherwise a
validation holds ``freshness`` seconds, after which the next HEAD or GET asks
the source again (a changed ETag drops the cached pieces, a missing object
becomes NoSuchKey). Pieces are fetched with If-Match on the validated ETag,
so bytes of two versions are never mixed. While the source is unreachable,
what is validated and cached is served (``serve_stale``); anything else is a
503 naming the source.

Listings are passed through to the source (pages reused for ``listing_ttl``
seconds when the mount asks for it, see ``tiering.mounts.listing_cache``). On a
read-write mount, PUT, copy and DELETE go through to the source natively
(one PUT, or a streamed multipart upload for large bodies, with the
object's metadata), and the
gateway's description of the key is replaced by the source's; a read-only
mount answers writes with AccessDenied.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tiering import pool
from tiering.capacity import CapacityStats
from tiering.cluster.peers import PeerClient
from tiering.errors import (
    AccessDenied,
    BucketAlreadyOwnedByYou,
    CapacityError,
    CapacityNotFound,
    InvalidObjectState,
    NoSuchBucket,
    NoSuchKey,
    ServiceUnavailable,
    SourceDenied,
)
from tiering.hot.open_files import Opened
from tiering.hot.tier import HotTier
from tiering.index.db import Index, ListPage
from tiering.memo import ByIdentity
from tiering.meta import BucketInfo, Mount, MountedObject, ObjectMeta, now_ms
from tiering.model.names import check_bucket_name
from tiering.mounts.checks import whole
from tiering.mounts.listing_cache import ListingCache
from tiering.mounts.owners import MountOwners, PeerRefused
from tiering.mounts.pieces import MountPieces, piece_name
from tiering.mounts.revalidate import Revalidator
from tiering.mounts.source import SourceBucket, SourceObject
from tiering.reads.arrival import Arrival
from tiering.reads.flight import SingleFlight
from tiering.reads.plan import SMALL_READ, Location
from tiering.reads.readahead import Peered
from tiering.settings import TierSettings

log = logging.getLogger("tierstore.mounts")


# How a read asks the source about a key: its description, and bytes when it brought some.
# An object's description and first bytes (Peered: the node that keeps it sent them).
_Ask = Callable[[], Awaitable[tuple[SourceObject, bytes | Peered | None]]]


class Mounts:
    """Every mount of one node: their source clients and their reads."""

    def __init__(self, index: Index, hot: HotTier, settings: TierSettings, region: str,
                 peers: PeerClient | None = None) -> None:
        self._index = index
        # With peers, each object's owner keeps its bytes; the others ask it
        # (``tiering/mounts/owners.py``).
        self.owners = MountOwners(peers) if peers is not None else None
        self._hot = hot
        self._settings = settings
        self._region = region
        self._mounts: dict[str, Mount] = {}
        self._sources: dict[str, SourceBucket] = {}
        self._probes: SingleFlight[tuple[MountedObject, bytes | None]] = SingleFlight()
        self.listings = ListingCache()
        self.revalidator = Revalidator(index, self.client, self._forget)
        # The pieces of mounted objects: cached, held, arriving or fetched.
        self.pieces = MountPieces(hot, settings, self.owners, self.client, self._mounts.__getitem__, unreachable)
        # Each record's ObjectMeta built once (a response head is kept by its identity).
        self._metas: ByIdentity[MountedObject, ObjectMeta] = ByIdentity(8192, weigh_value=_meta_weight)

    # -- lifecycle -------------------------------------------------------------

    def _source(self, mount: Mount) -> SourceBucket:
        return SourceBucket(
            mount.bucket, mount.prefix, endpoint=mount.endpoint, region=mount.region,
            access_key=mount.access_key, secret_key=mount.secret_key,
            concurrency=self._settings.fetch_concurrency, connections=self._settings.store_connections,
            part_size=self._settings.part_size,
            max_attempts=3,
        )

    async def start(self) -> None:
        """Open every mount's client. A source that is down does not stop
        the gateway: its mount serves what is cached and retries later."""
        for mount in await pool.run(self._index.list_mounts):
            self._mounts[mount.name] = mount
            self._sources[mount.name] = self._source(mount)
            try:
                await self._sources[mount.name].start()
            except CapacityError as exc:
                log.warning("mount %s: %s; serving what is cached until it answers", mount.name, exc)

    async def close(self) -> None:
        await self.revalidator.close()
        await self.pieces.close()
        for source in self._sources.values():
            await source.close()

    async def client(self, name: str) -> SourceBucket:
        source = self._sources[name]
        await source.start()  # a no-op once connected; retried after a failed start
        return source

    # -- mounting ----------------------------------------------------------------

    def get(self, name: str) -> Mount | None:
        return self._mounts.get(name)

    def all(self) -> list[Mount]:
        return sorted(self._mounts.values(), key=lambda m: m.name)

    def stats(self, name: str) -> CapacityStats:
        """Requests this node made of the mount's source, and bytes read."""
        return self._sources[name].stats

    async def mount(self, mount: Mount) -> Mount:
        """Check the source answers (its bucket exists, the keys work), then
        record the mount. CapacityError says why the source refused."""
        check_bucket_name(mount.name)
        if mount.name in self._mounts or self._index.get_bucket(mount.name) is not None:
            raise BucketAlreadyOwnedByYou(BucketName=mount.name)
        source = self._source(mount)
        await source.start()
        if not await pool.run(self._index.add_mount, mount):
            await source.close()
            raise BucketAlreadyOwnedByYou(BucketName=mount.name)
        self._mounts[mount.name] = mount
        self._sources[mount.name] = source
        return mount

    async def unmount(self, name: str) -> None:
        """Forget the mount and drop what it cached; the source is untouched."""
        if name not in self._mounts:
            raise NoSuchBucket(BucketName=name)
        del self._mounts[name]
        self.listings.forget(name)
        await self._sources.pop(name).close()
        known = await pool.run(self._index.remove_mount, name)
        await pool.run(self._hot.drop_cached, [n for obj in known for n in self.piece_names(name, obj)])

    def bucket(self, name: str) -> BucketInfo | None:
        mount = self._mounts.get(name)
        if mount is None:
            return None
        return BucketInfo(name=name, created_ms=mount.created_ms, region=self._region)

    def writable(self, name: str) -> None:
        """Raise AccessDenied for a write to a read-only mount."""
        mount = self._mounts.get(name)
        if mount is not None and not mount.read_write:
            raise AccessDenied(f"Bucket {name} is a read-only mount of {mount.source}", BucketName=name)

    def managed_only(self, name: str, what: str) -> None:
        """Raise AccessDenied for what a mount does not do (deleting the
        bucket: the source's bucket is not the gateway's to delete)."""
        mount = self._mounts.get(name)
        if mount is not None:
            raise AccessDenied(f"{what} is not supported on bucket {name}, a mount of {mount.source}",
                               BucketName=name)

    # -- objects -----------------------------------------------------------------

    def piece_names(self, name: str, obj: MountedObject | ObjectMeta) -> list[str]:
        count = max(1, -(-obj.size // self._settings.part_size))
        return [piece_name(name, obj.key, obj.etag, i) for i in range(count)]

    async def head(self, name: str, key: str) -> ObjectMeta:
        """The object as last validated, asking the source (HEAD) when the
        validation has expired (or never happened)."""
        known = self._index.get_mounted(name, key)  # on the loop, as in open_for_read
        if known is not None and self._current(name, known, cached=True):
            return _as_meta(name, known)

        async def ask() -> tuple[SourceObject, bytes | None]:
            if self.owners is not None and (handed := await self.owners.handed_first(name, key, 1)):
                return handed[0], None  # ours now: described by the node that kept it
            return await (await self.client(name)).describe_object(key), None

        found, _ = await self._revalidate(name, key, known, ask)
        return _as_meta(name, found)

    def _current(self, name: str, known: MountedObject, cached: bool) -> bool:
        """May ``known`` be answered now? Yes while its validation holds;
        past it, when its bytes are ``cached`` and the mount serves stale
        data, yes too, with a revalidation queued behind the answer
        (``tiering/mounts/revalidate.py``): a read never waits for one.
        A mount that does not serve stale data asks the source first."""
        mount = self._mounts[name]
        if _fresh(mount, known):
            return True
        if not (cached and mount.serve_stale):
            return False
        self.revalidator.add(name, known.key)
        return True

    def known_now(self, name: str, key: str) -> ObjectMeta | None:
        """On the event loop, from memory: the object as last validated
        when its record is in the record cache and it may be answered now
        (:meth:`_current`, which may queue a revalidation); else None."""
        known = self._index.cached_mounted(name, key)
        if known is None or name not in self._mounts:
            return None
        if not self._current(name, known, self._hot.is_cached(piece_name(name, key, known.etag, 0))):
            return None
        return self._metas.get(known, functools.partial(_as_meta, name))

    def read_now(self, meta: ObjectMeta) -> bytes | bytearray | None:
        """On the event loop: the whole of a small object from the page
        cache (``HotTier.read_now``), or None when any piece is not there."""
        part = self._settings.part_size
        return self._hot.read_now([
            (None, piece, min(part, meta.size - index * part))
            for index, piece in enumerate(self.piece_names(meta.bucket, meta))
        ])

    def locate(self, name: str, key: str) -> Location | None:
        """Blocking: for a read worker, the record of ``key`` and the hot-tier
        files of all its pieces, as (path, offset, size), and when its validation
        expires, if it holds and every piece is cached; None otherwise (the
        writer serves it, and queues a revalidation when one is due)."""
        mount = self._mounts.get(name)
        known = self._index.get_mounted(name, key)
        if mount is None or known is None or not _fresh(mount, known):
            return None
        part = self._settings.part_size
        files = []
        for index, piece in enumerate(self.piece_names(name, known)):
            if not self._hot.touch_cached(piece):
                return None
            files.append((*self._hot.where(None, piece), min(part, known.size - index * part)))
        until = None if mount.freshness is None else known.validated_ms + int(mount.freshness * 1000)
        return Location(_as_meta(name, known).to_bytes(), tuple(files), until_ms=until)

    async def _revalidate(self, name: str, key: str, known: MountedObject | None, ask: _Ask,
                          again: Callable[[MountedObject], Awaitable[bytes]] | None = None,
                          ) -> tuple[MountedObject, bytes | None]:
        """Ask the source about ``key`` and record its answer: a new ETag
        drops the cached pieces, a 404 forgets the key (NoSuchKey), an
        unreachable source leaves what is known (if serve_stale) or is a 503.
        With ``again`` (a whole GET of the object), bytes ``ask`` brought are
        the first piece, checked and cached (:meth:`_record_first_piece`)."""
        mount = self._mounts[name]
        try:
            found, data = await ask()
        except CapacityNotFound:
            if known is not None:
                await self._forget(name, known)
            raise NoSuchKey(Key=key) from None
        except CapacityError as exc:
            if known is not None and mount.serve_stale:
                return known, None
            raise unreachable(mount, exc) from None
        if known is not None and known.etag != found.etag:
            await self._forget(name, known)
        fresh = _described(found)
        peer = isinstance(data, Peered)  # the owner's answer: passed on as such
        raw = data.data if isinstance(data, Peered) else data
        if again is not None and raw is not None and (len(raw) == found.size
                                                     or len(raw) >= self._settings.part_size):
            body = await self._record_first_piece(name, fresh, raw, again, found.checksum)
            return fresh, Peered(body) if peer and body is raw else body
        self._record_behind(name, fresh)
        return fresh, data

    async def _record_first_piece(
        self, name: str, fresh: MountedObject, data: bytes, again: Callable[[MountedObject], Awaitable[bytes]],
        checksum: tuple[str, str] | None,
    ) -> bytes:
        """Check a whole object's bytes against the store's ``checksum`` of
        them, or its MD5 ETag (:func:`whole`: bytes that fail are fetched
        again), then record ``fresh`` and cache
        ``data``, its first piece, behind the answer: both by the fills'
        writer thread, the record served from memory meanwhile."""
        if len(data) == fresh.size:
            try:
                data = await whole(data, fresh.etag, lambda: again(fresh), checksum,
                                   check_md5=self._mounts[name].check_md5)
            except CapacityError as exc:  # corrupt every time: nothing recorded, nothing cached
                raise unreachable(self._mounts[name], exc) from None
        self._record_behind(name, fresh)
        self.pieces.fill_behind(name, fresh.key, piece_name(name, fresh.key, fresh.etag, 0), data)
        return data

    def _record_behind(self, name: str, fresh: MountedObject) -> None:
        """Serve ``fresh`` from memory now; the fills' writer puts it in the
        index behind the answer, with the records of the other misses it
        finds queued (``put_mounted(..., held=True)``: unless a write or
        delete of the key came in between)."""
        self._index.hold_mounted(name, fresh)
        self.pieces.fills.gather(self._put_held, name, fresh)

    def _put_held(self, name: str, *objects: MountedObject) -> None:
        self._index.put_mounted(name, *objects, held=True)

    # -- writes (read-write mounts) ------------------------------------------------

    async def committed(self, name: str, key: str) -> ObjectMeta:
        """After a write: describe ``key`` as the source now has it."""
        self.listings.forget(name)
        known = await pool.run(self._index.get_mounted, name, key)
        if known is not None:
            await self._forget(name, known)
        fresh = _described(await (await self.client(name)).head(key))
        await pool.run(self._index.put_mounted, name, fresh)
        return _as_meta(name, fresh)

    async def delete(self, name: str, key: str) -> None:
        """Delete ``key`` at the source (idempotent, as S3) and here."""
        self.writable(name)
        try:
            await (await self.client(name)).delete(key)
        except CapacityError as exc:
            raise unreachable(self._mounts[name], exc) from None
        self.listings.forget(name)
        known = await pool.run(self._index.get_mounted, name, key)
        if known is not None:
            await self._forget(name, known)

    async def open_for_read(self, name: str, key: str, small: int,
                            ask_peers: bool = True) -> tuple[ObjectMeta, bytes | Peered | None]:
        """``head`` for a GET, and the body when it is at most ``small``
        bytes and had to be fetched anyway: an object not validated (or
        expired) is described by one ranged GET of its first ``small`` bytes,
        so a cold read of a small object costs the source one request, not a
        HEAD and a GET. The body is cached as the object's first piece."""
        if small <= 0:
            return await self.head(name, key), None
        # On the loop: a point read, 0.4 us for a key the index lacks, 5 us
        # (p99 9 us) decoded for one it has (200,000 records): a pool call costs more.
        known = self._index.get_mounted(name, key)
        first_cached = known is not None and self._hot.is_cached(piece_name(name, key, known.etag, 0))
        if known is not None and self._current(name, known, first_cached):
            return self._metas.get(known, functools.partial(_as_meta, name)), None
        probe = min(small, self._settings.part_size)

        owner = self.pieces.owner(name, key) if ask_peers else None

        async def ask() -> tuple[SourceObject, bytes | Peered | None]:
            if owner is not None:
                with contextlib.suppress(PeerRefused):
                    found, data = await self.owners.first(owner, name, key, probe)  # type: ignore[union-attr]
                    return found, Peered(data)
            elif self.owners is not None and (handed := await self.owners.handed_first(name, key, probe)):
                return handed[0], Peered(handed[1])  # ours now: cached here, checked as the source's
            return await (await self.client(name)).first_or_head(key, probe)

        async def again(obj: MountedObject) -> bytes:  # the whole object again, if its bytes fail the check
            return await (await self.client(name)).get_range(key, 0, obj.size, if_match=obj.etag)

        # Readers (and the epoch prefetcher) asking for one cold object at
        # once share one request to the source; only the first caches it.
        (found, data), _ = await self._probes.run(
            (name, key), lambda: self._revalidate(name, key, known, ask, again)
        )
        raw = data.data if isinstance(data, Peered) else data
        if raw is None or (found.size > probe and len(raw) < self._settings.part_size):
            meta = _as_meta(name, found)
            if raw is not None and found.size > probe and not isinstance(data, Peered):
                self.pieces.first_bytes(meta, raw)  # the start of its first piece, if that is read next
            return meta, None  # stale, empty, or less than a piece of a larger object
        # The whole object, or nothing: a probe shared with a caller that
        # asked for fewer bytes (a warm on a node that does not own it) may
        # have brought only some.
        return _as_meta(name, found), data if found.size <= probe and len(raw) == found.size else None

    async def warm(self, name: str, key: str, room: int) -> MountWarm:
        """Bring every piece of ``key`` into the hot tier, unless it is
        larger than ``room`` bytes. A small object costs one ranged GET
        (description and body at once), a large one a probe of its first
        piece and then its other pieces, fetched concurrently."""
        owner = self.pieces.owner(name, key)
        # Not the owner: its first byte describes the object (the owner
        # fetches and keeps the whole first piece to answer it); this node
        # keeps no bytes, so asks for no more. New here and no larger than
        # the owner's probe: that answer brought the whole object in.
        new = owner is not None and self._index.get_mounted(name, key) is None
        refused = self.owners.refused if self.owners is not None else 0
        meta, _ = await self.open_for_read(name, key, 1 if owner is not None else self._settings.part_size)
        if new and meta.size <= min(SMALL_READ, self._settings.part_size) and self.owners.refused == refused:  # type: ignore[union-attr]
            return MountWarm(meta.size, hot=True, elsewhere=True)
        if owner is not None and await self.owners.warm(owner, meta, self._settings.part_size):  # type: ignore[union-attr]
            return MountWarm(meta.size, hot=True, elsewhere=True)  # hot on its owner, for the whole cluster
        names = self.piece_names(name, meta)
        await self.pieces.fills.wait(names)  # a warm reports what is in the hot tier
        missing = [i for i, piece in enumerate(names) if not self._hot.is_cached(piece)]
        if not missing:  # a small object: its one GET brought it whole, and it is written
            return MountWarm(meta.size, hot=True)
        if meta.size > room:
            return MountWarm(meta.size, hot=False)
        part = self._settings.part_size

        async def one(index: int) -> None:
            got = await self.pieces.open(meta, index, min(part, meta.size - index * part))
            if isinstance(got, Opened):
                os.close(got.fd)  # cached meanwhile by a reader
            elif isinstance(got, Arrival):
                await asyncio.shield(got.outcome)  # arriving for a reader: cached once it is in

        await asyncio.gather(*(one(i) for i in missing))
        await self.pieces.fills.wait(names)
        return MountWarm(meta.size, all(self._hot.is_cached(piece) for piece in names))

    async def _forget(self, name: str, known: MountedObject) -> None:
        await pool.run(self._index.delete_mounted, name, known.key)
        await pool.run(self._hot.drop_cached, self.piece_names(name, known))

    # -- listing -------------------------------------------------------------------

    async def list_objects(
        self, name: str, prefix: str, delimiter: str, marker: str, max_keys: int
    ) -> ListPage:
        """One listing page, asked of the source (or reused for the mount's
        ``listing_ttl``)."""
        mount = self._mounts[name]
        try:
            return await self.listings.page(mount, lambda: self.client(name), prefix, delimiter, marker, max_keys)
        except CapacityError as exc:
            raise unreachable(mount, exc) from None


@dataclass(frozen=True, slots=True)
class MountWarm:
    """What warming one mounted object did."""

    size: int
    hot: bool  # every piece is in the hot tier now (on its owner, with ``elsewhere``)
    elsewhere: bool = False  # another node owns it and holds it: nothing is kept here


def unreachable(mount: Mount, exc: CapacityError) -> ServiceUnavailable:
    """The 503 of a source failure (SourceDenied when the source said 403),
    or S3's own 403 for an object archived at the source."""
    if exc.detail.get("code") == "InvalidObjectState":
        return InvalidObjectState(f"The object is archived at the source of bucket {mount.name}: {exc}")
    kind = SourceDenied if exc.detail.get("status") == 403 else ServiceUnavailable
    return kind(f"The source of bucket {mount.name} ({mount.source}) is unreachable: {exc}")


def _fresh(mount: Mount, known: MountedObject) -> bool:
    return mount.freshness is None or now_ms() - known.validated_ms < mount.freshness * 1000


def _described(found: SourceObject) -> MountedObject:
    return MountedObject(
        key=found.key, size=found.size, etag=found.etag, last_modified_ms=found.last_modified_ms,
        validated_ms=now_ms(), content_type=found.content_type, headers=found.headers,
        user_meta=found.user_meta,
    )


def _meta_weight(meta: ObjectMeta) -> int:
    """What a mounted object's ``ObjectMeta`` (``_as_meta``) keeps alive
    beside its record: itself and the tags dict it makes. Its strings,
    numbers and other dicts are the record's, weighed in the record cache."""
    return sys.getsizeof(meta) + sys.getsizeof(meta.tags)


def _as_meta(name: str, obj: MountedObject) -> ObjectMeta:
    return ObjectMeta(
        bucket=name, key=obj.key, size=obj.size, etag=obj.etag,
        last_modified_ms=obj.last_modified_ms, seq=0, content_type=obj.content_type,
        headers=obj.headers, user_meta=obj.user_meta,
    )
