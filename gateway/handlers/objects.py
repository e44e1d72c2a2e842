"""Object operations: GET, HEAD, PUT, copy, DELETE, multi-object DELETE."""

from __future__ import annotations

from urllib.parse import parse_qs, unquote_to_bytes

from gateway.handlers import permissions
from gateway.handlers.context import Context
from gateway.s3 import body, headers, xml
from gateway.s3.errors import S3Error, to_s3_error
from gateway.s3.http import Response, S3Request
from tiering.cluster.peers import PEER_HEADER
from tiering.errors import PreconditionFailed, TierstoreError
from tiering.meta import ObjectMeta
from tiering.model import checksums
from tiering.model.conditions import WriteConditions, check
from tiering.model.names import check_key
from tiering.model.uploads import MAX_PART_NUMBER
from tiering.model.versions import Deletion, parse_version
from tiering.objects import copied_meta
from tiering.reads.plan import Read, ReadPlan

XML = "application/xml"
MAX_DELETE_BODY = 2 * 1024 * 1024  # 1000 keys of 1 KiB each, with XML around them
NOT_MODIFIED_HEADERS = ("etag", "last-modified", "cache-control", "expires")


def version_param(req: S3Request) -> str | None:
    """?versionId=, checked: "null" or a well-formed version id (one that
    names no version is NoSuchVersion later); None when absent."""
    version = req.query.get("versionId")
    return parse_version(version) if version is not None else None


def version_header(meta: ObjectMeta) -> list[tuple[str, str]]:
    """x-amz-version-id of a write's answer, for a version of a versioned bucket."""
    return [("x-amz-version-id", meta.version)] if meta.version is not None else []


def _checksum_headers(meta: ObjectMeta) -> list[tuple[str, str]]:
    if meta.checksum is None:
        return []
    return [
        (checksums.header_name(meta.checksum.algorithm), meta.checksum.value),
        ("x-amz-checksum-type", meta.checksum.type),
    ]


def _read(req: S3Request, body: bool) -> Read:
    """What a GET or HEAD asks of tiering, parsed from the request once."""
    version = version_param(req)
    part_number = None
    if "partNumber" in req.query:
        part_number = headers.decimal(req.query["partNumber"])
        if part_number is None or not 1 <= part_number <= MAX_PART_NUMBER:
            raise S3Error("InvalidArgument", "Part number must be an integer between 1 and 10000, inclusive",
                          ArgumentName="partNumber", ArgumentValue=req.query["partNumber"])
    return Read(
        req.bucket, req.key,
        range=None if part_number is not None else headers.range_spec(req.headers.get("range")),
        part_number=part_number,
        conditions=headers.conditions(req.headers),
        body=body,
        peer=req.headers.get(PEER_HEADER),  # another gateway asking (tiering/cluster/peers.py)
        version=version,
        blocks=body and req.blocks,  # hot pieces sent from their files, and more (gateway/serving/sendfile.py)
    )


def _answer(req: S3Request, plan: ReadPlan) -> Response:
    """The response to a read plan: S3's headers for its status, and its body."""
    meta = plan.meta
    if plan.status == 304:
        # A 304 still carries the validators and caching headers a 200 would
        # (RFC 9110 15.4.5); S3 sends ETag and Last-Modified.
        return Response(status=304, headers=[(name, value) for name, value in headers.object_headers(meta)
                                             if name in NOT_MODIFIED_HEADERS])
    if plan.status == 412:
        raise PreconditionFailed(Condition=plan.condition)
    if any(name in headers.RESPONSE_OVERRIDES for name in req.query):
        out = headers.object_headers(meta, req.query)
        head: tuple[tuple[bytes, bytes], ...] = ()
    else:  # the usual GET: the version's head as built once
        out, head = [], headers.object_head(meta)
    if plan.parts_count is not None:
        out.append(("x-amz-mp-parts-count", str(plan.parts_count)))
    wanted = plan.wanted
    if plan.partial:
        out.append(("content-range", f"bytes {wanted.start}-{wanted.end - 1}/{meta.size}"))
    elif req.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED":
        out += _checksum_headers(meta)
    # For HEAD, Content-Length is the length a GET would send, as HEAD requires.
    out.append(("content-length", str(wanted.length)))
    return Response(status=plan.status, headers=out, body=plan.body if plan.body is not None else b"", head=head)


