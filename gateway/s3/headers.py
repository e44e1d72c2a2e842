"""Parsing and writing the HTTP headers S3 attaches meaning to.

Range: the one place HTTP's inclusive ``bytes=first-last`` becomes a
half-open ``ByteRange``. Dates: RFC 9110 HTTP-date in and out.
Metadata: x-amz-meta-* and the stored representation headers.
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
from datetime import UTC, datetime
from email.utils import format_datetime, parsedate_to_datetime
from urllib.parse import unquote_plus

from gateway.s3.errors import S3Error
from packer.ranges import ByteRange
from tiering.memo import ByIdentity
from tiering.meta import STORED_HEADERS, ObjectMeta
from tiering.model.conditions import Conditions
from tiering.model.inputs import NewObject
from tiering.reads.plan import RangeSpec

_RANGE = re.compile(r"^\s*bytes\s*=\s*([0-9]*)\s*-\s*([0-9]*)\s*$")
MAX_USER_METADATA = 2048  # bytes of x-amz-meta-* names and values, as S3
_DIGITS = re.compile(r"[0-9]+")
# Larger than any size, offset, count or time a request can name. Longer
# numbers are clamped to it, not converted: int() refuses strings of more
# than 4,300 digits (a ValueError that would surface as a 500).
HUGE = 1 << 63
# What RFC 9110 allows in a field value besides visible characters: SP, HTAB
# and obs-text. A control character would make the server refuse the answer.
_NOT_FIELD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


# Every answer that describes a stored object says how it is encrypted at
# rest, as S3 does since it encrypts every object (SSE-S3, AES256); clients
# compare it with what they asked for. See docs/s3-compatibility.md for
# where the bytes are encrypted.
SSE = ("x-amz-server-side-encryption", "AES256")
_SSE_C = ("x-amz-server-side-encryption-customer-algorithm", "x-amz-server-side-encryption-customer-key",
          "x-amz-server-side-encryption-customer-key-md5")


def check_encryption(headers: dict[str, str]) -> None:
    """The encryption a write asks for: none or AES256 (SSE-S3) is what
    every object gets; SSE-KMS and customer keys (SSE-C) are refused, not
    ignored, since ignoring them would store what the client meant to be
    under its own key without it."""
    if any(name in headers for name in _SSE_C):
        raise S3Error("NotImplemented", "Server-side encryption with customer-provided keys (SSE-C) "
                      "is not supported by this gateway")
    asked = headers.get("x-amz-server-side-encryption")
    if asked is None or asked == "AES256":
        return
    if asked.startswith("aws:kms"):
        raise S3Error("NotImplemented", f"Server-side encryption {asked} is not supported by this gateway; "
                      "objects are stored with AES256 (SSE-S3)")
    raise S3Error("InvalidArgument", "The encryption method specified is not supported",
                  ArgumentName="x-amz-server-side-encryption", ArgumentValue=asked)


# S3's storage classes: any of them is accepted and every object is kept
# the same way (listings say STANDARD); a name S3 does not know is refused.
STORAGE_CLASSES = frozenset({
    "STANDARD", "REDUCED_REDUNDANCY", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER",
    "DEEP_ARCHIVE", "OUTPOSTS", "GLACIER_IR", "SNOW", "EXPRESS_ONEZONE",
})
_OBJECT_LOCK = ("x-amz-object-lock-mode", "x-amz-object-lock-retain-until-date", "x-amz-object-lock-legal-hold")


def check_write(headers: dict[str, str]) -> None:
    """What a write asks for beyond its bytes and metadata: the encryption
    (:func:`check_encryption`), a storage class S3 knows, and no object lock,
    which this gateway does not implement and never silently ignores (a
    retention a client believes it set would protect nothing)."""
    check_encryption(headers)
    storage_class = headers.get("x-amz-storage-class")
    if storage_class is not None and storage_class not in STORAGE_CLASSES:
        raise S3Error("InvalidStorageClass", "The storage class you specified is not valid",
                      StorageClassRequested=storage_class)
    locked = [name for name in _OBJECT_LOCK if name in headers]
    if locked:
        raise S3Error("NotImplemented", f"Object lock ({locked[0]}) is not implemented by this gateway")


def decimal(text: str) -> int | None:
    """A non-negative number of ASCII digits (in a header, a query parameter
    or an XML body), or None. Values past :data:`HUGE` come back as HUGE; the
    Unicode digits ``str.isdigit()`` accepts ("²", "٣") do not parse."""
    if not _DIGITS.fullmatch(text):
        return None
    digits = text.lstrip("0")
    return HUGE if len(digits) > 19 else min(int(digits or "0"), HUGE)


def range_spec(header: str | None) -> RangeSpec | None:
    """The single byte range a GET asks for, not yet held against the
    object's size (tiering does that, once it knows the size); None for the
    whole object. A header that is not a single byte range is ignored
    (RFC 9110 lets a server ignore Range), as S3 does."""
    if header is None:
        return None
    match = _RANGE.match(header)
    if match is None or (not match.group(1) and not match.group(2)):
        return None
    return RangeSpec(decimal(match.group(1)), decimal(match.group(2)), header)


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The range of an object of ``size`` bytes a header asks for (None:
    the whole object); a syntactically valid range that starts at or past
    the end is 416 InvalidRange."""
    spec = range_spec(header)
    return spec.resolve(size) if spec is not None else None


