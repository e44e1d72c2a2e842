"""All S3 XML: one builder per response type, one parser per request body.

Builders write strings directly (listing pages of 1000 keys are the hot
path, and string joins are several times faster than an element tree).
Parsers use the standard library's expat-based ElementTree on bodies whose
size the caller has already capped, and refuse what no S3 request body
needs while they parse: a document type declaration (so no entity is ever
expanded or fetched: billion laughs, quadratic blowup, external entities),
nesting deeper than ``MAX_DEPTH`` and more elements than the request can
hold (a few bytes of ``<a/>`` per element would otherwise cost ~100 bytes
of tree each).
"""

from __future__ import annotations

import functools
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote

from gateway.s3.errors import S3Error
from gateway.s3.headers import decimal
from tiering.index.db import ListEntry, ListPage
from tiering.meta import BucketInfo, Checksum, ObjectMeta, Part, Upload
from tiering.model.uploads import MAX_PART_NUMBER, ChosenPart
from tiering.model.versions import VersionPage

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
_HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n'

# XML 1.0 cannot carry most C0 controls even as references; S3 writes them
# as numeric references anyway, and so do we, so a key round-trips for
# clients that ask for encoding-type=url or parse leniently.
_NEEDS_ESCAPE = re.compile(r'[&<>"\'\x00-\x08\x0b\x0c\x0d\x0e-\x1f]')
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;"}


def esc(text: object) -> str:
    s = str(text)
    if not _NEEDS_ESCAPE.search(s):
        return s
    return _NEEDS_ESCAPE.sub(lambda m: _ENTITIES.get(m.group(), f"&#x{ord(m.group()):x};"), s)


def iso8601(ms: int) -> str:
    """2026-12-02T21:49:25.123Z, the timestamp form of S3 listings."""
    return f"{_iso_seconds(ms // 1000)}.{ms % 1000:03d}Z"


@functools.lru_cache(maxsize=4096)
def _iso_seconds(seconds: int) -> str:
    # Cached: a listing page formats 1000 timestamps, and objects uploaded
    # together share their second; strftime + gmtime was ~13% of a page.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def _el(name: str, value: object) -> str:
    return f"<{name}>{esc(value)}</{name}>"


def _doc(root: str, body: str) -> bytes:
    return f'{_HEAD}<{root} xmlns="{NS}">{body}</{root}>'.encode()


@dataclass(frozen=True, slots=True)
class Owner:
    id: str
    display_name: str

    def xml(self, tag: str = "Owner") -> str:
        return f"<{tag}>{_el('ID', self.id)}{_el('DisplayName', self.display_name)}</{tag}>"


def _key_encoder(encoding_type: str | None):
    if encoding_type == "url":
        return lambda k: quote(k, safe="/")
    return lambda k: k


# -- errors ------------------------------------------------------------------


# Characters XML 1.0 cannot carry, even as references (and lone surrogates,
# which UTF-8 cannot): an error document must parse whatever the request
# held, or clients lose the error code with it.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _error_el(name: str, value: object) -> str:
    return _el(name, _NOT_XML.sub("\ufffd", str(value)))


def error(err: S3Error, resource: str, request_id: str) -> bytes:
    """The <Error> document. Unlike listings, which keep S3's references to
    control characters for clients that ask for encoding-type=url, echoed
    keys and paths here lose such characters (to U+FFFD), so that every
    XML parser reads the code."""
    extra = "".join(_error_el(k, v) for k, v in err.fields.items())
    return (
        f"{_HEAD}<Error>{_el('Code', err.code)}{_error_el('Message', err.message)}{extra}"
        f"{_error_el('Resource', resource)}{_el('RequestId', request_id)}</Error>"
    ).encode()


# -- buckets -----------------------------------------------------------------


