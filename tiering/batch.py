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
import itertools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tiering import pool
from tiering.epochs import Epochs
from tiering.errors import NoSuchKey, TierstoreError
from tiering.fetch import ExtentReader
from tiering.hot import HotTier
from tiering.index import Index
from tiering.memo import ByIdentity
from tiering.meta import Extent, ObjectMeta
from tiering.names import check_key
from tiering.open_files import open_sized
from tiering.prefetch import BULK_GAP, BULK_SPAN
from tiering.reads import NOW_READ, SMALL_READ, Body, ReadPlan, ReadTally

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
# The open pieces of one member's body, in order: (descriptor, bytes).
Pieces = list[tuple[int, int]]


@dataclass(slots=True)
class Member:
    """One key of a batch: its metadata and body, or why it has neither."""

    key: str
    meta: ObjectMeta | None = None
    body: Body | None = None
    error: TierstoreError | None = None


# The read of one object of the batch's bucket, as a GET reads it.
ReadOne = Callable[[str], Awaitable[ReadPlan]]


class BatchReads:
    """Batch reads of one node (built by ``ObjectService``)."""

    def __init__(self, index: Index, hot: HotTier, reader: ExtentReader, epochs: Epochs) -> None:
        self._index = index
        self._hot = hot
        self._reader = reader
        self._epochs = epochs
        # Per object version: each piece's hot-tier path, size and cache
        # name (None for a staged file), found again by the record's identity.
        self._places: ByIdentity[ObjectMeta, tuple[tuple[str, int, str | None], ...]] = ByIdentity(8192)

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
                                        lambda result: _close_all(result[1]))
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
                    if name is not None and not hot.is_cached(name):
                        raise _NotHot()
                    # A cached extent's file is checked for its size (torn by a crash?).
                    pieces.append((take(path, None if name is None else size), size))
        except (_NotHot, OSError):  # gone, torn, or out of descriptors: a streamed batch opens one at a time
            _close_all(opened, release)
            return None
        except BaseException:
            _close_all(opened, release)
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
        ahead = _Ahead(self._reader, self._hot, found, self.ahead_bytes())
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
                    else _read_file(self._hot.cache_path(c.extent.cache_name), c.size)  # type: ignore[union-attr]
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
        return await _planned(key, read_one, tally)

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
    ) -> AsyncIterator[Member]:
        """The members of a mounted bucket's batch, in order: each read as
        a GET reads it, MOUNT_AHEAD at once."""
        tasks: dict[int, asyncio.Task[Member]] = {}
        try:
            for position, key in enumerate(keys):
                for i in range(position, min(len(keys), position + MOUNT_AHEAD)):
                    if i not in tasks:
                        tasks[i] = asyncio.create_task(_planned(keys[i], read_one, tally))
                self._epochs.observe(bucket, key)
                yield await tasks.pop(position)
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            for task in tasks.values():  # a body read ahead and never sent
                if not task.cancelled() and task.exception() is None:
                    await _close(task.result().body)