@functools.lru_cache(maxsize=4096)
def http_date(epoch_seconds: int) -> str:
    """An RFC 7231 date; cached, as a hot object's Last-Modified is formatted
    on every GET."""
    return format_datetime(datetime.fromtimestamp(epoch_seconds, UTC), usegmt=True)


def parse_http_date(value: str | None) -> int | None:
    """Epoch seconds, or None when absent or unparseable (RFC 9110 says an
    invalid date in a conditional header is ignored)."""
    parsed = parse_http_datetime(value)
    return None if parsed is None else int(parsed.timestamp())


def parse_http_datetime(value: str | None) -> datetime | None:
    """An RFC 7231 date (or RFC 850 / asctime) in UTC; None when absent or unparseable."""
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
        if parsed.tzinfo is None:  # "-0000" means UTC of unknown origin (RFC 5322)
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)
    except (TypeError, ValueError, IndexError, OverflowError):  # e.g. year 10000 in UTC
        return None


def conditions(headers: dict[str, str], prefix: str = "if-") -> Conditions:
    """If-* headers (prefix "if-") or x-amz-copy-source-if-* headers."""
    return Conditions(
        if_match=headers.get(f"{prefix}match"),
        if_none_match=headers.get(f"{prefix}none-match"),
        if_modified_since=parse_http_date(headers.get(f"{prefix}modified-since")),
        if_unmodified_since=parse_http_date(headers.get(f"{prefix}unmodified-since")),
    )


def new_object(headers: dict[str, str]) -> NewObject:
    """Content-Type, the stored headers and x-amz-meta-* of a write (its
    encryption, storage class and object lock headers checked)."""
    check_write(headers)
    stored = {}
    for name in STORED_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        if name == "content-encoding":
            value = _without_aws_chunked(value)
            if not value:
                continue
        stored[name] = value
    user = {name[len("x-amz-meta-"):]: value for name, value in headers.items() if name.startswith("x-amz-meta-")}
    if sum(len(k) + len(v) for k, v in user.items()) > MAX_USER_METADATA:
        raise S3Error("MetadataTooLarge", "Your metadata headers exceed the maximum allowed metadata size.")
    return NewObject(
        content_type=headers.get("content-type") or "binary/octet-stream",
        headers=stored,
        user_meta=user,
        tags=tagging(headers.get("x-amz-tagging")),
    )


def tagging(header: str | None) -> dict[str, str]:
    """The tag set of an ``x-amz-tagging`` header: URL query parameters,
    form-encoded (``+`` is a space), a name without ``=`` has the empty
    value. Its form is checked here (InvalidArgument, as S3); whether the
    tags are allowed is ``tiering.model.tags``'s to say."""
    tags: dict[str, str] = {}
    if not header:
        return tags
    for pair in header.split("&"):
        if not pair:
            continue
        try:
            if pair.count("=") > 1:
                raise ValueError(pair)
            name, _, value = pair.partition("=")
            name = unquote_plus(name, errors="strict")
            value = unquote_plus(value, errors="strict")
            if name in tags:
                raise ValueError(name)
        except (UnicodeDecodeError, ValueError) as exc:
            raise S3Error("InvalidArgument", "The header 'x-amz-tagging' shall be encoded as UTF-8 then "
                          "URLEncoded URL query parameters without tag name duplicates.",
                          ArgumentName="x-amz-tagging", ArgumentValue=header) from exc
        tags[name] = value
    return tags


