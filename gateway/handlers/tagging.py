"""Object tagging: GetObjectTagging, PutObjectTagging, DeleteObjectTagging.

Tags live in the object's record (``ObjectMeta.tags``), so they travel with
it through flush, compaction and recovery; setting them makes a new record
of the same bytes (same ETag and Last-Modified, as in S3).
"""

from __future__ import annotations

from gateway.handlers.context import Context
from gateway.handlers.objects import version_header, version_param
from gateway.s3 import body, xml
from gateway.s3.http import Response, S3Request

XML = "application/xml"
MAX_TAGGING_BODY = 64 * 1024  # ten tags of 128 + 256 characters are ~10 KiB


async def get_tagging(ctx: Context, req: S3Request) -> Response:
    version = version_param(req)
    if version is None:
        tags = await ctx.service.tags(req.bucket, req.key)
        return Response(body=xml.tagging(tags), content_type=XML)
    meta = await ctx.service.head(req.bucket, req.key, version)
    return Response(headers=version_header(meta), body=xml.tagging(meta.tags), content_type=XML)


async def put_tagging(ctx: Context, req: S3Request) -> Response:
    version = version_param(req)
    tags = xml.parse_tagging(await body.read_small(req, MAX_TAGGING_BODY))
    meta = await ctx.service.retag(req.bucket, req.key, tags, version)
    return Response(headers=version_header(meta))


async def delete_tagging(ctx: Context, req: S3Request) -> Response:
    meta = await ctx.service.retag(req.bucket, req.key, {}, version_param(req))
    return Response(status=204, headers=version_header(meta))
