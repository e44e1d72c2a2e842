"""Batch reads: many objects of one bucket, in the order asked, with the
cold ones fetched ahead while the earlier ones are sent.

The gateway's ``?batch`` requests (``gateway/handlers/batch.py``) turn the
members this yields into a tar stream. Per member: the key, its metadata and
its body, or the error that kept it from being read (NoSuchKey, a store
failure after retries, a bad key name).

Managed buckets: every key is looked up first (a few pool calls for ten
thousand keys), so a missing key is known before the first byte goes out.
A batch of at most ``HOT_OPEN`` keys that are all small and hot (or
errors) has its files opened in the same pool call (on the event loop,
with no pool call, when every record is in the record cache) and is
answered as a :class:`HotBatch`: every member's size is known before the first byte, and
no eviction, flush or delete can change its bytes from then on, so the
gateway lays the tar out whole (a Content-Length) and has the bodies read
straight into its send buffers. In any other batch, members whose bytes
are all hot are read in groups, one pool call per
``GROUP_BYTES`` of them: a hot batch costs a few thread hand-offs, not one
per object. Ahead of the member being sent, the extents of the next
``ahead`` bytes of objects that are not hot are fetched with
``ExtentReader.fetch_many``, the epoch prefetcher's machinery: packed
neighbours of a segment in one ranged GET. They are cached unpinned, as any
read's extents are; the window is a quarter of the hot tier's room at most,
so a batch larger than the hot tier streams through it, and a member whose
extents were evicted or never cached is read alone, as a GET would.

Mounted buckets: each object is read as a GET reads it (``Buckets.plan``),
``MOUNT_AHEAD`` at once ahead of the one being sent, since a mount's source
has no packed neighbours to read together.

A member's turn moves the epoch readers, as a GET of it would.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from tiering import pool
from tiering.batch.ahead import Ahead
from tiering.batch.gathered import Gather, Gathered
from tiering.batch.hot import HotBatch, Pieces, close_all
from tiering.batch.member import Member, ReadOne, close_body, planned
from tiering.errors import NoSuchKey, TierstoreError
from tiering.hot.open_files import open_sized
from tiering.hot.tier import HotTier
from tiering.index.db import Index
from tiering.memo import ByIdentity
from tiering.meta import ObjectMeta
from tiering.model.names import check_key
from tiering.prefetch.epochs import Epochs
from tiering.reads.fetch import ExtentReader
from tiering.reads.plan import SMALL_READ, ReadTally

log = logging.getLogger("tierstore.batch")

MAX_KEYS = 10_000  # keys one batch may name (the gateway refuses more)
LOOKUP_CHUNK = 1024  # keys looked up per pool call
GROUP_BYTES = 4 * 1024 * 1024  # hot bodies read per pool call, at most
AHEAD_BYTES = 64 * 1024 * 1024  # cold object bytes fetched ahead of the member sent, at most
MOUNT_AHEAD = 16  # mounted objects read at once ahead of the member sent
# A batch of at most this many keys, all small (SMALL_READ) and hot, is a
# HotBatch: its files are all opened before its first byte, so the count
# bounds the descriptors one batch holds (as a read worker's batch).
HOT_OPEN = 256

T = TypeVar("T")



class BatchReads:
    """Batch reads of one node (built by ``ObjectService``)."""

    def __init__(self, index: Index, hot: HotTier, reader: ExtentReader, epochs: Epochs) -> None:
        self._index = index
        self._hot = hot
        self._reader = reader
        self._epochs = epochs
        # Per object version: each piece's hot-tier path, size and cache
        # name (None for a staged file), found again by the record's identity.
        self._places: ByIdentity[ObjectMeta, tuple[tuple[str, int, str | None], ...]] = ByIdentity(8192, "batch_places")

    def _places_of(self, meta: ObjectMeta) -> tuple[tuple[str, int, str | None], ...]:
        hot = self._hot
        out = []
        for c in meta.chunks:
            name = None if c.file_id is not None else c.extent.cache_name  # type: ignore[union-attr]
            out.append((hot.file_of(c.file_id, name), c.size, name))
        return tuple(out)

    def ahead_bytes(self) -> int:
        """How far ahead of the member sent cold bytes are fetched: a quarter
        of the hot tier's room (what is neither staged nor pinned), so what
        was fetched ahead is still cached when its turn comes."""
        room = max(0, self._hot.high - self._hot.fixed)
        return min(AHEAD_BYTES, room // 4)

    # -- managed buckets -----------------------------------------------------

    async def lookup(self, bucket: str, keys: Sequence[str]) -> list[ObjectMeta | TierstoreError]:
        """Each key's metadata, or its error (a bad name, NoSuchKey)."""
        found: list[ObjectMeta | TierstoreError] = []
        for start in range(0, len(keys), LOOKUP_CHUNK):
            found += await pool.run(self._lookup_sync, bucket, keys[start:start + LOOKUP_CHUNK])
        return found

    async def lookup_open(
        self, bucket: str, keys: Sequence[str], tally: ReadTally,
    ) -> tuple[list[ObjectMeta | TierstoreError], HotBatch | None]:
        """:meth:`lookup`, and, for a batch of at most HOT_OPEN keys whose
        objects are all small and hot, its files opened in the same pool
        call: a :class:`HotBatch` (None otherwise)."""
        if len(keys) > HOT_OPEN:
            return await self.lookup(bucket, keys), None
        now = self._lookup_open_now(bucket, keys)
        release: Callable[[int], None] = os.close  # a descriptor the pool opened is the batch's own
        if now is not None:
            found, files = now
            release = self._hot.open_files.release  # on the loop: kept descriptors, held
        else:
            found, files = await _owned(pool.run(self._lookup_open_sync, bucket, keys),
                                        lambda result: close_all(result[1]))
        if files is None:
            return found, None
        members = [Member(key, error=meta) if isinstance(meta, TierstoreError) else Member(key, meta)
                   for key, meta in zip(keys, found, strict=True)]
        # Members move the epoch readers of ``bucket`` if one is registered
        # now (an epoch registered while the batch is sent sees its later reads).
        observe = functools.partial(self._epochs.observe, bucket) if self._epochs.watching(bucket) else None
        return found, HotBatch(members, files, tally, observe, release)

    def _lookup_open_now(
        self, bucket: str, keys: Sequence[str],
    ) -> tuple[list[ObjectMeta | TierstoreError], list[Pieces | None]] | None:
        """:meth:`_lookup_open_sync` on the event loop, when every key's
        record is in the record cache and every file opens (None
        otherwise, nothing left open): no database read, and the opens a
        single hot GET's ``HotTier.read_now`` makes on the loop too. In the
        pool, each open gave the GIL up and took it back against the loop's
        thread (docs/batch.md)."""
        found: list[ObjectMeta | TierstoreError] | None = self._index.cached_objects(bucket, keys)  # type: ignore[assignment]
        if found is None:  # one not cached, or no such key: the pool looks them up
            return None
        files = self._open_pieces(found, on_loop=True)
        return None if files is None else (found, files)

    def _lookup_open_sync(
        self, bucket: str, keys: Sequence[str],
    ) -> tuple[list[ObjectMeta | TierstoreError], list[Pieces | None] | None]:
        found = self._lookup_sync(bucket, keys)
        return found, self._open_pieces(found, on_loop=False)

    def _open_pieces(self, found: list[ObjectMeta | TierstoreError], on_loop: bool) -> list[Pieces | None] | None:
        """Descriptors on every piece of every object of ``found`` (None
        for an error), or None (nothing left open) if one is larger than
        SMALL_READ or not all hot, or a cached extent's file is torn. On the
        loop, the kept descriptors, held (``OpenFiles.hold``: no path walk,
        no system call once kept and sized); in the pool, an open and an
        fstat each. Cached extents are opened without a hit (see
        :meth:`_read_group`), and counted as read."""
        hot = self._hot
        kept = hot.open_files
        take, release = (kept.hold, kept.release) if on_loop else (open_sized, os.close)
        opened: list[Pieces | None] = []
        try:
            for meta in found:
                if not isinstance(meta, ObjectMeta):
                    opened.append(None)
                    continue
                if meta.size > SMALL_READ:
                    raise _NotHot()
                pieces: Pieces = []
                opened.append(pieces)
                # The places kept per version are the loop's alone (the memo
                # is not for threads); the pool works them out again.
                places = self._places.get(meta, self._places_of) if on_loop else self._places_of(meta)
                for path, size, name in places:
                    offset = 0
                    if name is not None:
                        if not hot.is_cached(name):
                            raise _NotHot()
                        if (held := hot.in_log(name)) is not None:  # where it is now: not memoized
                            path, offset = held
                    # A cached extent's own file is checked for its size (torn by a crash?).
                    pieces.append((take(path, None if name is None or offset else size), offset, size))
        except (_NotHot, OSError):  # gone, torn, or out of descriptors: a streamed batch opens one at a time
            close_all(opened, release)
            return None
        except BaseException:
            close_all(opened, release)
            raise
        self._reader.hits += sum(1 for pieces in opened if pieces is not None)
        return opened

    def _lookup_sync(self, bucket: str, keys: Sequence[str]) -> list[ObjectMeta | TierstoreError]:
        out: list[ObjectMeta | TierstoreError] = []
        for key in keys:
            try:
                check_key(key)
            except TierstoreError as exc:
                out.append(exc)
                continue
            meta = self._index.get_object(bucket, key)
            out.append(meta if meta is not None else NoSuchKey(Key=key))
        return out

    async def managed(
        self, bucket: str, keys: Sequence[str], found: list[ObjectMeta | TierstoreError],
        read_one: ReadOne, tally: ReadTally,
    ) -> AsyncIterator[Member]:
        """The members of a managed bucket's batch, in order (``found``: from
        :meth:`lookup`; ``read_one``: for what is not hot)."""
        ahead = Ahead(self._reader, self._hot, found, self.ahead_bytes())
        try:
            position = 0
            while position < len(keys):
                ahead.advance(position)
                group = self._hot_group(found, position)
                if group:
                    bodies = await pool.run(self._read_group, [found[i] for i in group])
                    for i, body in zip(group, bodies, strict=True):
                        yield await self._member(bucket, keys[i], found[i], body, read_one, tally)
                    position = group[-1] + 1
                    continue
                await ahead.landed(position)
                yield await self._member(bucket, keys[position], found[position], None, read_one, tally)
                position += 1
        finally:
            await ahead.close()

    def _hot_group(self, found: list[ObjectMeta | TierstoreError], position: int) -> list[int]:
        """Positions from ``position`` on whose bodies are small and all hot
        (or that are errors), up to GROUP_BYTES of them: read in one call."""
        group: list[int] = []
        nbytes = 0
        hot = self._hot
        for i in range(position, len(found)):
            meta = found[i]
            if isinstance(meta, ObjectMeta):
                if meta.size > SMALL_READ or nbytes + meta.size > GROUP_BYTES and group:
                    break
                if any(c.file_id is None and not hot.is_cached(c.extent.cache_name)  # type: ignore[union-attr]
                       for c in meta.chunks):
                    break
                nbytes += meta.size
            group.append(i)
        return group

    def _read_group(self, metas: list[ObjectMeta | TierstoreError]) -> list[bytes | None]:
        """Blocking: the hot bodies of ``metas`` (None where a piece is gone:
        evicted, or a staged file flushed since the lookup, or torn).

        Cached extents are read without a hit on them: a batch is a scan,
        and under SIEVE a hit would keep the members already sent while the
        hand evicts the unvisited extents fetched ahead of the batch, which
        a batch larger than the hot tier needs next. Unvisited, the members
        sent (older) go first."""
        out: list[bytes | None] = []
        for meta in metas:
            if not isinstance(meta, ObjectMeta):
                out.append(None)
                continue
            try:
                pieces = [
                    self._hot.read(c.file_id, 0, c.size) if c.file_id is not None
                    else _read_file(*self._hot.where(None, c.extent.cache_name), c.size)  # type: ignore[union-attr]
                    for c in meta.chunks
                ]
            except (FileNotFoundError, _Torn):
                out.append(None)
                continue
            self._reader.hits += 1
            out.append(b"".join(pieces))
        return out

    async def _member(
        self, bucket: str, key: str, meta: ObjectMeta | TierstoreError, body: bytes | None,
        read_one: ReadOne, tally: ReadTally,
    ) -> Member:
        """The member of ``key``: its hot ``body``, else read as a GET is."""
        self._epochs.observe(bucket, key)
        if not isinstance(meta, ObjectMeta):
            return Member(key, error=meta)
        if body is not None:
            tally.hot += len(body)
            return Member(key, meta, body)
        return await planned(key, read_one, tally)

    # -- mounted buckets -----------------------------------------------------

    @staticmethod
    async def check_all(keys: Sequence[str], head: Callable[[str], Awaitable[object]]) -> None:
        """Raise the first missing key's error, in request order: a HEAD of
        each, MOUNT_AHEAD at once (a mounted batch that fails on a missing
        key must say so before its first byte)."""
        limit = asyncio.Semaphore(MOUNT_AHEAD)

        async def one(key: str) -> None:
            async with limit:
                check_key(key)
                await head(key)

        results = await asyncio.gather(*(one(k) for k in keys), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def mounted(
        self, bucket: str, keys: Sequence[str], read_one: ReadOne, tally: ReadTally,
        gather: Gather | None = None,
    ) -> AsyncIterator[Member]:
        """The members of a mounted bucket's batch, in order: each read as
        a GET reads it, MOUNT_AHEAD at once; with ``gather``, those other
        nodes keep are asked of them in runs (``tiering/batch/gathered.py``)."""
        tasks: dict[int, asyncio.Task[Member]] = {}
        gathered = Gathered(gather, bucket, keys, read_one, tally) if gather is not None else None

        def read(i: int) -> Awaitable[Member]:
            return gathered.member(i) if gathered is not None else planned(keys[i], read_one, tally)

        try:
            for position, key in enumerate(keys):
                for i in range(position, min(len(keys), position + MOUNT_AHEAD)):
                    if i not in tasks:
                        tasks[i] = asyncio.create_task(read(i))
                self._epochs.observe(bucket, key)
                yield await tasks.pop(position)
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            if gathered is not None:
                await gathered.close()
            for task in tasks.values():  # a body read ahead and never sent
                if not task.cancelled() and task.exception() is None:
                    await close_body(task.result().body)


async def _owned(job: Awaitable[T], release: Callable[[T], None]) -> T:
    """Await ``job`` (a pool call whose result holds descriptors); if the
    caller is cancelled meanwhile, ``release`` the result once it comes."""
    task = asyncio.ensure_future(job)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(
            lambda t: release(t.result()) if not t.cancelled() and t.exception() is None else None)
        raise


class _NotHot(Exception):
    """A member of a batch that cannot be a HotBatch."""


class _Torn(Exception):
    """A cache file of another size than its extent's: read as a GET reads it."""


def _read_file(path: str, offset: int, size: int) -> bytes:
    """A cached piece's bytes: a file of its own, which must be ``size``
    bytes long, or ``size`` bytes at ``offset`` of a log."""
    with open(path, "rb", buffering=0) as file:
        if offset:
            data = os.pread(file.fileno(), size, offset)
            if len(data) != size:
                raise _Torn(path)
            return data
        data = file.read(size + 1)
    if len(data) != size:
        raise _Torn(path)
    return data


