"""Object tagging: GetObjectTagging, PutObjectTagging, DeleteObjectTagging.

Tags live in the object's record (``ObjectMeta.tags``), so they travel with
it through flush, compaction and recovery; setting them makes a new record
of the same bytes (same ETag and Last-Modified, as in S3).
"""

from __future__ import annotations

from gateway import body, xml
from gateway.context import Context
from gateway.handlers.objects import _check_version as check_version
from gateway.http import Response, S3Request

XML = "application/xml"
MAX_TAGGING_BODY = 64 * 1024  # ten tags of 128 + 256 characters are ~10 KiB


async def get_tagging(ctx: Context, req: S3Request) -> Response:
    check_version(req)
    tags = await ctx.service.tags(req.bucket, req.key)
    return Response(body=xml.tagging(tags), content_type=XML)


async def put_tagging(ctx: Context, req: S3Request) -> Response:
    check_version(req)
    tags = xml.parse_tagging(await body.read_small(req, MAX_TAGGING_BODY))
    await ctx.service.retag(req.bucket, req.key, tags)
    return Response()


async def delete_tagging(ctx: Context, req: S3Request) -> Response:
    check_version(req)
    await ctx.service.retag(req.bucket, req.key, {})
    return Response(status=204)
