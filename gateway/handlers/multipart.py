"""Multipart upload operations."""

from __future__ import annotations

from gateway.handlers import permissions
from gateway.handlers.context import Context, owner_of
from gateway.handlers.listing import MAX_INT32, encoding_type, max_keys
from gateway.handlers.objects import copy_source, version_header, write_conditions
from gateway.s3 import body, headers, xml
from gateway.s3.errors import S3Error
from gateway.s3.http import Response, S3Request
from packer.ranges import ByteRange
from tiering.meta import Part
from tiering.model import checksums

XML = "application/xml"
MAX_COMPLETE_BODY = 4 * 1024 * 1024  # 10,000 parts with checksums fit in ~2 MiB


def _int(req: S3Request, name: str, default: int | None = None) -> int:
    raw = req.query.get(name)
    if raw is None and default is not None:
        return default
    # ASCII digits only: int() would also take "٣" or " 3", which S3 refuses.
    value = headers.decimal(raw) if raw is not None else None
    if value is None:
        raise S3Error("InvalidArgument", f"Invalid {name}", ArgumentName=name, ArgumentValue=raw)
    return value


async def create_upload(ctx: Context, req: S3Request) -> Response:
    algorithm = req.headers.get("x-amz-checksum-algorithm")
    if algorithm is not None:
        algorithm = algorithm.strip().upper()
        if algorithm not in checksums.ALGORITHMS:
            raise S3Error("InvalidRequest", f"Checksum algorithm {algorithm} is not supported")
    checksum_type = req.headers.get("x-amz-checksum-type")
    acl = permissions.for_write(ctx, req)
    upload = await ctx.service.create_upload(
        req.bucket, req.key, headers.new_object(req.headers), algorithm,
        checksum_type.strip().upper() if checksum_type else None,
    )
    if acl == "public-read":  # the key's ACL from now on (docs/users-and-policies.md)
        await permissions.object_written(ctx, req.bucket, req.key, acl)
    out = [headers.SSE]
    if upload.checksum_algorithm:
        out += [("x-amz-checksum-algorithm", upload.checksum_algorithm),
                ("x-amz-checksum-type", upload.checksum_type or "COMPOSITE")]
    return Response(headers=out, body=xml.initiate_upload(upload), content_type=XML)


def _part_headers(part: Part) -> list[tuple[str, str]]:
    out = [("etag", f'"{part.etag}"'), headers.SSE]
    if part.checksum is not None:
        out.append((checksums.header_name(part.checksum.algorithm), part.checksum.value))
    return out


async def upload_part(ctx: Context, req: S3Request) -> Response:
    copy = "x-amz-copy-source" in req.headers
    if copy:
        req.op = "UploadPartCopy"
    number = _int(req, "partNumber")
    upload_id = req.query["uploadId"]
    if copy:
        return await _upload_part_copy(ctx, req, number, upload_id)
    stream, integrity = body.prepare(req)
    part = await ctx.service.upload_part(req.bucket, req.key, upload_id, number, stream, integrity)
    return Response(headers=_part_headers(part))


async def _upload_part_copy(ctx: Context, req: S3Request, number: int, upload_id: str) -> Response:
    source = await copy_source(ctx, req)
    raw = req.headers.get("x-amz-copy-source-range")
    wanted = ByteRange(0, source.size)
    if raw is not None:
        wanted = _copy_range(raw, source.size)
    part = await ctx.service.upload_part_copy(req.bucket, req.key, upload_id, number, source, wanted)
    return Response(headers=[headers.SSE], body=xml.copy_part(part), content_type=XML)


def _copy_range(raw: str, size: int) -> ByteRange:
    """x-amz-copy-source-range must be a full ``bytes=first-last`` inside
    the source; anything else is InvalidArgument (not ignored, unlike Range)."""
    spec = raw.strip()
    first_text, _, last_text = spec.removeprefix("bytes=").partition("-")
    first, last = headers.decimal(first_text), headers.decimal(last_text)
    if not spec.startswith("bytes=") or first is None or last is None or last < first:
        raise S3Error("InvalidArgument", "The x-amz-copy-source-range value must be of the form bytes=first-last "
                      "where first and last are the zero-based offsets of the first and last bytes to copy",
                      ArgumentName="x-amz-copy-source-range", ArgumentValue=raw)
    if last >= size:
        raise S3Error("InvalidRange", "The requested range is not satisfiable",
                      RangeRequested=spec, ActualObjectSize=size)
    return ByteRange(first, last + 1)


async def complete_upload(ctx: Context, req: S3Request) -> Response:
    conditions = write_conditions(req)
    chosen = xml.parse_complete(await body.read_small(req, MAX_COMPLETE_BODY))
    meta = await ctx.service.complete_upload(req.bucket, req.key, req.query["uploadId"], chosen, conditions)
    host = req.headers.get("host", "")
    location = f"{ctx.config.scheme}://{host}/{req.bucket}/{req.key}"
    out = [("etag", meta.quoted_etag), headers.SSE] + version_header(meta)
    if meta.checksum is not None:
        out.append(("x-amz-checksum-type", meta.checksum.type))
    return Response(headers=out, body=xml.complete_upload(location, meta), content_type=XML)


async def abort_upload(ctx: Context, req: S3Request) -> Response:
    await ctx.service.abort_upload(req.bucket, req.key, req.query["uploadId"])
    return Response(status=204)


async def list_parts(ctx: Context, req: S3Request) -> Response:
    marker = _int(req, "part-number-marker", 0)
    if not 0 <= marker <= MAX_INT32:
        raise S3Error("InvalidArgument",
                      f"Argument part-number-marker must be an integer between 0 and {MAX_INT32}",
                      ArgumentName="part-number-marker", ArgumentValue=req.query["part-number-marker"])
    limit = max_keys(req, "max-parts")
    upload, parts, truncated = await ctx.service.list_parts(
        req.bucket, req.key, req.query["uploadId"], marker, limit
    )
    return Response(
        body=xml.list_parts(upload, parts, marker=marker, max_parts=limit, truncated=truncated, owner=owner_of(req)),
        content_type=XML,
    )


async def list_uploads(ctx: Context, req: S3Request) -> Response:
    q = req.query
    prefix, key_marker, id_marker = q.get("prefix", ""), q.get("key-marker", ""), q.get("upload-id-marker", "")
    limit = max_keys(req, "max-uploads")
    uploads, truncated = await ctx.service.list_uploads(req.bucket, prefix, key_marker, id_marker, limit)
    return Response(
        body=xml.list_uploads(
            req.bucket, uploads, prefix=prefix, key_marker=key_marker, upload_id_marker=id_marker,
            max_uploads=limit, truncated=truncated, encoding_type=encoding_type(req), owner=owner_of(req),
        ),
        content_type=XML,
    )