async def get_object(ctx: Context, req: S3Request) -> Response:
    plan = await ctx.service.read(_read(req, body=True))
    # Which tier served the body (metrics, access log): counted by tiering
    # as the body is produced, so a streamed GET is complete once sent.
    req.tally = plan.tally
    return _answer(req, plan)


async def head_object(ctx: Context, req: S3Request) -> Response:
    return _answer(req, await ctx.service.read(_read(req, body=False)))


def write_conditions(req: S3Request) -> WriteConditions:
    """If-None-Match: * and If-Match: <etag> on a write (S3 conditional
    writes); If-None-Match takes nothing but * there."""
    none_match = req.headers.get("if-none-match")
    if none_match is not None and none_match.strip() != "*":
        raise S3Error("NotImplemented", "If-None-Match only supports * on writes")
    match = req.headers.get("if-match")
    return WriteConditions(if_none_match=none_match is not None, if_match=match.strip() if match is not None else None)


async def put_object(ctx: Context, req: S3Request) -> Response:
    if "x-amz-copy-source" in req.headers:
        req.op = "CopyObject"
        return await copy_object(ctx, req)
    new = headers.new_object(req.headers)
    conditions = write_conditions(req)
    acl = permissions.for_write(ctx, req)
    stream, integrity = body.prepare(req)
    meta = await ctx.service.put(req.bucket, req.key, stream, new, integrity, conditions)
    await permissions.object_written(ctx, req.bucket, req.key, acl)
    out = [("etag", meta.quoted_etag), headers.SSE] + _checksum_headers(meta) + version_header(meta)
    return Response(headers=out)


def copy_source_name(raw: str, header: str = "x-amz-copy-source") -> tuple[str, str, str | None]:
    """(bucket, key, version) of an x-amz-copy-source value: ``[/]bucket/key``,
    URL-encoded UTF-8 (raw UTF-8 bytes are read as such too), and an optional
    ``?versionId=`` (None when absent)."""
    path, _, query = raw.partition("?")
    try:
        path = unquote_to_bytes(path.encode("latin-1")).decode("utf-8").lstrip("/")
    except UnicodeError:
        path = ""  # not UTF-8 once decoded: names nothing
    bucket, _, key = path.partition("/")
    if not bucket or not key:
        raise S3Error("InvalidArgument", "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
                      ArgumentName=header, ArgumentValue=raw)
    version = parse_qs(query, keep_blank_values=True).get("versionId", [None])[0]
    if version is not None:
        try:
            version = parse_version(version)
        except TierstoreError as exc:
            raise S3Error("InvalidArgument", exc.message, ArgumentName=header, ArgumentValue=raw) from exc
    return bucket, key, version


async def copy_source(ctx: Context, req: S3Request, prefix: str = "x-amz-copy-source") -> ObjectMeta:
    """The object (version) named by x-amz-copy-source, its conditions checked."""
    bucket, key, version = copy_source_name(req.headers[prefix], prefix)
    source = await ctx.service.head(bucket, key, version)
    check(source, headers.conditions(req.headers, f"{prefix}-if-"), for_copy=True)
    return source


def _directive(req: S3Request, name: str) -> str:
    value = req.headers.get(name, "COPY").upper()
    if value not in ("COPY", "REPLACE"):
        what = "metadata" if name == "x-amz-metadata-directive" else "tagging"
        raise S3Error("InvalidArgument", f"Unknown {what} directive.", ArgumentName=name, ArgumentValue=value)
    return value