def list_buckets(buckets: Iterable[BucketInfo], owner: Owner) -> bytes:
    items = "".join(
        f"<Bucket>{_el('Name', b.name)}{_el('CreationDate', iso8601(b.created_ms))}"
        f"{_el('BucketRegion', b.region)}</Bucket>"
        for b in buckets
    )
    return _doc("ListAllMyBucketsResult", f"{owner.xml()}<Buckets>{items}</Buckets>")


def location(region: str) -> bytes:
    # us-east-1 is reported as an empty LocationConstraint, as S3 does.
    value = "" if region == "us-east-1" else esc(region)
    return _doc("LocationConstraint", value)


def versioning(status: str | None) -> bytes:
    """GetBucketVersioning: a bucket never versioned has no Status at all."""
    return _doc("VersioningConfiguration", _el("Status", status) if status else "")


ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"


def acl(owner: Owner, public: bool = False) -> bytes:
    """An ACL: the owner's FULL_CONTROL, and with ``public`` (the canned
    public-read) the AllUsers group's READ."""
    grant = (
        '<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="CanonicalUser">'
        f"{_el('ID', owner.id)}{_el('DisplayName', owner.display_name)}</Grantee>"
        "<Permission>FULL_CONTROL</Permission></Grant>"
    )
    if public:
        grant += ('<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="Group">'
                  f"{_el('URI', ALL_USERS)}</Grantee><Permission>READ</Permission></Grant>")
    return _doc("AccessControlPolicy", f"{owner.xml()}<AccessControlList>{grant}</AccessControlList>")


def parse_acl(body: bytes) -> list[tuple[str, str]]:
    """PutBucketAcl's and PutObjectAcl's AccessControlPolicy: its grants as
    (grantee, permission); the grantee is a group's URI, ``id:<canonical
    id>`` or ``email:<address>``."""
    root = _parse(body, 100)
    lists = _children(root, "AccessControlList")
    if _local(root.tag) != "AccessControlPolicy" or len(lists) != 1:
        raise S3Error("MalformedACLError", "The XML you provided was not well-formed or did not validate "
                      "against our published schema")
    grants = []
    for grant in _children(lists[0], "Grant"):
        grantees, permission = _children(grant, "Grantee"), _text(grant, "Permission")
        if len(grantees) != 1 or permission is None:
            raise S3Error("MalformedACLError", "The XML you provided was not well-formed or did not validate "
                          "against our published schema")
        uri, ident, email = (_text(grantees[0], name) for name in ("URI", "ID", "EmailAddress"))
        who = uri.strip() if uri is not None else f"id:{ident.strip()}" if ident is not None else \
            f"email:{(email or '').strip()}"
        grants.append((who, permission.strip()))
    return grants


# -- listings ----------------------------------------------------------------


def _contents(entry: ListEntry, enc, owner: str, tag: str = "Contents", extra: str = "") -> str:
    # Once per key listed. ``owner`` is the page's <Owner> element (or "").
    # LastModified and Size are digits and punctuation: nothing to escape.
    checksum = _el("ChecksumAlgorithm", entry.checksum_algorithm) if entry.checksum_algorithm else ""
    return (
        f"<{tag}>{_el('Key', enc(entry.key))}{extra}"
        f"<LastModified>{iso8601(entry.last_modified_ms)}</LastModified>"
        f"<ETag>&quot;{entry.etag}&quot;</ETag>{checksum}<Size>{entry.size}</Size>"
        f"{owner}<StorageClass>STANDARD</StorageClass></{tag}>"
    )


def _prefixes(page: ListPage, enc) -> str:
    return "".join(f"<CommonPrefixes>{_el('Prefix', enc(p))}</CommonPrefixes>" for p in page.prefixes)


def _entries(page: ListPage, enc, owner: Owner | None, tag: str = "Contents", extra: str = "") -> str:
    """A page's objects, then its common prefixes, as every listing ends."""
    owner_xml = owner.xml() if owner else ""
    return "".join([_contents(e, enc, owner_xml, tag, extra) for e in page.contents]) + _prefixes(page, enc)


