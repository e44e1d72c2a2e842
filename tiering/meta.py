"""Core value types of the namespace and their index encoding.

Records are frozen, slotted dataclasses; the index stores them as msgpack
maps with short field names, so adding a field with a default stays
backward compatible with data written by older versions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, ClassVar, Self

import msgpack

# Headers S3 stores with an object and returns on GET/HEAD, besides
# Content-Type and x-amz-meta-*.
STORED_HEADERS = (
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "expires",
    "x-amz-website-redirect-location",
    "x-amz-storage-class",
)


def now_ms() -> int:
    """Wall-clock time in milliseconds, the resolution S3 listings show."""
    return time.time_ns() // 1_000_000


class _Record:
    """msgpack round trip for the dataclasses below.

    ``_nested`` names fields holding another record (or a tuple of them).
    """

    __slots__ = ()
    _nested: ClassVar[dict[str, type[_Record]]] = {}

    def to_bytes(self) -> bytes:
        return msgpack.packb(self.to_plain(), use_bin_type=True)

    @classmethod
    def from_bytes(cls, raw: bytes) -> Self:
        return cls.from_plain(msgpack.unpackb(raw, raw=False))

    def to_plain(self) -> dict[str, Any]:
        names = _layout(type(self))[0]
        if not self._nested:  # every field plain (a tuple packs as the list it would become)
            return {name: getattr(self, name) for name in names}
        out: dict[str, Any] = {}
        for name in names:
            value = getattr(self, name)
            if isinstance(value, _Record):
                value = value.to_plain()
            elif isinstance(value, tuple):
                value = [v.to_plain() if isinstance(v, _Record) else v for v in value]
            out[name] = value
        return out

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> Self:
        names, converters = _layout(cls)
        if plain.keys() <= names.keys():
            plain = dict(plain)
        else:  # written by a newer version: its new fields are ignored
            plain = {name: value for name, value in plain.items() if name in names}
        for name, convert in converters:
            value = plain.get(name)
            if value is not None:
                plain[name] = convert(value)
        return cls(**plain)


Converter = Callable[[Any], Any]


@cache
def _layout(cls: type[_Record]) -> tuple[dict[str, None], tuple[tuple[str, Converter], ...]]:
    """A record type's field names, in order (a dict: ordered, with a fast
    ``in``), and how to rebuild the fields msgpack cannot give back as they
    were: nested records, and tuples (which come back as lists). Worked out
    once per type: doing it on every decode (``dataclasses.fields`` and a
    test per field) was two thirds of the cost of reading an object's record."""
    names = dict.fromkeys(f.name for f in fields(cls))  # type: ignore[arg-type]
    converters: list[tuple[str, Converter]] = []
    for f in fields(cls):  # type: ignore[arg-type]
        sub = cls._nested.get(f.name)
        is_tuple = str(f.type).startswith("tuple")
        if sub is not None and is_tuple:
            converters.append((f.name, lambda items, sub=sub: tuple([sub.from_plain(i) for i in items])))
        elif sub is not None:
            converters.append((f.name, sub.from_plain))
        elif is_tuple:
            converters.append((f.name, tuple))
    return names, tuple(converters)


@dataclass(frozen=True, slots=True)
class Extent(_Record):
    """Where one piece of an object lives in the capacity tier: a byte range
    of a segment, how it is encoded, and the checksum of the stored bytes
    (a CRC32C if ``crc32c``, else zlib's CRC32: packer/crc.py)."""

    segment: str
    offset: int
    stored: int
    raw: int
    codec: str = "none"
    crc: int = 0
    crc32c: bool = False  # records written before CRC32C lack it: their extents carry CRC32

    @property
    def weight(self) -> int:
        """What this extent adds to its segment's live count: its stored
        bytes, and one for an empty entry, so that a segment whose only
        entries in use are empty (an empty object's piece) is never taken
        for unused and deleted under it."""
        return self.stored or 1

    @property
    def place(self) -> tuple[str, int, int]:
        """Identity of the stored bytes. The length is part of it: an empty
        entry has the same offset as the entry after it."""
        return (self.segment, self.offset, self.stored)

    @property
    def cache_name(self) -> str:
        """The hot-tier cache file that holds this extent's raw bytes."""
        return f"{self.segment}-{self.offset:x}-{self.stored:x}"


@dataclass(frozen=True, slots=True)
class Chunk(_Record):
    """One contiguous piece of an object (at most one part size).

    Staged while ``file_id`` names a hot-tier file that is the only copy;
    flushed once ``extent`` says where the capacity tier holds it (the hot
    tier may still cache it, under the extent's cache name).
    """

    size: int
    file_id: str | None = None
    extent: Extent | None = None

    _nested: ClassVar[dict[str, type[_Record]]] = {"extent": Extent}


@dataclass(frozen=True, slots=True)
class Checksum(_Record):
    """A client-requested checksum (S3 ``x-amz-checksum-*``).

    ``value`` is base64 as on the wire; for a composite multipart checksum it
    carries the ``-N`` suffix. ``type`` is FULL_OBJECT or COMPOSITE.
    """

    algorithm: str
    value: str
    type: str = "FULL_OBJECT"


