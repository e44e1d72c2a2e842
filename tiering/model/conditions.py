"""Conditional requests (RFC 9110 section 13) evaluated against an object.

S3 follows RFC 9110's precedence: If-Match before If-Unmodified-Since, and
If-None-Match before If-Modified-Since; a failed If-Match or
If-Unmodified-Since is 412, a failed If-None-Match or If-Modified-Since is
304 on GET/HEAD.

Writes (PutObject, CompleteMultipartUpload, CopyObject, DeleteObject) have
their own, smaller set: :class:`WriteConditions`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiering.errors import ConditionalConflict, NoSuchKey, NotModified, PreconditionFailed
from tiering.meta import ObjectMeta


@dataclass(frozen=True, slots=True)
class Conditions:
    if_match: str | None = None  # raw header value, may list several ETags
    if_none_match: str | None = None
    if_modified_since: int | None = None  # epoch seconds
    if_unmodified_since: int | None = None

    def __bool__(self) -> bool:
        return any(
            v is not None
            for v in (self.if_match, self.if_none_match, self.if_modified_since, self.if_unmodified_since)
        )


def etag_matches(header: str, etag: str) -> bool:
    """True if the If-Match/If-None-Match value names ``etag`` (or is ``*``).

    Compared weakly (a W/ prefix is ignored), as S3 does."""
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*":
            return True
        candidate = candidate.removeprefix("W/")
        if candidate.strip('"') == etag:
            return True
    return False


def check(meta: ObjectMeta, cond: Conditions, *, for_copy: bool = False) -> None:
    """Raise PreconditionFailed or NotModified if ``cond`` does not hold.

    For CopyObject's x-amz-copy-source-if-* headers every failure is 412.
    """
    modified = meta.last_modified_s
    if cond.if_match is not None:
        if not etag_matches(cond.if_match, meta.etag):
            raise PreconditionFailed(Condition="If-Match")
    elif cond.if_unmodified_since is not None and modified > cond.if_unmodified_since:
        raise PreconditionFailed(Condition="If-Unmodified-Since")
    not_modified = PreconditionFailed if for_copy else NotModified
    if cond.if_none_match is not None:
        if etag_matches(cond.if_none_match, meta.etag):
            raise not_modified(Condition="If-None-Match")
    elif cond.if_modified_since is not None and modified <= cond.if_modified_since:
        raise not_modified(Condition="If-Modified-Since")


@dataclass(frozen=True, slots=True)
class WriteConditions:
    """S3's conditional writes: ``If-None-Match: *`` (create only) and
    ``If-Match: <etag>`` (replace or delete only that version; ``*``: any).

    A write checks them twice: when the request starts (a failure is 412
    PreconditionFailed, or 404 NoSuchKey for If-Match on a missing key),
    and again atomically with its commit, under the index lock. A failure
    there means another write or delete of the key came in between, which
    S3 answers with 409 ConditionalRequestConflict (404 when it was a
    delete); the client is told to retry, and never overwrites what it did
    not see."""

    if_none_match: bool = False
    if_match: str | None = None  # the header's value, may list several ETags

    def __bool__(self) -> bool:
        return self.if_none_match or self.if_match is not None

    def check(self, current: ObjectMeta | None, key: str, *, at_commit: bool = False) -> None:
        failed = ConditionalConflict if at_commit else PreconditionFailed
        if self.if_match is not None:
            if current is None:
                raise NoSuchKey(Key=key)
            if not etag_matches(self.if_match, current.etag):
                raise failed(Condition="If-Match")
        if self.if_none_match and current is not None:
            raise failed(Condition="If-None-Match")
