"""Rebuild a node's namespace from the capacity tier's segment footers.

Segments are self-describing, so the index can be lost with the node's disk
and rebuilt from the capacity store alone:

- every footer is read (one or two ranged GETs each, several at a time);
- per object version (key and version sequence number), the manifest with
  the highest sequence number wins (ties: the newer segment, i.e. a
  compaction's copy); a key tombstone with a higher sequence than the
  version's manifest deletes it, a version tombstone deletes its version
  (a null version's, every older null version too), and of the key's null
  versions only the newest stays (each one replaced the one before it);
- per key, the newest surviving version is current unless it is a delete
  marker; the others are restored as noncurrent versions;
- per bucket, the newest bucket event decides whether it exists; a bucket
  that holds live objects exists in any case;
- each segment's live bytes and pins are recounted from the winners.

What was only in the lost hot tier (write-back data not yet flushed, open
multipart uploads) cannot come back; that is the write-back window.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

from packer import format as seg
from tiering.capacity import CapacityStore
from tiering.capacity.layout import list_segments, read_footer
from tiering.cluster.terms import valid_segments
from tiering.index.db import Index
from tiering.index.keys import bucket_from_event
from tiering.meta import BucketInfo, ObjectMeta, SegmentInfo

_CONCURRENCY = 16


@dataclass(slots=True)
class RecoveryReport:
    segments: int = 0
    objects: int = 0
    buckets: int = 0
    versions: int = 0  # noncurrent versions and delete markers restored
    deleted: int = 0  # keys a tombstone left without any version
    incomplete: int = 0  # kept versions whose bytes name a segment that no longer exists
    bytes: int = 0


Progress = Callable[[int, int], None]  # (segments read, segments total)


async def recover(
    capacity: CapacityStore, index: Index, region: str = "us-east-1", progress: Progress | None = None
) -> RecoveryReport:
    """Fill the empty ``index`` from ``capacity``'s footers."""
    if not index.is_empty():
        raise ValueError("recover needs an empty index: move the old data directory away first")
    names = [item async for item in list_segments(capacity)]
    names = await valid_segments(capacity, names)
    sizes = dict(names)
    footers: dict[str, seg.Footer] = {}
    limit = asyncio.Semaphore(_CONCURRENCY)

    async def read(name: str) -> None:
        async with limit:
            footers[name] = await read_footer(capacity, name)
        if progress is not None:
            progress(len(footers), len(names))

    await asyncio.gather(*(read(name) for name, _ in names))

    report = RecoveryReport(segments=len(footers))
    best: dict[tuple[str, str, int], tuple[int, str, dict]] = {}
    tombs: dict[tuple[str, str], list[seg.Tombstone]] = {}
    bucket_events: dict[str, tuple[int, dict]] = {}
    top_seq = 0
    for name in sorted(footers):  # ascending: later segments win ties
        footer = footers[name]
        for record in footer.records:
            kind = record.get("t")
            if kind == "obj":
                plain = record["m"]
                where = (plain["bucket"], plain["key"], plain.get("vseq", 0))
                if where not in best or plain["seq"] >= best[where][0]:
                    best[where] = (plain["seq"], name, plain)
                top_seq = max(top_seq, plain["seq"])
            elif kind == "bucket":
                seq = record.get("s", 0)
                if record["n"] not in bucket_events or seq >= bucket_events[record["n"]][0]:
                    bucket_events[record["n"]] = (seq, record)
                top_seq = max(top_seq, seq)
        for tomb in footer.tombstones:
            tombs.setdefault((tomb.bucket, tomb.key), []).append(tomb)
            top_seq = max(top_seq, tomb.seq)

    survivors: dict[tuple[str, str], list[ObjectMeta]] = {}
    buried: set[tuple[str, str]] = set()
    for (bucket, key, _), (seq, name, plain) in best.items():
        meta = replace(ObjectMeta.from_plain(plain), manifest=name)
        if any(t.seq > seq and t.kills(meta.vseq, meta.is_null) for t in tombs.get((bucket, key), ())):
            buried.add((bucket, key))
            continue
        survivors.setdefault((bucket, key), []).append(meta)
    objects, noncurrent, report.incomplete = _arrange(survivors, footers.keys())
    report.deleted = len(buried - survivors.keys())

    live: dict[str, int] = dict.fromkeys(footers, 0)
    pins: dict[str, int] = dict.fromkeys(footers, 0)
    for meta in itertools.chain(objects, noncurrent):
        pins[meta.manifest] += 1  # type: ignore[index]
        for chunk in meta.chunks:
            live[chunk.extent.segment] += chunk.extent.weight  # type: ignore[union-attr]
        report.bytes += meta.size
    for name, footer in footers.items():
        # Tombstones and bucket events stay pinned: compaction decides.
        pins[name] += len(footer.tombstones) + sum(
            1 for r in footer.records if r.get("t") == "bucket"
        )

    buckets: dict[str, BucketInfo] = {}
    for name, (_, record) in bucket_events.items():
        if not record.get("d"):
            buckets[name] = bucket_from_event(record, region)
    for meta in itertools.chain(objects, noncurrent):
        if meta.bucket not in buckets:
            buckets[meta.bucket] = BucketInfo(meta.bucket, meta.last_modified_ms, region)
    segments = [
        SegmentInfo(
            name,
            sizes[name],
            sum(e.stored for e in footer.entries),
            live[name],
            pins[name],
            footer.created_ms,
        )
        for name, footer in footers.items()
    ]
    top_segment = max((int(name, 16) for name in footers), default=0)
    index.install(buckets.values(), objects, segments, top_seq, top_segment, noncurrent)
    report.objects = len(objects)
    report.versions = len(noncurrent)
    report.buckets = len(buckets)
    return report


def _arrange(
    survivors: dict[tuple[str, str], list[ObjectMeta]], present: Collection[str]
) -> tuple[list[ObjectMeta], list[ObjectMeta], int]:
    """Per key, its surviving versions as the index keeps them: the newest
    null version only, the newest version current unless it is a delete
    marker, the rest noncurrent. A kept version with bytes in a segment not
    ``present`` is lost and left out; an older null version it replaced
    stays replaced, and a replaced one whose bytes are gone is no loss.
    (current versions, noncurrent ones, versions lost)"""
    current: list[ObjectMeta] = []
    noncurrent: list[ObjectMeta] = []
    lost = 0
    for versions in survivors.values():
        newest_null = max((m.vseq for m in versions if m.is_null), default=None)
        kept = sorted((m for m in versions if not m.is_null or m.vseq == newest_null),
                      key=lambda m: m.vseq, reverse=True)
        whole = [m for m in kept if all(c.extent is not None and c.extent.segment in present
                                        for c in m.chunks)]
        lost += len(kept) - len(whole)
        if whole and not whole[0].delete_marker:
            current.append(whole.pop(0))
        noncurrent.extend(whole)
    return current, noncurrent, lost
