"""Compaction: reclaim capacity-tier space held by dead extents.

Deletes and overwrites leave dead entries in immutable segments. A segment
nothing uses (no live bytes, no pinned footer record) is deleted outright.
A segment whose live fraction fell below ``compact_threshold`` is rewritten:
its live entries are copied as stored (no recompression) into a new segment,
together with a fresh manifest for every object that had bytes or its
manifest in the old one, and every tombstone that may still be needed. The
index switches to the new segment in one batch, then the old one is deleted.

Order matters for crash safety: new segment uploaded -> index commit -> old
segment deleted. A crash before the commit leaves an unreferenced new
segment (removed at start-up); after it, an unreferenced old one (likewise).
A rebuild from footers in between sees both copies with the same sequence
numbers and takes the newer segment's; tombstones are carried, so a deleted
key stays deleted.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

from packer import format as seg
from tiering import pool
from tiering.capacity import CapacityStore
from tiering.capacity.layout import read_footer, segment_path
from tiering.cluster.writing import SoleWriter, Writing
from tiering.errors import (
    CapacityNotFound,
    InsufficientStorage,
    NotWriter,
    ServiceUnavailable,
    SlowDown,
)
from tiering.hot.tier import HotTier
from tiering.index.db import Index
from tiering.jobs import Job
from tiering.maintenance.rounds import Rounds
from tiering.maintenance.segments import extent_of, manifest, segment_info
from tiering.meta import Extent, ObjectMeta, SegmentInfo, now_ms
from tiering.settings import TierSettings

log = logging.getLogger("tierstore.compact")

@dataclass(slots=True)
class CompactionReport:
    deleted: int = 0  # segments removed with nothing to copy
    merged: int = 0  # segments holding only footer records, merged into one
    rewritten: int = 0
    skipped: int = 0  # changed under us or in use by an open upload; next pass
    bytes_reclaimed: int = 0


def candidates(segments: list[SegmentInfo], threshold: float) -> list[SegmentInfo]:
    """Segments worth work: unused ones, then the emptiest first."""
    unused = [s for s in segments if s.live <= 0 and s.pins <= 0]
    sparse = [s for s in segments if s.data > 0 and s.live < threshold * s.data and s not in unused]
    sparse.sort(key=lambda s: s.live / s.data)
    return unused + sparse


class Compactor:
    """Reclaims dead bytes in the capacity tier; one per node, run by ``Tiers``."""

    def __init__(
        self,
        index: Index,
        hot: HotTier,
        capacity: CapacityStore,
        settings: TierSettings,
        layout: asyncio.Lock,
        writing: Writing | None = None,
        rounds: Rounds | None = None,
    ) -> None:
        self._index = index
        # As the flusher's: which segments this node may rewrite, and names.
        self._writing = writing if writing is not None else SoleWriter(index)
        self._hot = hot
        self._capacity = capacity
        self._settings = settings
        self._layout = layout  # taken by each round itself, in its own task: see rounds.py
        self._rounds = rounds if rounds is not None else Rounds()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._settings.compact_interval)
            try:
                await self.compact()
            except (NotWriter, ServiceUnavailable):
                continue  # a writer that lost its lease: the new one compacts
            except (SlowDown, InsufficientStorage) as exc:
                log.warning("compaction deferred: %s", exc)  # a full disk: the next pass tries again
            except Exception:
                log.exception("compaction failed")

    async def compact(self, threshold: float | None = None, job: Job | None = None) -> CompactionReport:
        """One pass; ``job`` follows the segments (and their bytes) handled."""
        threshold = self._settings.compact_threshold if threshold is None else threshold
        report = CompactionReport()
        segments = await pool.run(self._index.segments)
        work = candidates([s for s in segments if self._writing.compactable(s.name)], threshold)
        if job is not None:
            job.expect(len(work), sum(s.size for s in work))
        for info in work:
            # Shielded: cancelling the job stops it between segments.
            await self._rounds.shielded(self._compact_one(info.name, report))
            if job is not None:
                job.advance(1, info.size)
        # Segments with no data, only footer records (deletes, bucket events,
        # manifests of metadata-only changes), would pile up one per quiet
        # minute: merge them into one.
        await self._rounds.shielded(self._merge(report))
        return report

    async def _compact_one(self, name: str, report: CompactionReport) -> None:
        """Delete the segment if unused, else rewrite what is live in it."""
        async with self._layout:
            if self._writing.compactable(name):
                await self._compact_locked(name, report)

    async def _compact_locked(self, name: str, report: CompactionReport) -> None:
        current = await pool.run(self._index.get_segment, name)
        if current is None:
            return
        if current.live <= 0 and current.pins <= 0:
            if await pool.run(self._index.forget_segment, current.name):
                await self._capacity.delete(segment_path(current.name))
                self._writing.deleted(self._writing.bucket_of(current.name) or "", 1)
                report.deleted += 1
                report.bytes_reclaimed += current.size
            return
        outcome = await self._rewrite([current])
        if outcome is None:
            report.skipped += 1
        else:
            report.rewritten += 1
            report.bytes_reclaimed += outcome

    async def _merge(self, report: CompactionReport) -> None:
        """Merge the record-only segments, listed under the lock: a pass
        running beside this one may have merged or deleted some meanwhile."""
        async with self._layout:
            groups: dict[str | None, list[SegmentInfo]] = {}
            for info in await pool.run(self._index.segments):
                if info.data == 0 and info.pins > 0 and self._writing.compactable(info.name):
                    groups.setdefault(self._writing.bucket_of(info.name), []).append(info)
            for olds in groups.values():
                if len(olds) < 2:
                    continue
                outcome = await self._rewrite(olds)
                if outcome is not None:
                    report.merged += len(olds)
                    report.bytes_reclaimed += outcome

    async def _tombstone_needed(self, tomb: seg.Tombstone) -> bool:
        """Needed unless a newer version of the key is itself safely in the
        capacity tier (its manifest written). A tombstone of one object
        version is always kept: any older segment may hold a manifest of
        that version, and about 70 bytes are not worth finding out."""
        if tomb.version is not None:
            return True
        meta = await pool.run(self._index.get_object, tomb.bucket, tomb.key)
        return meta is None or meta.seq < tomb.seq or meta.manifest is None

    async def _rewrite(self, olds: list[SegmentInfo]) -> int | None:
        """Copy what is live out of ``olds`` into one new segment and delete
        them; bytes reclaimed, or None if skipped (try again next pass)."""
        names = {old.name for old in olds}
        bucket = self._writing.bucket_of(olds[0].name) or ""
        footers = []
        for old in olds:
            try:
                footers.append(await read_footer(self._capacity, old.name))
            except CapacityNotFound:
                log.error("segment %s is in the index but not in the capacity store", old.name)
                return None
        live_entries: list[tuple[str, seg.EntryRef]] = []
        # Every version (current or not) with bytes or its manifest here.
        metas: dict[tuple[str, str, int], ObjectMeta] = {}
        tombstones: list[seg.Tombstone] = []
        buckets: list[dict] = []
        for footer in footers:
            for entry in footer.entries:
                place = (footer.segment, entry.offset, entry.stored)
                if entry.upload is not None and await pool.run(
                    self._index.owners_of_upload_entries, entry.upload, footer.segment
                ):
                    return None  # an open upload still uses it: try again later
                versions = await pool.run(self._index.versions_of, entry.bucket, entry.key)
                owners = [m for m in versions if any(c.extent is not None and c.extent.place == place
                                                     for c in m.chunks)]
                if not owners:
                    continue
                live_entries.append((footer.segment, entry))
                for meta in owners:
                    metas[(meta.bucket, meta.key, meta.vseq)] = meta
            for record in footer.records:
                if record.get("t") == "bucket":
                    buckets.append(record)
                elif record.get("t") == "obj":
                    bucket, key, vseq = record["m"]["bucket"], record["m"]["key"], record["m"].get("vseq", 0)
                    found = await pool.run(self._index.find_vseq, bucket, key, vseq)
                    if found is not None and found[1].manifest in names:
                        metas[(bucket, key, vseq)] = found[1]
            tombstones += [tomb for tomb in footer.tombstones if await self._tombstone_needed(tomb)]

        info: SegmentInfo | None = None
        moved: dict[tuple[str, int, int], Extent] = {}
        if live_entries or metas or tombstones or buckets:
            name = await self._writing.name(bucket)
            encoder = seg.SegmentEncoder(name, now_ms())
            out = [encoder.header()]
            for segment, entry in live_entries:
                stored = await self._capacity.get_range(
                    segment_path(segment), entry.offset, entry.offset + entry.stored
                )
                ref, data = await pool.run(
                    encoder.add_stored, entry.bucket, entry.key, entry.seq, entry.part,
                    stored, entry.raw, entry.codec, entry.crc, crc32c=entry.crc32c,
                )
                out.append(data)
                moved[(segment, entry.offset, entry.stored)] = extent_of(name, ref)
            for meta in metas.values():
                chunks = tuple(
                    replace(c, extent=moved.get(c.extent.place, c.extent)) if c.extent is not None else c
                    for c in meta.chunks
                )
                if any(c.extent is not None and c.extent.segment in names for c in chunks):
                    return None  # an extent we did not see as live: the index changed
                encoder.add_record(manifest(replace(meta, chunks=chunks)))
            for tomb in tombstones:
                encoder.add_tombstone(tomb.bucket, tomb.key, tomb.seq, tomb.version, tomb.null)
            for record in buckets:
                encoder.add_record(record)
            out.append(await pool.run(encoder.finish))
            data = b"".join(out)
            info = segment_info(encoder, len(data))
            await self._capacity.put(segment_path(name), data)
            self._writing.check(bucket, name)  # landed while its term held the lease: it counts, olds may go
        versions = {where: meta.seq for where, meta in metas.items()}
        renames = await pool.run(
            self._index.commit_compaction, [old.name for old in olds], info, moved, versions,
            len(tombstones) + len(buckets),
        )
        if renames is None:
            if info is not None:
                await self._capacity.delete(segment_path(info.name))
            return None
        if info is not None:
            self._writing.committed(bucket, info.name)
        for old in olds:
            await self._capacity.delete(segment_path(old.name))
        self._writing.deleted(bucket, len(olds))
        await pool.run(self._rename, renames)
        return sum(old.size for old in olds) - (info.size if info else 0)

    def _rename(self, renames: list[tuple[str, str]]) -> None:
        for old, new in renames:
            self._hot.rename_cached(old, new)