def _common(bucket: str, prefix: str, delimiter: str, max_keys: int, encoding_type: str | None, enc) -> str:
    """Name, Prefix (``prefix`` as given: callers encode it or not), Delimiter,
    MaxKeys and EncodingType."""
    return (
        f"{_el('Name', bucket)}{_el('Prefix', prefix)}"
        + (_el("Delimiter", enc(delimiter)) if delimiter else "")
        + _el("MaxKeys", max_keys)
        + (_el("EncodingType", encoding_type) if encoding_type else "")
    )


def list_objects_v2(
    bucket: str,
    page: ListPage,
    *,
    prefix: str,
    delimiter: str,
    max_keys: int,
    encoding_type: str | None,
    start_after: str | None,
    continuation_token: str | None,
    next_token: str | None,
    owner: Owner | None,
) -> bytes:
    enc = _key_encoder(encoding_type)
    body = [
        _common(bucket, enc(prefix), delimiter, max_keys, encoding_type, enc),
        _el("KeyCount", len(page.contents) + len(page.prefixes)),
        _el("IsTruncated", "true" if page.truncated else "false"),
    ]
    if continuation_token is not None:
        body.append(_el("ContinuationToken", continuation_token))
    if next_token is not None:
        body.append(_el("NextContinuationToken", next_token))
    if start_after:
        body.append(_el("StartAfter", enc(start_after)))
    body.append(_entries(page, enc, owner))
    return _doc("ListBucketResult", "".join(body))


def list_objects_v1(
    bucket: str,
    page: ListPage,
    *,
    prefix: str,
    delimiter: str,
    max_keys: int,
    encoding_type: str | None,
    marker: str,
    owner: Owner,
) -> bytes:
    enc = _key_encoder(encoding_type)
    body = [
        # S3 echoes a v1 listing's Prefix as sent, even under encoding-type=url
        # (it encodes Delimiter, Marker, NextMarker and the keys, and botocore,
        # which asks for url on every listing, decodes just those).
        _common(bucket, prefix, delimiter, max_keys, encoding_type, enc),
        _el("Marker", enc(marker)),
        _el("IsTruncated", "true" if page.truncated else "false"),
    ]
    # S3 returns NextMarker only when a delimiter was given; clients fall
    # back to the last key otherwise.
    if page.truncated and delimiter and page.last is not None:
        body.append(_el("NextMarker", enc(page.last)))
    body.append(_entries(page, enc, owner))
    return _doc("ListBucketResult", "".join(body))


def list_versions(
    bucket: str,
    page: VersionPage,
    *,
    prefix: str,
    delimiter: str,
    max_keys: int,
    encoding_type: str | None,
    key_marker: str,
    version_marker: str,
    owner: Owner,
) -> bytes:
    """ListObjectVersions: versions and delete markers in the order listed
    (key order, newest first), then the common prefixes."""
    enc = _key_encoder(encoding_type)
    body = [
        _common(bucket, enc(prefix), delimiter, max_keys, encoding_type, enc),
        _el("KeyMarker", enc(key_marker)),
        _el("VersionIdMarker", version_marker),
        _el("IsTruncated", "true" if page.truncated else "false"),
    ]
    if page.truncated and page.next_key is not None:
        body.append(_el("NextKeyMarker", enc(page.next_key)))
        if page.next_version is not None:
            body.append(_el("NextVersionIdMarker", page.next_version))
    owner_xml = owner.xml()
    for e in page.entries:
        head = (f"{_el('Key', enc(e.key))}{_el('VersionId', e.version)}"
                f"{_el('IsLatest', 'true' if e.latest else 'false')}"
                f"<LastModified>{iso8601(e.last_modified_ms)}</LastModified>")
        if e.marker:
            body.append(f"<DeleteMarker>{head}{owner_xml}</DeleteMarker>")
        else:
            checksum = _el("ChecksumAlgorithm", e.checksum_algorithm) if e.checksum_algorithm else ""
            body.append(f"<Version>{head}<ETag>&quot;{e.etag}&quot;</ETag>{checksum}<Size>{e.size}</Size>"
                        f"{owner_xml}<StorageClass>STANDARD</StorageClass></Version>")
    body.append("".join(f"<CommonPrefixes>{_el('Prefix', enc(p))}</CommonPrefixes>" for p in page.prefixes))
    return _doc("ListVersionsResult", "".join(body))


