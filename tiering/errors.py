"""The one exception hierarchy for everything below the HTTP edge.

Each class names a failure in storage terms. The gateway maps every class to
its S3 error code and HTTP status in a single table (``gateway/s3/errors.py``);
nothing here knows about HTTP.
"""

from __future__ import annotations


class TierstoreError(Exception):
    """Base of every failure the namespace and the tiers report."""

    def __init__(self, message: str = "", **detail: object) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class NoSuchBucket(TierstoreError):
    pass


class BucketNotEmpty(TierstoreError):
    pass


class BucketAlreadyOwnedByYou(TierstoreError):
    pass


class InvalidBucketName(TierstoreError):
    pass


class NoSuchKey(TierstoreError):
    pass


class NoSuchUpload(TierstoreError):
    pass


class MalformedVersioning(TierstoreError):
    """A versioning configuration S3 would not accept (400 MalformedXML)."""


class NoSuchVersion(TierstoreError):
    """A well-formed versionId that names no version of the key."""


class DeleteMarkerError(TierstoreError):
    """A read met a delete marker: ``version`` is its id, ``last_modified_ms``
    its time (S3 answers both as headers)."""

    def __init__(self, message: str = "", version: str = "null", last_modified_ms: int = 0, **detail: object) -> None:
        super().__init__(message, **detail)
        self.version = version
        self.last_modified_ms = last_modified_ms


class DeletedKey(DeleteMarkerError, NoSuchKey):
    """The key's current version is a delete marker (a read without versionId: 404)."""


class DeleteMarkerVersion(DeleteMarkerError):
    """A read named a delete marker by its versionId (S3: 405 MethodNotAllowed)."""


class KeyTooLong(TierstoreError):
    pass


class InvalidArgument(TierstoreError):
    pass


class InvalidRequest(TierstoreError):
    pass


class InvalidRange(TierstoreError):
    pass


class InvalidTag(TierstoreError):
    """A tag key or value S3 does not allow (``tiering/model/tags.py``)."""


class TooManyTags(TierstoreError):
    """More than 10 tags on one object (S3 answers 400 BadRequest)."""


class PreconditionFailed(TierstoreError):
    pass


class NotModified(TierstoreError):
    """Not a failure for the client, but it ends the request early (304)."""


class ConditionalConflict(TierstoreError):
    """A conditional write raced with another write to the same key (409)."""


class BadDigest(TierstoreError):
    """Content-MD5 or an x-amz-checksum-* value did not match the body."""


class PayloadHashMismatch(BadDigest):
    """The body's SHA-256 differs from the signed x-amz-content-sha256."""


class InvalidDigest(TierstoreError):
    """A digest header is not valid base64 of the right length."""


class IncompleteBody(TierstoreError):
    """The body ended before the announced length."""


class EntityTooSmall(TierstoreError):
    pass


class EntityTooLarge(TierstoreError):
    pass


class InvalidPart(TierstoreError):
    pass


class InvalidPartOrder(TierstoreError):
    pass


class AccessDenied(TierstoreError):
    """The bucket refuses this operation (a write to a read-only mount)."""


class NotSupported(TierstoreError):
    """A valid request this gateway does not carry out here (501)."""


class SlowDown(TierstoreError):
    """The node cannot take more data right now, and flushing or eviction
    will make room: the client should retry. ``cause`` says what is short
    (``WRITE_REFUSALS``), for the operators' counts; it is not in the
    answer."""

    def __init__(self, message: str = "", *, cause: str = "budget", **detail: object) -> None:
        super().__init__(message, **detail)
        self.cause = cause


class InsufficientStorage(TierstoreError):
    """The node's disk has no room for the write and nothing the gateway
    can free would make some: what fills it is other data, pinned data or
    the index itself. A retry does not help until an operator acts (507).
    ``cause`` as for :class:`SlowDown`."""

    def __init__(self, message: str = "", *, cause: str = "floor", **detail: object) -> None:
        super().__init__(message, **detail)
        self.cause = cause


# Why a write was refused, as counted in the status and /metrics:
# budget: staged data fills the hot tier's budget; floor: the write would
# take the filesystem's free space below the floor; disk: the filesystem
# refused a hot-tier file write (ENOSPC: other data took the room first);
# index: the index had no room for its record. (A SlowDown for memory,
# cause "memory", is counted by tiering/admission.py instead.)
WRITE_REFUSALS = ("budget", "floor", "disk", "index")


class CapacityError(TierstoreError):
    """The capacity store failed and retries ran out (or the failure is permanent)."""


class CapacityNotFound(CapacityError):
    """The named object is not in the capacity store."""


class CapacityConflict(CapacityError):
    """A conditional write found the object not as expected (S3 412
    PreconditionFailed, or 409 ConditionalRequestConflict when another
    conditional write raced it)."""


class NotWriter(TierstoreError):
    """This node serves the managed buckets read-only: another node holds
    the write lease (scale-out, ``tiering/cluster/cluster.py``)."""


class ServiceUnavailable(TierstoreError):
    """A tier the request needs cannot serve it now (503); retrying may work."""


class SourceDenied(ServiceUnavailable):
    """A mount's source refused to let an object be read (HTTP 403). The
    client sees the 503 of any source failure; an epoch's prefetch takes
    it as an answer and counts the key missing instead of asking again."""


class InvalidObjectState(SourceDenied):
    """A mount's source holds the object archived (S3's 403
    InvalidObjectState for a Glacier object not restored): the client gets
    S3's answer, not a 503 to retry; a prefetch counts the key missing."""


class NotHot(ServiceUnavailable):
    """A peer asked for bytes from the hot tier only, and they are not all
    there (cooperative warm, ``tiering/cluster/peers.py``): 503, it asks again later."""
