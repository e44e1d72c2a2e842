"""Request and response bodies of the admin API, and the views that build
them from the tiering layer's types. The OpenAPI schema (and so
docs/admin-api.md) is generated from these."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from gateway.admin.bodies import Text, TextList, printable
from gateway.client.order import MAX_DEPTH, MAX_KEYS, MAX_PATTERN
from gateway.config.sizes import parse_size
from gateway.s3.xml import iso8601
from tiering.capacity import CapacityStats
from tiering.jobs import Job
from tiering.meta import BucketInfo, Mount, ObjectMeta
from tiering.settings import TierSettings

MiB = 1024 * 1024
MIN_PART = 5 * MiB  # S3's smallest multipart part; extents are never smaller
MAX_PART = 256 * MiB  # an extent is fetched into memory whole


def iso(seconds: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC with milliseconds (as S3 listings), or None."""
    return None if seconds is None else iso8601(int(seconds * 1000))


# A size as a string: bytes, or a number with a binary suffix ("8M", "1.5GiB").
# The same grammar as the configuration's sizes, in ASCII and without spaces,
# so that the schema's pattern says exactly what is accepted.
SIZE_PATTERN = r"^[0-9]+(\.[0-9]+)?([KMGTkmgt]([Ii]?[Bb])?|[Bb])?$"


def _size(value: object) -> object:
    if isinstance(value, str):
        if re.fullmatch(SIZE_PATTERN, value) is None:
            raise ValueError(f"invalid size {value!r}: expected bytes or a number with a K, M, G or T suffix")
        return parse_size(value)  # its ValueError becomes a 400 naming the field
    return value


def _size_schema(**bounds: int) -> WithJsonSchema:
    integer = {"type": "integer", **bounds}
    return WithJsonSchema({"anyOf": [integer, {"type": "string", "pattern": SIZE_PATTERN}]})


PartSize = Annotated[int, BeforeValidator(_size), Field(ge=MIN_PART, le=MAX_PART),
                     _size_schema(minimum=MIN_PART, maximum=MAX_PART)]
PositiveSize = Annotated[int, BeforeValidator(_size), Field(gt=0), _size_schema(exclusiveMinimum=0)]