@dataclass(frozen=True, slots=True, weakref_slot=True)  # memos refer to it weakly (tiering/memo.py)
class ObjectMeta(_Record):
    """Everything the namespace knows about one object version."""

    bucket: str
    key: str
    size: int
    etag: str  # hex, without quotes; "<md5 of part md5s>-N" for multipart
    last_modified_ms: int
    seq: int
    content_type: str = "binary/octet-stream"
    headers: dict[str, str] = field(default_factory=dict)  # STORED_HEADERS
    user_meta: dict[str, str] = field(default_factory=dict)  # x-amz-meta-* without prefix
    checksum: Checksum | None = None
    chunks: tuple[Chunk, ...] = ()
    part_sizes: tuple[int, ...] = ()  # multipart: size of each part, for partNumber reads
    upload_id: str | None = None  # multipart: the upload it completed, for retried Completes
    manifest: str | None = None  # the segment whose footer holds this version's manifest
    # Object tags (PutObjectTagging, x-amz-tagging): part of the record and
    # so of every manifest, so they survive flush, compaction and recovery.
    tags: dict[str, str] = field(default_factory=dict)
    # Versioning (tiering/model/versions.py): the id S3 shows (None: the null
    # version of a bucket never versioned; "null": written while Suspended),
    # the sequence number the version was first written with (0: written
    # before versions were kept), and whether this is a delete marker.
    version: str | None = None
    vseq: int = 0
    delete_marker: bool = False

    _nested: ClassVar[dict[str, type[_Record]]] = {"checksum": Checksum, "chunks": Chunk}

    @property
    def is_null(self) -> bool:
        """True for the key's null version."""
        return self.version is None or self.version == "null"

    @property
    def staged(self) -> bool:
        """True while some bytes exist only in the hot tier."""
        return any(c.file_id is not None for c in self.chunks)

    @property
    def quoted_etag(self) -> str:
        return f'"{self.etag}"'

    @property
    def last_modified_s(self) -> int:
        return self.last_modified_ms // 1000


@dataclass(frozen=True, slots=True)
class BucketInfo(_Record):
    name: str
    created_ms: int
    region: str = "us-east-1"
    write_through: bool = False  # acknowledge writes only once the capacity tier has them
    # Layout overrides; None follows the node's setting.
    compression: bool | None = None
    part_size: int | None = None
    small_object_size: int | None = None
    # S3 bucket versioning: None (never enabled), "Enabled" or "Suspended".
    versioning: str | None = None


@dataclass(frozen=True, slots=True)
class Mount(_Record):
    """A gateway bucket over an existing S3 bucket/prefix, its objects in
    their native layout, read through and cached (written through when
    ``read_write``)."""

    name: str
    bucket: str
    prefix: str
    created_ms: int
    endpoint: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    freshness: float | None = None  # None: immutable; else seconds a validation holds
    serve_stale: bool = True  # serve cached objects while the source is unreachable
    read_write: bool = False  # writes go through to the source; else AccessDenied
    listing_ttl: float = 0.0  # seconds a listing page from the source is reused (0: never)
    # Check whole objects the store sends no checksum of against their MD5
    # ETag too (tiering/mounts/checks.py): 1.5-2.7 ms of CPU per MiB.
    check_md5: bool = False

    @property
    def source(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


@dataclass(frozen=True, slots=True, weakref_slot=True)  # memos refer to it weakly (tiering/memo.py)
class MountedObject(_Record):
    """An object of a mount as the source last described it."""

    key: str
    size: int
    etag: str
    last_modified_ms: int
    validated_ms: int
    content_type: str = "binary/octet-stream"
    headers: dict[str, str] = field(default_factory=dict)
    user_meta: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Upload(_Record):
    """An open multipart upload and what CreateMultipartUpload fixed for it."""

    upload_id: str
    bucket: str
    key: str
    initiated_ms: int
    content_type: str = "binary/octet-stream"
    headers: dict[str, str] = field(default_factory=dict)
    user_meta: dict[str, str] = field(default_factory=dict)
    checksum_algorithm: str | None = None
    checksum_type: str | None = None  # FULL_OBJECT | COMPOSITE
    tags: dict[str, str] = field(default_factory=dict)  # x-amz-tagging, given to the object at Complete


@dataclass(frozen=True, slots=True)
class Part(_Record):
    """One uploaded part of a multipart upload."""

    part_number: int
    size: int
    etag: str  # hex md5, without quotes
    last_modified_ms: int
    chunks: tuple[Chunk, ...] = ()
    checksum: Checksum | None = None

    _nested: ClassVar[dict[str, type[_Record]]] = {"checksum": Checksum, "chunks": Chunk}


@dataclass(frozen=True, slots=True)
class SegmentInfo(_Record):
    """What the index knows of one segment in the capacity tier.

    ``live`` counts the stored bytes (one for an empty entry: ``Extent.weight``)
    of entries some current object or open upload still uses; ``pins`` counts footer records that must survive
    (current manifests, tombstones, bucket events). A segment with neither
    can be deleted; one with little live data is rewritten by compaction.
    """

    name: str
    size: int
    data: int  # stored bytes of all entries
    live: int
    pins: int
    created_ms: int