# -- objects -----------------------------------------------------------------


def _checksum(checksum: Checksum | None) -> str:
    if checksum is None:
        return ""
    return _el(f"Checksum{checksum.algorithm}", checksum.value) + _el("ChecksumType", checksum.type)


def copy_object(meta: ObjectMeta) -> bytes:
    return _doc(
        "CopyObjectResult",
        f"{_el('LastModified', iso8601(meta.last_modified_ms))}<ETag>&quot;{meta.etag}&quot;</ETag>"
        + _checksum(meta.checksum),
    )


def copy_part(part: Part) -> bytes:
    checksum = _el(f"Checksum{part.checksum.algorithm}", part.checksum.value) if part.checksum else ""
    return _doc(
        "CopyPartResult",
        f"{_el('LastModified', iso8601(part.last_modified_ms))}<ETag>&quot;{part.etag}&quot;</ETag>{checksum}",
    )


@dataclass(frozen=True, slots=True)
class DeleteOutcome:
    key: str
    version_id: str | None = None
    code: str | None = None  # set for a failed key
    message: str | None = None
    # A delete marker was made (its id) or the version deleted was one.
    marker: bool = False
    marker_version: str | None = None


def delete_result(outcomes: Iterable[DeleteOutcome], quiet: bool) -> bytes:
    body = []
    for o in outcomes:
        version = _el("VersionId", o.version_id) if o.version_id else ""
        if o.code is not None:
            body.append(f"<Error>{_el('Key', o.key)}{version}{_el('Code', o.code)}{_el('Message', o.message)}</Error>")
        elif not quiet:
            marker = "<DeleteMarker>true</DeleteMarker>" if o.marker else ""
            if o.marker_version:
                marker += _el("DeleteMarkerVersionId", o.marker_version)
            body.append(f"<Deleted>{_el('Key', o.key)}{version}{marker}</Deleted>")
    return _doc("DeleteResult", "".join(body))


# -- multipart ---------------------------------------------------------------


def initiate_upload(upload: Upload) -> bytes:
    return _doc(
        "InitiateMultipartUploadResult",
        f"{_el('Bucket', upload.bucket)}{_el('Key', upload.key)}{_el('UploadId', upload.upload_id)}",
    )


def complete_upload(location: str, meta: ObjectMeta) -> bytes:
    return _doc(
        "CompleteMultipartUploadResult",
        f"{_el('Location', location)}{_el('Bucket', meta.bucket)}{_el('Key', meta.key)}"
        f"<ETag>&quot;{meta.etag}&quot;</ETag>" + _checksum(meta.checksum),
    )


def list_parts(
    upload: Upload, parts: list[Part], *, marker: int, max_parts: int, truncated: bool, owner: Owner
) -> bytes:
    items = "".join(
        f"<Part>{_el('PartNumber', p.part_number)}{_el('LastModified', iso8601(p.last_modified_ms))}"
        f"<ETag>&quot;{p.etag}&quot;</ETag>{_el('Size', p.size)}"
        + (_el(f"Checksum{p.checksum.algorithm}", p.checksum.value) if p.checksum else "")
        + "</Part>"
        for p in parts
    )
    next_marker = parts[-1].part_number if parts else marker
    checksum = ""
    if upload.checksum_algorithm:
        checksum = _el("ChecksumAlgorithm", upload.checksum_algorithm) + _el("ChecksumType", upload.checksum_type)
    return _doc(
        "ListPartsResult",
        f"{_el('Bucket', upload.bucket)}{_el('Key', upload.key)}{_el('UploadId', upload.upload_id)}"
        f"{owner.xml('Initiator')}{owner.xml()}<StorageClass>STANDARD</StorageClass>"
        f"{_el('PartNumberMarker', marker)}{_el('NextPartNumberMarker', next_marker)}"
        f"{_el('MaxParts', max_parts)}{_el('IsTruncated', 'true' if truncated else 'false')}{checksum}{items}",
    )


