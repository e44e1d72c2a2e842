"""The pieces of a mounted object: where each one's bytes come from.

A mounted object is cached in the hot tier one file per ``part_size`` piece
(:func:`piece_name`). A read asks for a piece
and gets, in this order: its bytes still being written to the hot tier by
the read that fetched them (:class:`Held`), a descriptor on its cached
file, the piece arriving from the source right now (an :class:`Arrival`
another read started), or a fetch of its own.

A fetch of a large piece on the node that keeps it is live: the source's
bytes land in one buffer as they come (``get_range_into``, If-Match on the
validated ETag, a retry resumes at the first byte missing), readers send
them on at once, and the buffer is cached behind the answer. A client's
first bytes leave once the first half MiB of the first piece is in,
instead of after the whole piece (and the seven others fetched beside it,
sharing the source's bandwidth). S3 sends no checksum of a range: such a
piece is checked by its length, so a byte is sent once it landed, and a
range ends as soon as its own bytes are in (a loader reading a shard in
1 MiB ranges does not wait for the rest of the piece); an answer the
source cuts short is retried from the byte missing, of the same version,
and a read whose piece cannot be had is cut short, never completed with
other bytes (``tiering/reads/arrival.py``). A piece that is the whole
object is small, read whole, and checked against the store's checksum or
the MD5 ETag where the mount asks (``tiering/mounts/checks.py``). Pieces another node owns, or
one handed over by the node that kept it before, are fetched whole.

How many pieces are in flight ahead of the one being sent follows the
source's bandwidth-delay product (``tiering/reads/window.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from packer.ranges import ByteRange, split_over
from tiering import pool
from tiering.capacity.store import pour
from tiering.errors import CapacityError, CapacityNotFound, NoSuchKey, ServiceUnavailable
from tiering.hot.fills import BEHIND, Fills
from tiering.hot.tier import HotTier
from tiering.meta import Mount, ObjectMeta
from tiering.mounts.checks import whole
from tiering.mounts.owners import MountOwners, PeerRefused
from tiering.mounts.source import SourceBucket
from tiering.reads.arrival import Arrival
from tiering.reads.fetch import LIVE_READ
from tiering.reads.flight import SingleFlight
from tiering.reads.plan import Block, ReadTally
from tiering.reads.readahead import Held, Peered, Source, stream
from tiering.reads.window import Fetch, Window
from tiering.settings import TierSettings

# First bytes of large objects kept for the read that follows their describing GET
# (MountPieces.first_bytes): 1 MiB each at most (the describing GET's length).
_FIRSTS = 16


def piece_name(mount: str, key: str, etag: str, index: int) -> str:
    """The hot-tier cache name of one piece of a mounted object version."""
    digest = hashlib.sha256(f"{mount}\0{key}\0{etag}".encode()).hexdigest()[:40]
    return f"m{digest}-{index:x}"


class MountPieces:
    """The pieces of every mount's objects on one node: cached, held,
    arriving or fetched."""

    def __init__(self, hot: HotTier, settings: TierSettings, owners: MountOwners | None,
                 client: Callable[[str], Awaitable[SourceBucket]], mount: Callable[[str], Mount],
                 unreachable: Callable[[Mount, CapacityError], Exception]) -> None:
        self._hot = hot
        self._settings = settings
        self._owners = owners
        self._client = client
        self._mount = mount
        self._unreachable = unreachable
        self._flight: SingleFlight[bytes] = SingleFlight()
        self._live: dict[str, Arrival] = {}  # pieces arriving now, by hot-tier name
        self._firsts: dict[str, bytes] = {}  # large objects' first bytes, by piece 0's name (first_bytes)
        self._arrivals: set[asyncio.Task[Any]] = set()
        self.window = Window(settings.part_size, settings.fetch_concurrency)
        # Pieces fetched from the source and being written to the hot tier
        # behind the answer that brought them: a read meanwhile takes the
        # bytes from here rather than asking the source again.
        self.fills = Fills(hot)

    async def close(self) -> None:
        for task in list(self._arrivals):
            task.cancel()
        await asyncio.gather(*self._arrivals, return_exceptions=True)
        await self.fills.drain()

    def owner(self, name: str, key: str) -> str | None:
        """The node that keeps the object's bytes; None for this one."""
        return self._owners.of(name, key) if self._owners is not None else None

    def fill_behind(self, name: str, key: str, piece: str, data: bytes) -> None:
        """Cache ``piece`` in the hot tier without holding up the answer
        that fetched it (a file write and a rename, by the fills' writer);
        on a node that does not own the object, keep nothing: its owner does."""
        if self.owner(name, key) is None:
            self.fills.write(piece, data)

    async def read(self, meta: ObjectMeta, wanted: ByteRange, tally: ReadTally,
                   ask_peers: bool = True, blocks: bool = False) -> AsyncIterator[Block]:
        """Yield ``wanted`` of a mounted object: cached pieces from the hot
        tier, the others fetched (as many ahead as the source's window
        says) with ranged GETs of that version only, then cached. With
        ``blocks`` (the server is the consumer), a cached piece goes as a
        region of its file (``sendfile``) and an arriving one as views."""
        part = self._settings.part_size
        count = max(1, -(-meta.size // part))
        sizes = [min(part, meta.size - i * part) for i in range(count)] if meta.size else [0]
        pieces = list(split_over(sizes, wanted))
        window = self.window.pieces() if len(pieces) > 1 else 1
        async for block in stream(pieces, lambda index: self.open(meta, index, sizes[index], ask_peers),
                                  window=window, tally=tally, blocks=blocks):
            yield block

    async def open(self, meta: ObjectMeta, index: int, size: int, ask_peers: bool = True) -> Source:
        """A descriptor on the cached piece, its held bytes, its arrival,
        or its bytes after a fetch."""
        name = piece_name(meta.bucket, meta.key, meta.etag, index)
        held = self.fills.held(name)
        if held is not None:
            return Held(held)
        if self._hot.is_cached(name) and (fd := await pool.run(self._hot.open_cached, name, size)) is not None:
            return fd
        if (live := self._live.get(name)) is not None:
            return live
        if self._goes_live(meta, size, name, ask_peers):
            return self._arrive(meta, index, size, name)
        data, leader = await self._flight.run(name, lambda: self._fetch(meta, index, size, ask_peers))
        if leader and not isinstance(data, Peered):
            self.fill_behind(meta.bucket, meta.key, name, data)
        elif leader and data.kept:  # a share handed over; else what a peer sent, its owner keeps
            self.fill_behind(meta.bucket, meta.key, name, data.data)
        return data

    def _goes_live(self, meta: ObjectMeta, size: int, name: str, ask_peers: bool) -> bool:
        """A large piece of a larger object, kept here, asked of the source alone."""
        if size <= LIVE_READ or size == meta.size or name in self._flight:
            return False
        if ask_peers and self.owner(meta.bucket, meta.key) is not None:
            return False  # its owner keeps it: asked of that node, whole
        return self._owners is None or self._owners.before(meta.bucket, meta.key) is None

    def first_bytes(self, meta: ObjectMeta, data: bytes) -> None:
        """Keep the first bytes of a large object, brought by the GET that
        described it, for a moment: a read of its first piece that follows
        starts from them and asks the source for the rest only, so its
        client's first byte waits one round trip to the source, not two.
        At most ``_FIRSTS`` are kept, the oldest dropped (a read of another
        range never asks for them)."""
        name = piece_name(meta.bucket, meta.key, meta.etag, 0)
        if 0 < len(data) < min(self._settings.part_size, meta.size):
            self._firsts[name] = data
            while len(self._firsts) > _FIRSTS:
                del self._firsts[next(iter(self._firsts))]

    def _arrive(self, meta: ObjectMeta, index: int, size: int, name: str) -> Arrival:
        arrival = Arrival(size, None)
        if index == 0 and (first := self._firsts.pop(name, None)) is not None:
            pour(arrival, first)  # the describing GET's bytes: the rest is asked from where they end
        self._live[name] = arrival
        task = asyncio.ensure_future(self._land(meta, index, size, name, arrival))
        self._arrivals.add(task)
        task.add_done_callback(functools.partial(self._landed, name, arrival))
        return arrival

    async def _land(self, meta: ObjectMeta, index: int, size: int, name: str, arrival: Arrival) -> None:
        """Read the piece into ``arrival`` (readers send its bytes on
        meanwhile), then cache it behind the answer: the buffer readers
        sent slices of is what the fill writes."""
        start = index * self._settings.part_size
        await self.fills.room(BEHIND * size)  # the pieces before it written, but for a few
        await arrival.reserve()
        async with self.window.slot() as fetch:
            into = _Counted(arrival, fetch)
            await self._source_call(meta, lambda client: client.get_range_into(
                meta.key, start + arrival.received, start + size, into, if_match=meta.etag))
        if arrival.received != size:  # the store's answer ended short: every retry did
            raise ServiceUnavailable(f"{meta.key}: the source sent {arrival.received} of {size} bytes; retry")
        await arrival.verdict()
        self.fill_behind(meta.bucket, meta.key, name, arrival.data)  # type: ignore[arg-type]  # written once
        arrival.settle(arrival.data)

    def _landed(self, name: str, arrival: Arrival, task: asyncio.Task[Any]) -> None:
        self._arrivals.discard(task)
        if self._live.get(name) is arrival:
            del self._live[name]
        arrival.failed_with(task, "piece")

    async def _fetch(self, meta: ObjectMeta, index: int, size: int, ask_peers: bool = True) -> bytes | Peered:
        start = index * self._settings.part_size
        owner = self.owner(meta.bucket, meta.key) if ask_peers else None
        if owner is not None:
            # The owner checked these bytes against the source's MD5 when they
            # came in, and sends them only for this version (If-Match) and
            # at this length: hashing them again here would cost more than
            # the rest of a peer hit (docs/scale-out.md). Whatever fails
            # goes to the source.
            with contextlib.suppress(PeerRefused, CapacityError):
                return Peered(await self._owners.piece(owner, meta, start, start + size))  # type: ignore[union-attr]
        # Ours now: from the node that kept it, if it still does (checked as the source's).
        handed = await self._owners.handed_piece(meta, start, start + size) if self._owners is not None else None

        async def get(client: SourceBucket) -> bytes:
            return await client.get_range(meta.key, start, start + size, if_match=meta.etag)

        async def fetch(client: SourceBucket) -> bytes:
            data = await get(client) if handed is None else handed
            if size != meta.size:
                return data
            return await whole(data, meta.etag, lambda: get(client), check_md5=self._mount(meta.bucket).check_md5)

        checked = await self._source_call(meta, fetch)
        return Peered(checked, kept=True) if checked is handed else checked

    async def _source_call(self, meta: ObjectMeta, call: Callable[[SourceBucket], Awaitable[Any]]) -> Any:
        """``call`` on the mount's source client, its failures as S3 answers them."""
        try:
            return await call(await self._client(meta.bucket))
        except CapacityNotFound:
            raise NoSuchKey("The object was deleted at the source while it was read", Key=meta.key) from None
        except CapacityError as exc:
            mount = self._mount(meta.bucket)
            if exc.detail.get("status") == 412:
                raise ServiceUnavailable(
                    f"{meta.key} changed at the source ({mount.source}) while it was read; retry"
                ) from None
            raise self._unreachable(mount, exc) from None


class _Counted:
    """The ``Into`` of a live piece's GET: its arrival, with the bytes
    counted toward the window's measure of the source."""

    __slots__ = ("_arrival", "_fetch")

    def __init__(self, arrival: Arrival, fetch: Fetch) -> None:
        self._arrival, self._fetch = arrival, fetch

    def buffer(self) -> memoryview:
        return self._arrival.buffer()

    def landed(self, count: int) -> None:
        self._fetch.landed(count)
        self._arrival.landed(count)