def _without_aws_chunked(value: str) -> str:
    """Content-Encoding as the client sent it, less ``aws-chunked``: that
    coding is transfer framing, not part of the object. S3 keeps the rest
    byte for byte ("deflate, gzip" stays so, spaces included)."""
    codings = value.split(",")
    kept = [c for c in codings if c.strip().lower() != "aws-chunked"]
    if len(kept) == len(codings):
        return value
    return ",".join(kept).strip()


# response-* query parameters override these response headers on GET.
RESPONSE_OVERRIDES = {
    "response-content-type": "content-type",
    "response-content-language": "content-language",
    "response-expires": "expires",
    "response-cache-control": "cache-control",
    "response-content-disposition": "content-disposition",
    "response-content-encoding": "content-encoding",
}


def object_headers(meta: ObjectMeta, query: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """The representation headers of GET/HEAD for ``meta``."""
    values = {"content-type": meta.content_type, **meta.headers}
    for param, header in RESPONSE_OVERRIDES.items():
        if query and param in query:
            values[header] = _override(param, query[param])
    out = [
        ("etag", meta.quoted_etag),
        ("last-modified", http_date(meta.last_modified_s)),
        ("accept-ranges", "bytes"),
        SSE,
    ]
    out += [(name, _latin1(value)) for name, value in values.items()]
    out += [(f"x-amz-meta-{name}", _latin1(value)) for name, value in meta.user_meta.items()]
    if meta.tags:
        out.append(("x-amz-tagging-count", str(len(meta.tags))))
    if meta.version is not None:  # written in a versioned bucket
        out.append(("x-amz-version-id", meta.version))
    return out


def object_head(meta: ObjectMeta) -> tuple[tuple[bytes, bytes], ...]:
    """:func:`object_headers` of ``meta`` without overrides, encoded for the
    wire: kept from the version's second read on, while its record is (the
    record cache hands out one ``ObjectMeta`` per version, so a hot object's
    GETs find theirs by identity; a cold mounted miss's ``ObjectMeta`` is
    its own, read once, and its head is not kept: ``ByIdentity``)."""
    return _HEADS.get(meta, _encoded_head)


def _encoded_head(meta: ObjectMeta) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((name.encode("latin-1"), value.encode("latin-1")) for name, value in object_headers(meta))


# A header's pair and its two bytes objects, empty: what weigh() counts of one beside its bytes.
_HEADER_SHELL = sys.getsizeof((b"", b"")) + 2 * sys.getsizeof(b"")


def _head_weight(head: tuple[tuple[bytes, bytes], ...]) -> int:
    """What ``tiering.memo.weigh`` says of a head, without walking it
    object by object: the tuple, a pair and two bytes objects a header,
    and the bytes themselves (a cold GET's head is made, weighed and
    kept once; the walk cost more than building it)."""
    return sys.getsizeof(head) + len(head) * _HEADER_SHELL + sum(map(len, itertools.chain.from_iterable(head)))


_HEADS: ByIdentity[ObjectMeta, tuple[tuple[bytes, bytes], ...]] = ByIdentity(8192, "heads", _head_weight)


def _override(param: str, value: str) -> str:
    """A response-* value: it becomes a header, so it must be a valid one."""
    if _NOT_FIELD_VALUE.search(value):
        raise S3Error("InvalidArgument", f"{param} must be a valid HTTP header value",
                      ArgumentName=param, ArgumentValue=value)
    return value


def _latin1(value: str) -> str:
    """Header values must be latin-1 on the wire; S3 returns non-ASCII
    metadata RFC 2047-encoded, but keeping the bytes is what clients expect."""
    try:
        value.encode("latin-1")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8").decode("latin-1")
