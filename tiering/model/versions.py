"""Bucket versioning (S3's): statuses, version ids, and what a versioned
delete or listing answers.

Every object version has a version sequence number, ``vseq``: the index
sequence number it was first written with, fixed for its life (a retag or a
flush gives the record a new ``seq``, not a new ``vseq``). A version id is
``vseq`` as 16 lowercase hex digits: opaque to clients, unique, URL-safe,
and in version order when compared as strings. The *null* version (written
while a bucket was never versioned or is Suspended) answers ``"null"``; at
most one null version exists per key.

The current version of a key stays where every unversioned read looks for
it, ``O<bucket>\\0<key>``, so a GET without versionId costs the same single
lookup in a versioned bucket. Noncurrent versions and delete markers live
under ``V<bucket>\\0<key>\\0<~vseq>`` (``tiering/index/keys.py``), newest first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from tiering.errors import (
    DeletedKey,
    DeleteMarkerVersion,
    InvalidArgument,
    NoSuchKey,
    NoSuchVersion,
)
from tiering.meta import ObjectMeta

ENABLED = "Enabled"
SUSPENDED = "Suspended"
STATUSES = (ENABLED, SUSPENDED)
NULL = "null"

_VERSION_ID = re.compile(r"[0-9a-f]{16}")


def version_id(vseq: int) -> str:
    """The version id of the version first written with sequence ``vseq``."""
    return f"{vseq:016x}"


def parse_version(text: str) -> str:
    """A versionId as a client sent it, checked: ``"null"`` or a well-formed
    id (which may still name no version: NoSuchVersion is decided later).
    Anything else is S3's 400 InvalidArgument."""
    if text == NULL or _VERSION_ID.fullmatch(text):
        return text
    if text == "":
        raise InvalidArgument("Version id cannot be the empty string", ArgumentName="versionId", ArgumentValue="")
    raise InvalidArgument("Invalid version id specified", ArgumentName="versionId", ArgumentValue=text)


def vseq_of(version: str) -> int | None:
    """The vseq a non-null version id names (None for "null")."""
    return None if version == NULL else int(version, 16)


def shown(version: str | None) -> str:
    """The version id a listing or header shows for a record's ``version``."""
    return version if version is not None else NULL


class _Markers(Protocol):
    def latest_marker(self, bucket: str, key: str) -> ObjectMeta | None: ...


def missing(index: _Markers, bucket: str, key: str) -> NoSuchKey:
    """The error of a read (without versionId) of a key with no current
    version: S3 says when its latest version is a delete marker."""
    marker = index.latest_marker(bucket, key)
    if marker is None:
        return NoSuchKey(Key=key)
    return DeletedKey(version=shown(marker.version), last_modified_ms=marker.last_modified_ms, Key=key)


def readable(meta: ObjectMeta | None, key: str, version: str) -> ObjectMeta:
    """``meta``, the version a read named by ``version``, if it can be read:
    NoSuchVersion when there is none, S3's 405 for a delete marker."""
    if meta is None:
        raise NoSuchVersion("The specified version does not exist.", Key=key, VersionId=version)
    if meta.delete_marker:
        raise DeleteMarkerVersion("The specified method is not allowed against this resource.",
                                  version=shown(meta.version), last_modified_ms=meta.last_modified_ms,
                                  Method="GET", ResourceType="DeleteMarker")
    return meta


@dataclass(frozen=True, slots=True)
class Deletion:
    """What a DELETE did: the version id to answer with (the delete
    marker's, or the version removed) and whether that was a delete marker.
    ``gone`` are the records whose bytes nothing refers to any more."""

    version: str | None = None
    marker: bool = False
    gone: tuple[ObjectMeta, ...] = ()


@dataclass(frozen=True, slots=True)
class VersionEntry:
    """One line of ListObjectVersions: a version or a delete marker."""

    key: str
    version: str  # as shown: an id or "null"
    latest: bool
    marker: bool
    size: int = 0
    etag: str = ""
    last_modified_ms: int = 0
    checksum_algorithm: str | None = None


@dataclass(slots=True)
class VersionPage:
    entries: list[VersionEntry] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    truncated: bool = False
    next_key: str | None = None
    next_version: str | None = None
