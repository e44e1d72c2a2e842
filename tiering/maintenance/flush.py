"""The flusher: staged writes into segments in the capacity tier.

A round reads the flush queue (oldest first) and the pending footer records,
packs small objects into segments of about ``segment_size`` (one capacity
PUT each), streams each large object into a segment of its own, and after
every upload commits, in one index batch, the new extents of every version
that is still current. Staged files then become clean cache. A crash before
the commit leaves the queue as it was: the round is redone after restart
and the uploaded segment, unreferenced, is removed at start-up.

Rounds run every ``flush_delay`` seconds, sooner when a segment's worth of
data is waiting, when a write-through PUT or an operator asks, or when
staged data crowds the hot tier.

The bytes a segment build holds are reserved in the process's admission
(``tiering/admission.py``) first; a flush makes room, so after a short
wait it takes them regardless, and new requests are refused meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterable
from dataclasses import replace

from packer import format as seg
from tiering import pool
from tiering.admission import ADMISSION
from tiering.capacity import CapacityStore
from tiering.capacity.layout import segment_path
from tiering.cluster.writing import SoleWriter, Writing
from tiering.errors import CapacityError, InsufficientStorage, ServiceUnavailable, SlowDown
from tiering.hot.tier import HotTier
from tiering.index.bucket_settings import Policies
from tiering.index.db import Index
from tiering.index.tiers import QUEUE_BATCH, FlushItem, by_bucket
from tiering.jobs import Job
from tiering.maintenance.rounds import Rounds
from tiering.maintenance.segments import (
    Piece,
    SegmentStream,
    add_record,
    encode_pieces,
    manifest,
    segment_info,
)
from tiering.meta import Chunk, SegmentInfo, now_ms
from tiering.settings import TierSettings

log = logging.getLogger("tierstore.flush")

_MAX_BACKOFF = 30.0
# Footer records alone (tombstones, bucket events) ride along with the next
# data segment; only when none comes for this long do they get a segment of
# their own. A delete-heavy, write-free workload then makes one tiny segment
# a minute instead of one per flush delay. The records are durable in the
# index meanwhile; what waits is only their copy in the capacity tier.
RECORDS_DELAY_MS = 60_000


def _label(item: FlushItem) -> Piece:
    if item.meta is not None:
        return Piece(item.meta.bucket, item.meta.key, item.meta.seq)
    assert item.upload is not None and item.part is not None
    return Piece(item.upload.bucket, item.upload.key, item.part.part_number, item.upload.upload_id)


def _chunks(item: FlushItem) -> tuple[Chunk, ...]:
    if item.meta is not None:
        return item.meta.chunks
    assert item.part is not None
    return item.part.chunks


def _staged_bytes(item: FlushItem) -> int:
    return sum(c.size for c in _chunks(item) if c.file_id is not None)


class Flusher:
    """Moves staged writes into segments; one per node, run by ``Tiers``.

    Also where writers wait: a write-through PUT until its version is in a
    segment (``wait_flushed``), a write-through DELETE until its tombstone is
    (``wait_records``)."""

    def __init__(
        self,
        index: Index,
        hot: HotTier,
        capacity: CapacityStore,
        settings: TierSettings,
        layout: asyncio.Lock,
        policies: Policies,
        writing: Writing | None = None,
        rounds: Rounds | None = None,
    ) -> None:
        self._index = index
        # Which buckets this node may upload segments for, one bucket per
        # segment or mixed, and their names (``tiering/cluster/writing.py``).
        self._writing = writing if writing is not None else SoleWriter(index)
        self._hot = hot
        self._capacity = capacity
        self._settings = settings
        self._policies = policies
        self._layout = layout  # held while segments change: flush or compaction, never both
        self._rounds = rounds if rounds is not None else Rounds()  # flush_all's, shielded
        self._wake = asyncio.Event()
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._record_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._backlog = 0
        self._urgent = False
        self.segments_written = 0
        self.objects_flushed = 0
        self.last_error: str | None = None

    # -- triggers ----------------------------------------------------------

    def note_staged(self, size: int) -> None:
        """A write staged ``size`` bytes; a segment's worth starts a round."""
        self._backlog += size
        if self._backlog >= self._settings.segment_size:
            self._wake.set()

    def request(self) -> None:
        """Start a round now (write-through, hot-tier pressure, operator)."""
        self._urgent = True
        self._wake.set()

    async def wait_flushed(self, seq: int, timeout: float) -> None:
        """Wait until the version with sequence ``seq`` is in the capacity
        tier (or superseded). ServiceUnavailable when a round that started
        after this call fails (the capacity store refused it after its
        retries), or after ``timeout``."""
        future = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(seq, []).append(future)
        try:
            await self._wait(future, timeout, "write")
        finally:
            waiting = self._waiters.get(seq)
            if waiting is not None and future in waiting:
                waiting.remove(future)
                if not waiting:
                    del self._waiters[seq]

    async def wait_records(self, seq: int, timeout: float) -> None:
        """Wait until every footer record (tombstone, bucket event) queued
        up to sequence ``seq`` is in the capacity tier. ServiceUnavailable
        as ``wait_flushed``."""
        future = asyncio.get_running_loop().create_future()
        self._record_waiters.append((seq, future))
        try:
            await self._wait(future, timeout, "delete")
        finally:
            self._record_waiters = [(s, f) for s, f in self._record_waiters if f is not future]

    async def _wait(self, future: asyncio.Future[None], timeout: float, what: str) -> None:
        """Start a round and wait for ``future`` (set when the round wrote it)."""
        self.request()
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            raise ServiceUnavailable(
                f"The capacity store did not take the {what} in time"
                + (f" ({self.last_error})" if self.last_error else "")
            ) from None

    def _waiting(self) -> list[tuple[asyncio.Future[None], str]]:
        """The writers waiting now, each with what it waits for."""
        writes = [(f, "write") for futures in self._waiters.values() for f in futures]
        return writes + [(f, "delete") for _, f in self._record_waiters]

    @staticmethod
    def _fail(waiting: list[tuple[asyncio.Future[None], str]], exc: Exception) -> None:
        """A round failed after the capacity store's own retries: the writers
        waiting for it get 503 now rather than when their timeout ends (past
        an S3 client's read timeout, 60 s in botocore, they would never see
        it). Their writes stay committed and are flushed by a later round."""
        for future, what in waiting:
            if not future.done():
                future.set_exception(
                    ServiceUnavailable(f"The capacity store did not take the {what}: {exc}")
                )

    async def _settle_records(self) -> None:
        if not self._record_waiters:
            return
        pending = await pool.run(self._index.pending_records, 1)
        oldest = pending[0][0] if pending else None
        for seq, future in self._record_waiters:
            if (oldest is None or seq < oldest) and not future.done():
                future.set_result(None)

    def _settle(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            for future in self._waiters.pop(seq, []):
                if not future.done():
                    future.set_result(None)

    # -- the loop ----------------------------------------------------------

    async def run(self) -> None:
        """Flush forever; failures back off and retry (nothing is dropped)."""
        failures = 0
        while True:
            timed_out = False
            try:
                # Not asyncio.wait_for: on Python 3.11 it drops a cancellation
                # that arrives in the step the event is set, and the task
                # would run a round during shutdown.
                async with asyncio.timeout(self._settings.flush_delay):
                    await self._wake.wait()
            except TimeoutError:
                timed_out = True
            self._wake.clear()
            # Woken because a segment's worth is waiting: write full segments
            # only and let the rest fill up. On the timer or on request,
            # write everything.
            urgent, self._urgent = self._urgent, False
            waiting = self._waiting()
            try:
                await self.flush_round(force=urgent, whole=timed_out or urgent)
                await self._settle_records()
                failures, self.last_error = 0, None
            except Exception as exc:
                failures += 1
                self.last_error = str(exc) or type(exc).__name__
                self._fail(waiting, exc)
                delay = min(_MAX_BACKOFF, 0.5 * 2**failures) * random.uniform(0.5, 1.0)
                # A store that failed, or a disk without room for the index's commit.
                if isinstance(exc, (CapacityError, OSError, SlowDown, InsufficientStorage)):
                    log.warning("flush failed (%s); retrying in %.1fs", exc, delay)
                else:
                    log.exception("flush failed unexpectedly; retrying in %.1fs", delay)
                await asyncio.sleep(delay)

    async def flush_all(self, job: Job | None = None) -> None:
        """Flush everything queued now, footer records included (operator
        request, tests); ``job`` follows the objects and bytes written."""
        if job is not None:
            job.expect(await pool.run(self._index.flush_queue_length), self._hot.staged)
        # Shielded: cancelling the job stops it between rounds, never inside
        # an upload-and-commit.
        while await self._rounds.shielded(self.flush_round(force=True, job=job)):
            pass
        await self._settle_records()

    async def flush_round(self, force: bool = False, whole: bool = True, job: Job | None = None) -> bool:
        """One pass over the queue; True if it had anything to do. With
        ``whole`` False, a last packed segment short of ``segment_size`` is
        left for a later round."""
        async with self._layout:
            items = await pool.run(self._index.flush_queue, QUEUE_BATCH)
            records = await pool.run(self._index.pending_records, QUEUE_BATCH)
            stale = [i.fseq for i in items if i.meta is None and i.part is None]
            # Among several gateways, the records wait no longer than data
            # does: replicas learn of deletes and buckets from them.
            if len(stale) == len(items) and records and not force and not self._writing.per_bucket:
                oldest = min(r.get("at", 0) for _, r in records)
                if now_ms() - oldest < RECORDS_DELAY_MS:
                    records = []  # wait for data to ride along with
            if not items and not records:
                return False
            self._backlog = 0
            if not self._writing.per_bucket:
                await self._flush_bucket("", items, records, stale, whole, job)
                return True
            # One bucket per segment, only the buckets this node writes; the
            # rest stay queued (a writer that lost a lease keeps them).
            did = False
            for bucket, (mine, theirs) in sorted(by_bucket(items, records).items()):
                if self._writing.may_write(bucket):
                    await self._flush_bucket(bucket, mine, theirs, [], whole, job)
                    did = True
            if stale:
                await self._flush_packed("", [], [], stale, job)
            return did or bool(stale)

    async def _flush_bucket(
        self,
        bucket: str,
        items: list[FlushItem],
        records: list[tuple[int, dict]],
        stale: list[int],
        whole: bool,
        job: Job | None,
    ) -> None:
        """Write ``items`` and ``records`` (of ``bucket``, or of any bucket
        on a gateway alone) into segments."""
        packed: list[FlushItem] = []
        size = 0
        for item in items:
            if item.meta is None and item.part is None:
                continue
            staged = _staged_bytes(item)
            if staged > self._policies.settings(_label(item).bucket).small_object_size:
                await self._flush_alone(item, job)
                continue
            packed.append(item)
            size += staged
            if size >= self._settings.segment_size:
                await self._flush_packed(bucket, packed, records, stale, job)
                packed, records, stale, size = [], [], [], 0
        if not whole and size < self._settings.segment_size:
            packed, records = [], []  # stay queued: the timer or more data takes them
        if packed or records or stale:
            await self._flush_packed(bucket, packed, records, stale, job)
        self._backlog += size if not packed else 0

    async def _flush_packed(
        self,
        bucket: str,
        items: list[FlushItem],
        records: list[tuple[int, dict]],
        stale: list[int],
        job: Job | None = None,
    ) -> None:
        if not items and not records:
            await pool.run(self._index.commit_flush_stale, stale)
            self._settle(stale)
            return
        name = await self._writing.name(bucket)
        # The segment is built whole, from its entries (twice its bytes
        # until they are joined): reserved, so new requests are refused
        # meanwhile rather than the flush that makes room put off.
        held = 2 * sum(_staged_bytes(item) for item in items)
        await ADMISSION.force(held)
        try:
            data, done, info = await pool.run(self._pack, name, items, [r for _, r in records])
            await self._capacity.put(segment_path(name), data)
            del data
        finally:
            ADMISSION.give(held)
        # Landed while the term it is named in held the lease: only then does
        # it count (else the items stay queued for the next holder's term).
        self._writing.check(bucket, name)
        adopted = await pool.run(self._index.commit_flush, info, done, stale, [q for q, _ in records])
        self._writing.committed(bucket, name)
        await pool.run(self._adopt, adopted, done)
        self._written(done, job)
        self._settle([*stale, *(item.fseq for item, _ in done)])

    def _written(self, done: list[tuple[FlushItem, tuple[Chunk, ...]]], job: Job | None) -> None:
        self.segments_written += 1
        self.objects_flushed += sum(1 for item, _ in done if item.meta is not None)
        if job is not None:
            job.advance(len(done), sum(_staged_bytes(item) for item, _ in done))

    def _pack(
        self, name: str, items: list[FlushItem], records: list[dict]
    ) -> tuple[bytes, list[tuple[FlushItem, tuple[Chunk, ...]]], SegmentInfo]:
        encoder = seg.SegmentEncoder(name, now_ms())
        out = [encoder.header()]
        done = []
        for item in items:
            label = _label(item)
            settings = self._policies.settings(label.bucket)
            try:
                chunks = encode_pieces(encoder, out, label, _chunks(item), self._hot, settings)
            except FileNotFoundError:
                continue  # replaced while we packed: stays queued, found stale next round
            done.append((item, chunks))
            if item.meta is not None:
                encoder.add_record(manifest(replace(item.meta, chunks=chunks)))
        for record in records:
            add_record(encoder, record)
        out.append(encoder.finish())
        data = b"".join(out)
        return data, done, segment_info(encoder, len(data))

    async def _flush_alone(self, item: FlushItem, job: Job | None = None) -> None:
        """A large object or part: a segment of its own, streamed."""
        bucket = _label(item).bucket
        name = await self._writing.name(bucket)
        settings = self._policies.settings(_label(item).bucket)
        stream = SegmentStream(self._capacity, name, settings)
        # A part read back, its encoded entry and the upload's buffer.
        held = 3 * settings.part_size
        await ADMISSION.force(held)
        try:
            chunks = await stream.add_staged(_label(item), _chunks(item), self._hot)
            records = []
            if item.meta is not None:
                records.append(manifest(replace(item.meta, chunks=chunks)))
            info = await stream.finish(records)
        except FileNotFoundError:
            await stream.abort()
            return
        except BaseException:
            await stream.abort()
            raise
        finally:
            ADMISSION.give(held)
        self._writing.check(bucket, name)  # as in _flush_packed
        done = [(item, chunks)]
        adopted = await pool.run(self._index.commit_flush, info, done, [], [])
        self._writing.committed(bucket, name)
        await pool.run(self._adopt, adopted, done)
        self._written(done, job)
        self._settle([item.fseq])

    def _adopt(
        self, adopted: list[tuple[str, str]], done: list[tuple[FlushItem, tuple[Chunk, ...]]]
    ) -> None:
        """Flushed files become cache; pinned ones stay pinned."""
        pinned = {
            c.extent.cache_name
            for item, chunks in done
            if self._policies.pinned(_label(item).bucket, _label(item).key)
            for c in chunks
            if c.extent is not None
        }
        for file_id, cache_name in adopted:
            self._hot.adopt(file_id, cache_name, cache_name in pinned)