class HotBatch:
    """A batch whose members are all known before its first byte: each an
    error or a small object whose every piece is open, so its bytes can no
    longer change (an eviction, a flush or a delete unlinks or renames a
    file; an open descriptor still reads it). The gateway lays out the
    answer whole and has the bodies read into its buffers, a run of
    members at a time (:meth:`read`); :meth:`close` when done.

    Built by ``BatchReads.lookup_open`` for a managed bucket, and by a read
    worker from the files it opened (``gateway/worker.py``)."""

    def __init__(self, members: list[Member], files: list[Pieces | None], tally: ReadTally,
                 observe: Callable[[str], None] | None = None,
                 release: Callable[[int], None] = os.close) -> None:
        self.members = members  # in order: ``meta`` or ``error`` set, never ``body``
        self._files = files  # per member, its open pieces (None for an error)
        self._tally = tally
        self._observe = observe  # a member's turn: the epoch readers move
        # What is done with a descriptor once read: closed, or a kept
        # one's hold released (``OpenFiles.release``, on the loop only).
        self._release = release
        self._closed = False

    async def read(self, start: int, views: Sequence[memoryview | None]) -> None:
        """Read the bodies of the members from ``start`` on into ``views``
        (one per member, each of its size; None for an error), and close
        their files. The members' turn has come: they count as read, and
        move the epoch readers.

        As a single GET's ``HotTier.read_now``: a body of at most NOW_READ
        bytes is read on the event loop with ``RWF_NOWAIT``, which fails
        rather than wait for the disk, the loop let go between steps of
        NOW_READ bytes; a larger body, or one not all in the page cache,
        is read by the pool (one call for the rest of the run). In the pool,
        each read gave the GIL up and took it back against the loop's
        thread: reading on the loop cost a fifth less CPU per object in a
        hot batch of 64 KiB objects (docs/batch.md)."""
        if self._closed:
            raise RuntimeError("read of a closed batch")
        files, members, observe, release = self._files, self.members, self._observe, self._release
        later: list[tuple[Pieces, memoryview]] = []  # their descriptors are this call's to release
        last = start + len(views) - 1
        step = 0
        try:
            for i, view in enumerate(views, start):
                if observe is not None:
                    observe(members[i].key)
                pieces = files[i]
                if pieces is None:
                    continue
                assert view is not None
                size = len(view)
                self._tally.hot += size
                done = size <= NOW_READ and _read_now(pieces, view)
                files[i] = None  # released below, or once ``later`` is read
                if not done:
                    later.append((pieces, view))
                    continue
                for fd, _ in pieces:
                    release(fd)
                step += size
                if step >= NOW_READ and i < last:
                    step = 0
                    await asyncio.sleep(0)  # others' turn on the loop
        except BaseException:
            _close_all([pieces for pieces, _ in later], release)
            raise
        if later:
            # Not cancelled with this call: the descriptors are released on
            # the loop once the pool is done with them.
            job = asyncio.ensure_future(pool.run(_read_into, later))
            job.add_done_callback(lambda done: _released(done, later, release))
            await asyncio.shield(job)

    def close(self) -> None:
        """Release the files of the members not read (those read were
        released by their read)."""
        if not self._closed:
            self._closed = True
            _close_all(self._files, self._release)


def _read_now(pieces: Pieces, view: memoryview) -> bool:
    """Read ``pieces`` into ``view`` if the page cache holds them all, else
    False (EAGAIN, a short read, no RWF_NOWAIT here): the pool reads them."""
    try:
        if len(pieces) == 1:  # most members: the whole view, no slice
            fd, size = pieces[0]
            return not size or os.preadv(fd, (view,), 0, os.RWF_NOWAIT) == size
        at = 0
        for fd, size in pieces:
            if size and os.preadv(fd, (view[at:at + size],), 0, os.RWF_NOWAIT) != size:
                return False
            at += size
    except OSError:
        return False
    return True


def _read_into(jobs: list[tuple[Pieces, memoryview]]) -> None:
    """Blocking: each job's pieces, in order, into its view."""
    for pieces, view in jobs:
        at = 0
        for fd, size in pieces:
            HotTier.pread_into(fd, view[at:at + size])
            at += size


def _released(done: asyncio.Future[None], jobs: list[tuple[Pieces, memoryview]],
              release: Callable[[int], None]) -> None:
    """On the loop, once the pool has read ``jobs``: their descriptors released."""
    if not done.cancelled():
        done.exception()  # retrieved: the caller, if it still waits, raises it
    _close_all([pieces for pieces, _ in jobs], release)


def _close_all(files: list[Pieces | None] | None, release: Callable[[int], None] = os.close) -> None:
    for pieces in files or ():
        for fd, _ in pieces or ():
            release(fd)


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


def _read_file(path: Path, size: int) -> bytes:
    with open(path, "rb", buffering=0) as file:
        data = file.read(size + 1)
    if len(data) != size:
        raise _Torn(path)
    return data


async def _planned(key: str, read_one: ReadOne, tally: ReadTally) -> Member:
    """One object read as a GET reads it; a failure becomes the member's error."""
    try:
        check_key(key)
        answer = await read_one(key)
    except TierstoreError as exc:
        return Member(key, error=exc)
    if isinstance(answer.body, bytes):
        tally.hot += answer.tally.hot
        tally.capacity += answer.tally.capacity
        return Member(key, answer.meta, answer.body)
    return Member(key, answer.meta, _counted(answer.body, answer.tally, tally))  # type: ignore[arg-type]


