"""Building segments: packed in memory, or streamed to the capacity tier.

The byte layout is packer's (``packer.format``); this module feeds it object
bytes and turns the entries it returns into the index's extents. What goes
into footers besides entries:

- ``{"t": "obj", "m": <ObjectMeta>}``: an object version's manifest, with
  every chunk's extent (wherever it lives). Recovery rebuilds objects from
  these; the newest sequence number per key wins.
- tombstones ``(bucket, key, seq)`` for deletes, so a rebuild cannot bring
  back a deleted key, and ``(bucket, key, seq, version)`` for one object
  version deleted by its id (versioned buckets); a delete marker is a
  version, so it travels as a manifest (``delete_marker`` set);
- ``{"t": "bucket", ...}``: bucket created, changed or deleted.

Entry labels are (bucket, key, object seq, piece index); a piece of an open
multipart upload carries the upload id, its part number in place of the seq.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from packer import format as seg
from tiering import pool
from tiering.capacity import CapacityStore, CapacityUpload
from tiering.capacity.layout import segment_path
from tiering.hot.tier import HotTier
from tiering.meta import Chunk, Extent, ObjectMeta, SegmentInfo, now_ms
from tiering.settings import TierSettings


def extent_of(segment: str, ref: seg.EntryRef) -> Extent:
    return Extent(segment, ref.offset, ref.stored, ref.raw, ref.codec, ref.crc, ref.crc32c)


def manifest(meta: ObjectMeta) -> dict[str, Any]:
    """The footer record that lets recovery rebuild this object version."""
    plain = replace(meta, manifest=None).to_plain()
    plain.pop("manifest", None)
    return {"t": "obj", "m": plain}


def add_record(encoder: seg.SegmentEncoder, record: dict[str, Any]) -> None:
    """A queued footer record: tombstones go in the footer's own list."""
    if record.get("t") == "del":
        encoder.add_tombstone(record["b"], record["k"], record["s"], record.get("v"), record.get("n", False))
    else:
        encoder.add_record(record)


class Piece:
    """What one piece is labelled with inside a segment."""

    __slots__ = ("bucket", "key", "seq", "upload")

    def __init__(self, bucket: str, key: str, seq: int, upload: str | None = None) -> None:
        self.bucket, self.key, self.seq, self.upload = bucket, key, seq, upload


def encode_pieces(
    encoder: seg.SegmentEncoder,
    out: list[bytes],
    label: Piece,
    chunks: tuple[Chunk, ...],
    hot: HotTier,
    settings: TierSettings,
) -> tuple[Chunk, ...]:
    """Append every staged chunk's bytes to ``out`` as entries; return the
    chunks with extents in place of files. Blocking (reads and zstd).
    Raises FileNotFoundError if a staged file vanished (replaced meanwhile)."""
    name = encoder.segment
    result = []
    for index, chunk in enumerate(chunks):
        if chunk.file_id is None:
            result.append(chunk)
            continue
        data = hot.read(chunk.file_id, 0, chunk.size)
        ref, stored = encoder.add(
            label.bucket, label.key, label.seq, index, data,
            compress=settings.compression, level=settings.compression_level, upload=label.upload,
        )
        out.append(stored)
        result.append(Chunk(chunk.size, None, extent_of(name, ref)))
    return tuple(result)


def segment_info(encoder: seg.SegmentEncoder, size: int) -> SegmentInfo:
    data = sum(e.stored for e in encoder.entries)
    return SegmentInfo(encoder.segment, size, data, live=0, pins=0, created_ms=now_ms())


class SegmentStream:
    """A segment written while it is built: entries go to a capacity-store
    multipart upload as they are encoded, so memory stays bounded whatever
    the object's size. Nothing is visible until ``finish``."""

    def __init__(self, capacity: CapacityStore, name: str, settings: TierSettings) -> None:
        self.encoder = seg.SegmentEncoder(name, now_ms())
        self._settings = settings
        self._upload: CapacityUpload = capacity.upload(segment_path(name))
        self._started = False

    @property
    def name(self) -> str:
        return self.encoder.segment

    async def _start(self) -> None:
        if not self._started:
            self._started = True
            await self._upload.write(self.encoder.header())

    async def add(self, label: Piece, index: int, data: bytes) -> Chunk:
        await self._start()
        ref, stored = await pool.run(
            self.encoder.add, label.bucket, label.key, label.seq, index, data,
            compress=self._settings.compression, level=self._settings.compression_level, upload=label.upload,
        )
        await self._upload.write(stored)
        return Chunk(len(data), None, extent_of(self.name, ref))

    async def add_staged(self, label: Piece, chunks: tuple[Chunk, ...], hot: HotTier) -> tuple[Chunk, ...]:
        result = []
        for index, chunk in enumerate(chunks):
            if chunk.file_id is None:
                result.append(chunk)
                continue
            data = await pool.run(hot.read, chunk.file_id, 0, chunk.size)
            result.append(await self.add(label, index, data))
        return tuple(result)

    async def finish(self, records: list[dict[str, Any]] = ()) -> SegmentInfo:  # type: ignore[assignment]
        await self._start()
        for record in records:
            add_record(self.encoder, record)
        await self._upload.write(await pool.run(self.encoder.finish))
        size = await self._upload.complete()
        return segment_info(self.encoder, size)

    async def abort(self) -> None:
        await self._upload.abort()