async def copy_object(ctx: Context, req: S3Request) -> Response:
    headers.check_write(req.headers)
    conditions = write_conditions(req)
    acl = permissions.for_write(ctx, req)  # an ACL is never copied: the one asked for, else private
    source = await copy_source(ctx, req)
    replace_meta = _directive(req, "x-amz-metadata-directive") == "REPLACE"
    new = headers.new_object(req.headers) if replace_meta else copied_meta(source)
    # Tags follow their own directive: the source's (COPY, the default), or
    # those of x-amz-tagging, none if it is absent (REPLACE).
    new.tags = headers.tagging(req.headers.get("x-amz-tagging")) \
        if _directive(req, "x-amz-tagging-directive") == "REPLACE" else dict(source.tags)
    algorithm = req.headers.get("x-amz-checksum-algorithm")
    if algorithm is not None and algorithm.upper() not in checksums.ALGORITHMS:
        raise S3Error("InvalidRequest", f"Checksum algorithm {algorithm} is not supported")
    # A copy of a version named by its id onto its own key is how S3
    # restores an older version: a new version, never "onto itself".
    named_version = copy_source_name(req.headers["x-amz-copy-source"])[2] is not None
    same = (source.bucket, source.key) == (req.bucket, req.key) and not named_version
    # A copy onto itself must change something S3 counts: the metadata,
    # the checksum or the encryption (asking for AES256 again counts).
    changes = replace_meta or "x-amz-server-side-encryption" in req.headers
    if same and not changes and algorithm is None:
        raise S3Error(
            "InvalidRequest",
            "This copy request is illegal because it is trying to copy an object to itself without "
            "changing the object's metadata, storage class, website redirect location or encryption attributes.",
        )
    if same and algorithm is None:
        # The destination is the source: its conditions are checked against
        # it now, and the rewrite commits only over that same version.
        conditions.check(source, req.key)
        meta = await ctx.service.rewrite_meta(source, new)
    else:
        meta = await ctx.service.copy(source, req.bucket, req.key, new, algorithm.upper() if algorithm else None,
                                      conditions)
    await permissions.object_written(ctx, req.bucket, req.key, acl)
    out = [headers.SSE] + version_header(meta)
    if source.version is not None:
        out.append(("x-amz-copy-source-version-id", source.version))
    return Response(headers=out, body=xml.copy_object(meta), content_type=XML)


async def delete_object(ctx: Context, req: S3Request) -> Response:
    version = version_param(req)
    match = req.headers.get("if-match")
    conditions = WriteConditions(if_match=match.strip()) if match is not None else None
    deletion = await ctx.service.delete(req.bucket, req.key, conditions, version)
    if version is None and not deletion.marker:
        await permissions.object_deleted(ctx, req.bucket, req.key)
    out = []
    if deletion.version is not None:
        out.append(("x-amz-version-id", deletion.version))
    if deletion.marker:
        out.append(("x-amz-delete-marker", "true"))
    return Response(status=204, headers=out)


async def delete_objects(ctx: Context, req: S3Request) -> Response:
    data = await body.read_small(req, MAX_DELETE_BODY)
    quiet, targets = xml.parse_delete(data)
    await ctx.service.bucket(req.bucket)
    outcomes: list[xml.DeleteOutcome | None] = []
    batch: list[tuple[str, str | None]] = []  # deleted together, in one call
    caller = req.caller
    refused = 0
    for key, version, etag in targets:
        try:
            check_key(key)
            version = parse_version(version) if version is not None else None
            # Each key is authorised on its own (gateway/auth/access.py), as S3 does.
            if caller is not None and not caller.allows(
                    "s3:DeleteObjectVersion" if version is not None else "s3:DeleteObject", req.bucket, key,
                    keep=False):
                refused += 1
                raise S3Error("AccessDenied", "Access Denied")
            if etag is not None:  # a conditional delete of its own (If-Match)
                outcomes.append(_outcome(key, version, await ctx.service.delete(
                    req.bucket, key, WriteConditions(if_match=etag), version)))
            else:
                batch.append((key, version))
                outcomes.append(None)  # filled in below, in request order
        except (TierstoreError, S3Error) as exc:
            err = to_s3_error(exc)
            outcomes.append(xml.DeleteOutcome(key, version, err.code, err.message))
    if targets and refused == len(targets):
        raise S3Error("AccessDenied", "Access Denied")  # none of it: the request is refused whole
    # In a bucket never versioned, one synced index batch for the whole
    # request instead of one per key.
    done = iter(await ctx.service.delete_many(req.bucket, batch))
    pending = iter(batch)
    answered = [o if o is not None else _outcome(*next(pending), next(done)) for o in outcomes]
    await permissions.objects_deleted(ctx, req.bucket, [a.key for a in answered
                                                        if a.code is None and not a.marker and a.version_id is None])
    return Response(body=xml.delete_result(answered, quiet), content_type=XML)


def _outcome(key: str, version: str | None, deletion: Deletion) -> xml.DeleteOutcome:
    """DeleteObjects' <Deleted> for one key: a delete marker made (its id
    as DeleteMarkerVersionId), or the version deleted."""
    if version is None and deletion.marker:
        return xml.DeleteOutcome(key, None, marker=True, marker_version=deletion.version)
    return xml.DeleteOutcome(key, version, marker=deletion.marker)