def list_uploads(
    bucket: str,
    uploads: list[Upload],
    *,
    prefix: str,
    key_marker: str,
    upload_id_marker: str,
    max_uploads: int,
    truncated: bool,
    encoding_type: str | None,
    owner: Owner,
) -> bytes:
    enc = _key_encoder(encoding_type)
    body = [
        _el("Bucket", bucket),
        _el("KeyMarker", enc(key_marker)),
        _el("UploadIdMarker", upload_id_marker),
    ]
    if truncated and uploads:
        body.append(_el("NextKeyMarker", enc(uploads[-1].key)))
        body.append(_el("NextUploadIdMarker", uploads[-1].upload_id))
    body += [
        _el("Prefix", enc(prefix)),
        _el("MaxUploads", max_uploads),
        _el("IsTruncated", "true" if truncated else "false"),
    ]
    if encoding_type:
        body.append(_el("EncodingType", encoding_type))
    for u in uploads:
        body.append(
            f"<Upload>{_el('Key', enc(u.key))}{_el('UploadId', u.upload_id)}{owner.xml('Initiator')}"
            f"{owner.xml()}<StorageClass>STANDARD</StorageClass>{_el('Initiated', iso8601(u.initiated_ms))}"
            + (_el("ChecksumAlgorithm", u.checksum_algorithm) if u.checksum_algorithm else "")
            + "</Upload>"
        )
    return _doc("ListMultipartUploadsResult", "".join(body))


# -- request bodies ----------------------------------------------------------

MAX_DELETE_KEYS = 1000  # keys of one DeleteObjects request
# Every S3 request body is a root, its items and their fields (3 levels).
MAX_DEPTH = 8
# Tags a Tagging body may list before it is refused as malformed: more than
# S3's 10, so that 11 get S3's own answer (BadRequest, tiering/model/tags.py).
MAX_TAGGING_ITEMS = 100
# Elements per item of a body, with room for fields this gateway ignores.
_ELEMENTS_PER_ITEM = 8


class _Refused(Exception):
    """The body holds what no S3 request body needs."""


class _Builder(ET.TreeBuilder):
    """Builds the tree, refusing a DTD, deep nesting and too many elements
    while expat parses (before the tree grows)."""

    def __init__(self, max_elements: int) -> None:
        super().__init__()
        self._depth = 0
        self._left = max_elements

    def start(self, tag: str, attrs: dict[str, str]) -> ET.Element:
        self._depth += 1
        self._left -= 1
        if self._depth > MAX_DEPTH or self._left < 0:
            raise _Refused(tag)
        return super().start(tag, attrs)

    def end(self, tag: str) -> ET.Element:
        self._depth -= 1
        return super().end(tag)

    def doctype(self, name: str, pubid: str | None, system: str | None) -> None:
        raise _Refused("DOCTYPE")


def _parse(body: bytes, max_items: int) -> ET.Element:
    parser = ET.XMLParser(target=_Builder(2 + max_items * _ELEMENTS_PER_ITEM))
    try:
        parser.feed(body)
        return parser.close()
    except (ET.ParseError, _Refused, ValueError, LookupError) as exc:
        # ValueError, LookupError: an encoding expat cannot read ("UTF-16", "F").
        raise S3Error("MalformedXML") from exc


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(el: ET.Element, name: str) -> list[ET.Element]:
    return [c for c in el if _local(c.tag) == name]


