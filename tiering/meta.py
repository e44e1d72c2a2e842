"""Core value types of the namespace and their index encoding.

Records are frozen, slotted dataclasses; the index stores them as msgpack
maps with short field names, so adding a field with a default stays
backward compatible with data written by older versions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
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
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, _Record):
                value = value.to_plain()
            elif isinstance(value, tuple):
                value = [v.to_plain() if isinstance(v, _Record) else v for v in value]
            out[f.name] = value
        return out

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> Self:
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        kwargs: dict[str, Any] = {}
        for name, value in plain.items():
            if name not in names:
                continue  # written by a newer version; ignore
            sub = cls._nested.get(name)
            if isinstance(value, list):
                value = tuple(sub.from_plain(v) for v in value) if sub else tuple(value)
            elif sub is not None and value is not None:
                value = sub.from_plain(value)
            kwargs[name] = value
        return cls(**kwargs)


@dataclass(frozen=True, slots=True)
class Chunk(_Record):
    """A hot-tier file holding one contiguous piece of an object's bytes."""

    file_id: str
    size: int


@dataclass(frozen=True, slots=True)
class Checksum(_Record):
    """A client-requested checksum (S3 ``x-amz-checksum-*``).

    ``value`` is base64 as on the wire; for a composite multipart checksum it
    carries the ``-N`` suffix. ``type`` is FULL_OBJECT or COMPOSITE.
    """

    algorithm: str
    value: str
    type: str = "FULL_OBJECT"


@dataclass(frozen=True, slots=True)
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

    _nested: ClassVar[dict[str, type[_Record]]] = {"checksum": Checksum, "chunks": Chunk}


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


@dataclass(frozen=True, slots=True)
class Part(_Record):
    """One uploaded part of a multipart upload."""

    part_number: int
    size: int
    etag: str  # hex md5, without quotes
    last_modified_ms: int
    chunk: Chunk
    checksum: Checksum | None = None

    _nested: ClassVar[dict[str, type[_Record]]] = {"checksum": Checksum, "chunk": Chunk}