async def _counted(body: AsyncIterator[bytes], mine: ReadTally, total: ReadTally) -> AsyncIterator[bytes]:
    """A streamed body whose tally is added to the batch's as it goes."""
    try:
        async for block in body:
            yield block
    finally:
        total.hot += mine.hot
        total.capacity += mine.capacity
        await _close(body)


async def _close(body: object) -> None:
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        await aclose()


class _Ahead:
    """The cold extents of the objects ahead of a managed batch's member
    being sent, fetched in runs of packed neighbours (``fetch_many``), up
    to ``window`` object bytes ahead."""

    def __init__(self, reader: ExtentReader, hot: HotTier, found: list[ObjectMeta | TierstoreError],
                 window: int) -> None:
        self._reader = reader
        self._hot = hot
        self._found = found
        self._window = window
        self._planned = 0  # positions before this one were looked at
        # Object bytes before each position: what is pending ahead, in O(1).
        self._before = list(itertools.accumulate(
            (m.size if isinstance(m, ObjectMeta) else 0 for m in found), initial=0))
        self._landed: dict[str, asyncio.Event] = {}  # cache name -> set once cached
        self._fetch_of: dict[int, asyncio.Task[None]] = {}  # position -> the fetch that brings it
        self._tasks: set[asyncio.Task[None]] = set()

    def advance(self, position: int) -> None:
        """Fetch what is cold among the next ``window`` bytes of objects
        from ``position`` on, not asked for yet: one ``fetch_many`` for them."""
        if self._window <= 0:
            return
        self._planned = max(self._planned, position)
        # Top up once half the window was sent: fewer, larger calls.
        pending = self._before[self._planned] - self._before[position]
        if pending > self._window // 2:
            return
        extents: list[Extent] = []
        positions: list[int] = []
        nbytes = pending
        while self._planned < len(self._found) and nbytes < self._window:
            i = self._planned
            self._planned += 1
            meta = self._found[i]
            if not isinstance(meta, ObjectMeta):
                continue
            nbytes += meta.size
            cold = [c.extent for c in meta.chunks
                    if c.file_id is None and c.extent is not None and not self._hot.is_cached(c.extent.cache_name)]
            if cold:
                extents += cold
                positions.append(i)
        if not extents:
            return
        for ext in extents:
            self._landed.setdefault(ext.cache_name, asyncio.Event())
        task = asyncio.create_task(self._fetch(extents))
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        for i in positions:
            self._fetch_of[i] = task

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # retrieved: the members read alone
            log.warning("batch read-ahead failed: %s", task.exception())

    async def _fetch(self, extents: list[Extent]) -> None:
        def filled(ext: Extent) -> None:
            event = self._landed.get(ext.cache_name)
            if event is not None:
                event.set()

        # Failures are not raised here: the member whose extent failed is
        # read alone in its turn, which fetches (and reports) it again.
        await self._reader.fetch_many(extents, gap=BULK_GAP, span=BULK_SPAN, on_filled=filled)

    async def landed(self, position: int) -> None:
        """Wait until the member at ``position`` is cached, or the fetch that
        was to bring it has ended (it may have failed: the member is then
        read alone)."""
        task = self._fetch_of.pop(position, None)
        meta = self._found[position]
        if task is None or not isinstance(meta, ObjectMeta):
            return
        events = [self._landed[c.extent.cache_name] for c in meta.chunks
                  if c.extent is not None and c.extent.cache_name in self._landed]
        waiting = [asyncio.ensure_future(e.wait()) for e in events if not e.is_set()]
        if not waiting:
            return
        gathered = asyncio.ensure_future(asyncio.gather(*waiting))
        try:
            await asyncio.wait([gathered, task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gathered.cancel()
            for w in waiting:
                w.cancel()

    async def close(self) -> None:
        """Stop what is still being fetched (the stream ended or was cut)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