# What a bucket name looks like (S3's general-purpose rules), for the schema;
# tiering.model.names checks the rest (no IP address form, no "xn--" prefix, ...)
# and answers InvalidBucketName.
BUCKET_NAME = {"pattern": r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", "minLength": 3, "maxLength": 63}
# How a key list is read: literally, unless the request asks for one of
# these forms (gateway/client/order.py: expand_all).
PATTERNS_HELP = (
    "Expand WebDataset-style brace patterns in the keys: train-{0000..0099}.tar is 100 keys, {a,b} a "
    f"choice (options may hold ranges and braces of their own). A pattern has at most {MAX_PATTERN:,} "
    f"characters, braces nested at most {MAX_DEPTH} deep, and names at most {MAX_KEYS:,} keys, counted "
    "before any is built. "
    "Off (the default): every key is taken literally, braces and commas included."
)
URLS_HELP = (
    "Read keys of the form s3://<bucket>/<key> as URLs of this request's bucket: the prefix is stripped, "
    "another bucket is refused. Off (the default): s3://resnet50/train/img_0000.npz is that key, as "
    "DLIO names its objects."
)


# A mount's source; admin/mounts.py splits it with this same pattern.
SOURCE_PATTERN = r"^s3://([A-Za-z0-9._-]+)(/[^?#]*)?$"


class Strict(BaseModel):
    """A request body: unknown fields are refused, and values must have the
    type the schema gives them (no ``false`` for a number, no ``"1"`` for an
    integer); sizes alone also take their string form."""

    model_config = ConfigDict(extra="forbid", strict=True)


class BucketPolicy(Strict):
    """A bucket's tiering policy; fields left out stay as they are (or take
    the node's setting, at creation)."""

    write_through: bool | None = Field(
        None, description="Acknowledge writes once the capacity store has them."
    )
    compression: bool | None = Field(None, description="zstd per extent where it saves space.")
    part_size: PartSize | None = Field(None, description='Extent size of large objects: bytes or "8M".')
    small_object_size: PositiveSize | None = Field(
        None, description='Objects up to this size are packed into shared segments.'
    )
    pinned: bool | None = Field(
        None, description="Keep every object of the bucket in the hot tier (never evicted)."
    )


class NewBucket(BucketPolicy):
    name: Text = Field(description="The bucket name (S3 naming rules).", json_schema_extra=BUCKET_NAME)


class Bucket(BaseModel):
    """A bucket and its effective policy (node settings where it has none)."""

    name: str
    created: str
    region: str
    write_through: bool
    compression: bool
    part_size: int
    small_object_size: int
    pinned: bool


def bucket_view(info: BucketInfo, settings: TierSettings, pinned: bool) -> Bucket:
    return Bucket(
        name=info.name,
        created=iso(info.created_ms / 1000) or "",
        region=info.region,
        write_through=info.write_through,
        compression=settings.compression,
        part_size=settings.part_size,
        small_object_size=settings.small_object_size,
        pinned=pinned,
    )


class BucketList(BaseModel):
    buckets: list[Bucket]


class ChunkView(BaseModel):
    size: int
    state: Literal["staged", "cached", "capacity"]
    file_id: str | None = None
    segment: str | None = None
    offset: int | None = None
    stored: int | None = None
    codec: str | None = None


class ObjectLocation(BaseModel):
    """Where one object's bytes are."""

    bucket: str
    key: str
    size: int
    etag: str
    last_modified: str
    seq: int
    pinned: bool
    where: Literal["hot", "staged", "capacity", "partly-hot"]
    chunks: list[ChunkView]


def location_view(
    meta: ObjectMeta, states: list[str], pinned: bool, piece_sizes: list[int] | None = None
) -> ObjectLocation:
    """``states`` per chunk; for a mounted object (no chunks), per cached
    piece of ``piece_sizes``, where "capacity" means only at the source."""
    if piece_sizes is not None:
        chunks = [ChunkView(size=size, state=state, file_id=None, segment=None, offset=None, stored=None,  # type: ignore[arg-type]
                            codec=None) for size, state in zip(piece_sizes, states, strict=True)]
    else:
        chunks = [
            ChunkView(
                size=c.size,
                state=state,  # type: ignore[arg-type]
                file_id=c.file_id,
                segment=c.extent.segment if c.extent else None,
                offset=c.extent.offset if c.extent else None,
                stored=c.extent.stored if c.extent else None,
                codec=c.extent.codec if c.extent else None,
            )
            for c, state in zip(meta.chunks, states, strict=True)
        ]
    kinds = set(states)
    if kinds <= {"staged"} and kinds:
        where = "staged"
    elif "capacity" not in kinds:
        where = "hot"
    elif kinds == {"capacity"}:
        where = "capacity"
    else:
        where = "partly-hot"
    return ObjectLocation(
        bucket=meta.bucket,
        key=meta.key,
        size=meta.size,
        etag=meta.etag,
        last_modified=iso(meta.last_modified_ms / 1000) or "",
        seq=meta.seq,
        pinned=pinned,
        where=where,  # type: ignore[arg-type]
        chunks=chunks,
    )


class NewMount(Strict):
    """A gateway bucket over an existing S3 bucket/prefix."""

    name: Text = Field(description="The gateway bucket name (S3 naming rules).", json_schema_extra=BUCKET_NAME)
    source: Text = Field(
        description="s3://bucket or s3://bucket/prefix", json_schema_extra={"pattern": SOURCE_PATTERN}
    )
    endpoint: Text | None = Field(None, description="http(s) URL of a non-AWS S3 (MinIO, Ceph RGW).")
    region: Text | None = None
    access_key: Annotated[Text, Field(min_length=1)] | None = None
    secret_key: Annotated[Text, Field(min_length=1)] | None = None
    freshness: Literal["immutable"] | Annotated[float, Field(gt=0, le=86400 * 365)] = Field(
        60.0, description='"immutable", or seconds a validation with the source holds.'
    )
    serve_stale: bool = Field(True, description="Serve cached objects while the source is unreachable.")
    read_write: bool = Field(False, description="Write PUT, copy, DELETE and multipart uploads through to the source.")
    listing_ttl: Annotated[float, Field(ge=0, le=86400)] = Field(
        0.0, description="Seconds a listing page from the source is reused (0: every listing asks the source)."
    )
    check_md5: bool = Field(
        False,
        description="Check whole objects the source sends no checksum of against their MD5 ETag too "
        "(for a source reached over plain HTTP; costs about 2 ms of CPU per MiB read cold).",
    )


class MountView(BaseModel):
    name: str
    source: str
    endpoint: str | None
    region: str | None
    access_key: str | None
    secret_key: str | None  # "***" when set
    freshness: Literal["immutable"] | float
    serve_stale: bool
    read_write: bool
    listing_ttl: float
    check_md5: bool
    created: str
    source_requests: dict[str, int] = Field(description="Requests made of the source since start, by kind.")
    source_bytes_read: int


def mount_view(mount: Mount, stats: CapacityStats) -> MountView:
    return MountView(
        name=mount.name,
        source=mount.source,
        endpoint=mount.endpoint,
        region=mount.region,
        access_key=mount.access_key,
        secret_key="***" if mount.secret_key else None,
        freshness="immutable" if mount.freshness is None else mount.freshness,
        serve_stale=mount.serve_stale,
        read_write=mount.read_write,
        listing_ttl=mount.listing_ttl,
        check_md5=mount.check_md5,
        created=iso(mount.created_ms / 1000) or "",
        source_requests={
            "gets": stats.gets, "heads": stats.heads, "lists": stats.lists, "retries": stats.retries,
        },
        source_bytes_read=stats.bytes_read,
    )


class MountList(BaseModel):
    mounts: list[MountView]


class Pin(Strict):
    bucket: Text
    prefix: Text = ""


class PinList(BaseModel):
    pins: list[Pin]


class CompactRequest(Strict):
    threshold: float | None = Field(
        None, ge=0, le=1, description="Rewrite segments whose live fraction is below this."
    )


class EvictRequest(Strict):
    bucket: Text | None = Field(None, description="Leave out to evict the whole cache.")
    prefix: Text = ""


class WarmRequest(Strict):
    bucket: Text
    prefix: Text | None = Field(None, description="Warm every object under this prefix.")
    keys: TextList | None = Field(
        None, max_length=1_000_000,
        description="Warm these keys, each taken literally (see patterns and urls).",
    )
    manifest: Text | None = Field(
        None, description="Key of an object in the bucket listing one key per line (blank lines and lines "
        "starting with # skipped; each line stripped of surrounding white space), read as keys are.",
    )
    patterns: bool = Field(False, description=PATTERNS_HELP)
    urls: bool = Field(False, description=URLS_HELP)
    concurrency: int = Field(4, ge=1, le=64, description="Batches (managed) or objects (mounted) fetched at once.")
    bandwidth: int | None = Field(None, gt=0, description="Bytes per second this job may read from the store.")
    cooperative: bool = Field(
        False, description="Share the work with the other gateways that run the same job: each fetches the "
        "segments it owns from the store and the rest from their owners. The node list is `peers`, or the "
        "gateway's `peers` setting. A gateway in the node registry (a node id and no `peers`) takes its live "
        "nodes instead, and the job runs on it alone: each extent is warmed by the node that owns it, "
        "which keeps it, as reads find it.")
    peers: dict[Text, Text] | None = Field(
        None, description="Node id -> S3 endpoint URL of every gateway in the job, this one included "
        "(implies cooperative).")
    peer_wait: float = Field(30.0, gt=0, le=3600, description="Seconds without a byte from a peer before "
                             "its share is read from the store instead.")

    @model_validator(mode="after")
    def _one_set(self) -> WarmRequest:
        if sum(x is not None for x in (self.prefix, self.keys, self.manifest)) != 1:
            raise ValueError("give exactly one of prefix, keys or manifest")
        if self.prefix is not None and (self.patterns or self.urls):
            raise ValueError("patterns and urls apply to keys and manifest, not to prefix")
        return self


class Progress(BaseModel):
    items_done: int
    items_total: int | None
    bytes_done: int
    bytes_total: int | None
    fraction: float | None


class JobView(BaseModel):
    """A background job: what it does, how far it got, how it ended."""

    id: str
    kind: str
    params: dict[str, Any]
    state: Literal["running", "succeeded", "failed", "cancelled"]
    created: str
    started: str | None
    finished: str | None
    progress: Progress
    rate_bytes_per_s: float | None
    eta_s: float | None
    errors: list[str]
    result: dict[str, Any] | None


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON can carry it, whatever it is: text UTF-8 cannot
    encode written as \\udXXX, tuples and sets as lists, other objects as
    their text. A job's parameters and result pass through it, so one job
    can never make ``GET /jobs`` fail and hide the others."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return printable(value)
    if depth >= 32:
        return "..."
    if isinstance(value, Mapping):
        return {printable(str(k)): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v, depth + 1) for v in value]
    return printable(str(value))


def job_view(job: Job) -> JobView:
    errors = [printable(str(e)) for e in job.errors]
    if job.errors_dropped:
        errors.append(f"... and {job.errors_dropped} more")
    return JobView(
        id=job.id,
        kind=job.kind,
        params=plain(dict(job.params)),
        state=job.state.value,  # type: ignore[arg-type]
        created=iso(job.created) or "",
        started=iso(job.started),
        finished=iso(job.finished),
        progress=Progress(
            items_done=job.items_done,
            items_total=job.items_total,
            bytes_done=job.bytes_done,
            bytes_total=job.bytes_total,
            fraction=job.fraction,
        ),
        rate_bytes_per_s=job.rate,
        eta_s=job.eta,
        errors=errors,
        result=None if job.result is None else plain(job.result),
    )


class JobList(BaseModel):
    jobs: list[JobView]
