"""The S3 bucket behind a mounted bucket: objects in their native layout.

A ``SourceBucket`` is the capacity-store S3 client (same retry choke point,
same error translation, same counters) pointed at a user's bucket/prefix,
with the calls a mount needs besides ranged reads and deletes: HEAD with
the object's metadata, a listing page with delimiter and start-after, and
an upload that carries the object's Content-Type, headers and metadata. Keys are the user's S3 keys, used as they are: unlike
capacity-store names they are not checked as clean paths (the key never
becomes a file name here).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tiering.capacity.s3 import S3Store
from tiering.capacity.s3_answers import BadBody, http_date, parse_content_range, read_body
from tiering.capacity.s3_get import META, LeanGetter
from tiering.capacity.s3_upload import S3Upload
from tiering.errors import CapacityError
from tiering.meta import Checksum
from tiering.model.checksums import header_name

# Store error codes of a ranged GET of an object that has no first byte to
# send: empty (InvalidRange), or archived (InvalidObjectState, as S3 answers
# for Glacier objects not restored): a HEAD describes those.
_NO_FIRST_BYTE = frozenset({"InvalidRange", "InvalidObjectState"})

# HEAD answer fields -> the stored header they carry.
_HEADER_FIELDS = {
    "CacheControl": "cache-control",
    "ContentDisposition": "content-disposition",
    "ContentEncoding": "content-encoding",
    "ContentLanguage": "content-language",
    "WebsiteRedirectLocation": "x-amz-website-redirect-location",
}
_OBJECT_ARGS = {header: name for name, header in _HEADER_FIELDS.items()}


@dataclass(frozen=True, slots=True)
class SourceObject:
    """What the source says of one object version."""

    key: str
    size: int
    etag: str  # without quotes
    last_modified_ms: int
    content_type: str = "binary/octet-stream"
    headers: dict[str, str] = field(default_factory=dict)
    user_meta: dict[str, str] = field(default_factory=dict)
    # The store's checksum of the whole content, where it sent one (asked for
    # with checksum mode): (algorithm, base64 value); see whole_checksum.
    checksum: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class SourcePage:
    objects: list[SourceObject]
    prefixes: list[str]
    truncated: bool


def epoch_ms(when: datetime | None) -> int:
    return int(when.timestamp() * 1000) if when is not None else 0


def unquoted_etag(raw: str | None) -> str:
    return (raw or "").strip('"')


# The x-amz-checksum-* algorithms, cheapest to verify first (docs/performance.md):
# every one of them is cheaper than the MD5 of the ETag. An object has one.
_CHECKSUMS = ("CRC64NVME", "CRC32C", "CRC32", "SHA1", "SHA256")


def answer_checksum(answer: dict[str, Any], untyped: str) -> Checksum | None:
    """The object checksum a store's answer carries (botocore's
    ``Checksum<ALGORITHM>`` fields), of the type the answer names, else
    ``untyped``; None when it carries none."""
    for algorithm in _CHECKSUMS:
        if value := answer.get("Checksum" + algorithm):
            return Checksum(algorithm, value, answer.get("ChecksumType") or untyped)
    return None


# The x-amz-checksum-* header of each algorithm.
_CHECKSUM_HEADERS = tuple((algorithm, header_name(algorithm)) for algorithm in _CHECKSUMS)
# The stored headers a source's answer carries that a mount keeps with the object.
_KEPT_HEADERS = (*_HEADER_FIELDS.values(), "expires")


def whole_checksum(headers: Mapping[str, str]) -> tuple[str, str] | None:
    """The checksum of the object's whole content in a store's answer
    (``x-amz-checksum-*``, names in lower case): (algorithm, base64 value);
    None when there is none, or only a composite one (of the part checksums
    of a multipart upload, ``-N`` suffixed), which says nothing of the
    bytes themselves."""
    for algorithm, name in _CHECKSUM_HEADERS:
        if value := headers.get(name):
            if headers.get("x-amz-checksum-type") == "COMPOSITE" or "-" in value:
                return None
            return algorithm, value
    return None


def answer_headers(answer: dict[str, Any]) -> dict[str, str]:
    """A botocore answer's HTTP headers, names in lower case."""
    return {name.lower(): value for name, value in answer["ResponseMetadata"]["HTTPHeaders"].items()}