def _text(el: ET.Element, name: str) -> str | None:
    found = _children(el, name)
    return (found[0].text or "") if found else None


def parse_delete(body: bytes) -> tuple[bool, list[tuple[str, str | None, str | None]]]:
    """<Delete><Quiet/>?<Object><Key/><VersionId/>?<ETag/>?</Object>*</Delete>:
    (quiet, [(key, version id, ETag to match)])"""
    root = _parse(body, MAX_DELETE_KEYS)
    if _local(root.tag) != "Delete":
        raise S3Error("MalformedXML")
    quiet = (_text(root, "Quiet") or "").strip().lower() == "true"
    objects = []
    for obj in _children(root, "Object"):
        key = _text(obj, "Key")
        if key is None:
            raise S3Error("MalformedXML")
        etag = _text(obj, "ETag")
        objects.append((key, _text(obj, "VersionId"), etag.strip() if etag is not None else None))
    if not objects or len(objects) > MAX_DELETE_KEYS:
        raise S3Error("MalformedXML")
    return quiet, objects


def parse_complete(body: bytes) -> list[ChosenPart]:
    root = _parse(body, MAX_PART_NUMBER)
    if _local(root.tag) != "CompleteMultipartUpload":
        raise S3Error("MalformedXML")
    parts = []
    for part in _children(root, "Part"):
        number, etag = _text(part, "PartNumber"), _text(part, "ETag")
        number_value = decimal(number.strip()) if number is not None else None
        if number_value is None or etag is None:
            raise S3Error("MalformedXML")
        checksum = algorithm = None
        for child in part:
            name = _local(child.tag)
            if name.startswith("Checksum") and name != "ChecksumType":
                checksum, algorithm = (child.text or "").strip(), name.removeprefix("Checksum").upper()
        parts.append(ChosenPart(number_value, etag.strip().strip('"'), checksum, algorithm))
    if not parts:
        raise S3Error("MalformedXML")
    return parts


def tagging(tags: dict[str, str]) -> bytes:
    """GetObjectTagging: the tag set, in key order."""
    items = "".join(f"<Tag>{_el('Key', k)}{_el('Value', v)}</Tag>" for k, v in sorted(tags.items()))
    return _doc("Tagging", f"<TagSet>{items}</TagSet>")


def parse_tagging(body: bytes) -> dict[str, str]:
    """<Tagging><TagSet><Tag><Key/><Value/></Tag>*</TagSet></Tagging>; an
    empty TagSet removes the object's tags."""
    root = _parse(body, MAX_TAGGING_ITEMS)
    sets = _children(root, "TagSet")
    if _local(root.tag) != "Tagging" or len(sets) != 1:
        raise S3Error("MalformedXML")
    tags: dict[str, str] = {}
    for tag in _children(sets[0], "Tag"):
        key, value = _text(tag, "Key"), _text(tag, "Value")
        if key is None or value is None:
            raise S3Error("MalformedXML")
        if key in tags:
            raise S3Error("InvalidTag", "Cannot provide multiple Tags with the same key", TagKey=key)
        tags[key] = value
    return tags


def parse_versioning(body: bytes) -> tuple[str, bool]:
    """PutBucketVersioning's body: (the Status asked for, whether it asks
    for MFA delete)."""
    root = _parse(body, 4)
    if _local(root.tag) != "VersioningConfiguration":
        raise S3Error("MalformedXML")
    status, mfa = _text(root, "Status"), _text(root, "MfaDelete")
    if status is None or status.strip() not in ("Enabled", "Suspended"):
        raise S3Error("MalformedXML")
    if mfa is not None and mfa.strip() not in ("Enabled", "Disabled"):
        raise S3Error("MalformedXML")
    return status.strip(), mfa is not None and mfa.strip() == "Enabled"


def parse_location_constraint(body: bytes) -> str | None:
    if not body.strip():
        return None
    root = _parse(body, 1)
    value = _text(root, "LocationConstraint")
    return value.strip() if value else None