def source_object(key: str, headers: Mapping[str, str], size: int) -> SourceObject:
    """The object of ``size`` bytes as a HEAD or GET answer's headers (names
    in lower case) describe it. Straight from the headers: a cold miss made
    botocore's fields of them first, then this of those, 6.2 us of the
    event loop a miss between the two against 3.9 now."""
    modified = headers.get("last-modified")
    modified_ms = 0
    if modified:
        with contextlib.suppress(TypeError, ValueError):
            modified_ms = epoch_ms(http_date(modified))
    return SourceObject(
        key=key,
        size=size,
        etag=unquoted_etag(headers.get("etag")),
        last_modified_ms=modified_ms,
        content_type=headers.get("content-type") or "binary/octet-stream",
        headers={name: value for name in _KEPT_HEADERS if (value := headers.get(name))},
        user_meta={name[len(META):]: value for name, value in headers.items() if name.startswith(META)},
        checksum=whole_checksum(headers),
    )


class SourceBucket(S3Store):
    """A mounted bucket's source: ``s3://bucket/prefix/`` at an endpoint."""

    def _key(self, name: str) -> str:
        if not name:
            raise ValueError("an object key must not be empty")
        return self.prefix + name

    async def head(self, key: str) -> SourceObject:
        """The object's size, ETag and metadata; CapacityNotFound if absent."""
        answer = await self.call(
            "head_object", key, self.client().head_object, Bucket=self.bucket, Key=self._key(key)
        )
        return source_object(key, answer_headers(answer), int(answer["ContentLength"]))

    async def first(self, key: str, length: int) -> tuple[SourceObject, bytes]:
        """The object's description and its first ``length`` bytes in one
        ranged GET (a small object whole): what a cold read needs, without a
        HEAD first. On a configured endpoint it is the lean GET's (a third
        of botocore's CPU), like every ranged read. The store is asked for
        the object's checksum too: where it sends one of the whole content
        (rclone and moto do with a range, S3 only without one), the bytes of
        a small object are checked against it rather than against the MD5
        of the ETag, which costs several times more. CapacityNotFound if absent."""

        async def fetch() -> tuple[Mapping[str, str], int, bytes]:
            self.client()  # started
            asked = {"Bucket": self.bucket, "Key": self._key(key), "Range": f"bytes=0-{length - 1}",
                     "ChecksumMode": "ENABLED"}
            if isinstance(self._getter, LeanGetter):
                headers, data = await self._getter.get_headed(**asked)
            else:
                answer = await self._getter.get_object(**asked)
                headers, data = answer_headers(answer), await read_body(answer)
            content_range = headers.get("content-range")
            total = parse_content_range(content_range)[2] if content_range else len(data)
            if total is None or len(data) != min(length, total):
                raise BadBody(len(data), min(length, total or 0))
            return headers, total, data

        headers, total, data = await self.call("get_object", key, fetch)
        self.stats.bytes_read += len(data)
        return source_object(key, headers, total), data

    async def first_or_head(self, key: str, length: int) -> tuple[SourceObject, bytes | None]:
        """:meth:`first`, or for an object that has no first byte to send
        (empty: InvalidRange; archived: InvalidObjectState) a HEAD's
        description and no bytes."""
        try:
            return await self.first(key, length)
        except CapacityError as exc:
            if exc.detail.get("code") not in _NO_FIRST_BYTE:
                raise
        return await self.head(key), None

    async def describe_object(self, key: str) -> SourceObject:
        """The object's description, as :meth:`head` gives it, by a ranged
        GET of its first byte on the lean getter (a HEAD goes through
        botocore: about 1 ms of CPU more)."""
        return (await self.first_or_head(key, 1))[0]

    async def page(self, prefix: str, delimiter: str, start_after: str, max_keys: int) -> SourcePage:
        """One ListObjectsV2 page of keys under ``prefix`` after
        ``start_after`` (keys relative to the mount)."""
        kw: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": self.prefix + prefix,
            "MaxKeys": max(1, max_keys),
        }
        if delimiter:
            kw["Delimiter"] = delimiter
        if start_after:
            kw["StartAfter"] = self.prefix + start_after
        self.client()  # started
        # The lean getter's, on a configured endpoint: parsed off the event loop.
        answer = await self.call("list_objects_v2", prefix, self._getter.list_objects_v2, **kw)
        cut = len(self.prefix)
        objects = [
            SourceObject(
                key=item["Key"][cut:],
                size=int(item["Size"]),
                etag=unquoted_etag(item.get("ETag")),
                last_modified_ms=epoch_ms(item.get("LastModified")),
            )
            for item in answer.get("Contents", ())
            if len(item["Key"]) > cut  # the prefix's own "directory" marker
        ]
        prefixes = [p["Prefix"][cut:] for p in answer.get("CommonPrefixes", ())]
        return SourcePage(objects, prefixes, bool(answer.get("IsTruncated")))

    def upload_object(
        self, key: str, content_type: str, headers: dict[str, str], user_meta: dict[str, str]
    ) -> S3Upload:
        """A streamed write of ``key`` (one PUT when under a part, else a
        multipart upload), with the object's metadata."""
        args: dict[str, Any] = {"ContentType": content_type, "Metadata": user_meta}
        args |= {_OBJECT_ARGS[h]: v for h, v in headers.items() if h in _OBJECT_ARGS}
        return S3Upload(self, key, self._key(key), args)

    # -- multipart uploads, passed through ------------------------------------------

    async def create_upload(
        self, key: str, content_type: str, headers: dict[str, str], user_meta: dict[str, str],
        checksum_algorithm: str | None, checksum_type: str | None,
    ) -> dict[str, Any]:
        """CreateMultipartUpload at the source; its answer (UploadId, and
        ChecksumAlgorithm/ChecksumType when the source keeps them)."""
        args: dict[str, Any] = {"ContentType": content_type, "Metadata": user_meta}
        args |= {_OBJECT_ARGS[h]: v for h, v in headers.items() if h in _OBJECT_ARGS}
        if checksum_algorithm:
            args["ChecksumAlgorithm"] = checksum_algorithm
        if checksum_type:
            args["ChecksumType"] = checksum_type
        return await self.call(
            "create_multipart_upload", key, self.client().create_multipart_upload,
            Bucket=self.bucket, Key=self._key(key), **args,
        )

    async def upload_part(
        self, key: str, upload_id: str, number: int, data: bytes, checksum: tuple[str, str] | None
    ) -> dict[str, Any]:
        """One part, with the checksum the gateway verified (algorithm, base64
        value) so the source checks and keeps it too."""
        extra = {"ChecksumAlgorithm": checksum[0], f"Checksum{checksum[0]}": checksum[1]} if checksum else {}
        answer = await self.call(
            "upload_part", key, self.client().upload_part, Bucket=self.bucket, Key=self._key(key),
            UploadId=upload_id, PartNumber=number, Body=data, **extra,
        )
        self.stats.bytes_written += len(data)
        return answer

    async def complete_upload(self, key: str, upload_id: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return await self.call(
            "complete_multipart_upload", key, self.client().complete_multipart_upload,
            Bucket=self.bucket, Key=self._key(key), UploadId=upload_id, MultipartUpload={"Parts": parts},
        )

    async def abort_upload(self, key: str, upload_id: str) -> None:
        await self.call(
            "abort_multipart_upload", key, self.client().abort_multipart_upload,
            Bucket=self.bucket, Key=self._key(key), UploadId=upload_id,
        )

    async def list_parts(self, key: str, upload_id: str, after: int, limit: int) -> dict[str, Any]:
        return await self.call(
            "list_parts", key, self.client().list_parts, Bucket=self.bucket, Key=self._key(key),
            UploadId=upload_id, PartNumberMarker=after, MaxParts=max(1, limit),
        )

    async def list_uploads(self, prefix: str, key_marker: str, id_marker: str, limit: int) -> dict[str, Any]:
        """One ListMultipartUploads page, keys relative to the mount."""
        kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix, "MaxUploads": max(1, limit)}
        if key_marker:
            kw["KeyMarker"] = self.prefix + key_marker
            if id_marker:
                kw["UploadIdMarker"] = id_marker
        answer = await self._uploads_page(prefix, **kw)
        cut = len(self.prefix)
        answer["Uploads"] = [{**u, "Key": u["Key"][cut:]} for u in answer.get("Uploads", ()) if len(u["Key"]) > cut]
        return answer
