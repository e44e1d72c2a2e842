"""Bucket operations: create, delete, head, location, list, versioning
(ACLs and policies: ``gateway/handlers/permissions.py``)."""

from __future__ import annotations

from gateway.handlers import permissions
from gateway.handlers.context import Context, owner_of
from gateway.s3 import body, xml
from gateway.s3.errors import S3Error
from gateway.s3.http import Response, S3Request
from tiering.errors import BucketAlreadyOwnedByYou

XML = "application/xml"
MAX_XML_BODY = 64 * 1024  # CreateBucketConfiguration and ACL bodies are tiny


async def list_buckets(ctx: Context, req: S3Request) -> Response:
    buckets = await ctx.service.list_buckets()
    return Response(body=xml.list_buckets(buckets, owner_of(req)), content_type=XML)


async def create_bucket(ctx: Context, req: S3Request) -> Response:
    # The body may name a LocationConstraint; this gateway serves one region,
    # so it is parsed (malformed XML is still an error) and otherwise ignored.
    xml.parse_location_constraint(await body.read_small(req, MAX_XML_BODY))
    if req.headers.get("x-amz-bucket-object-lock-enabled", "").strip().lower() == "true":
        raise S3Error("NotImplemented", "Object lock is not implemented by this gateway")
    acl = permissions.canned(req)
    try:
        await ctx.service.create_bucket(req.bucket)
    except BucketAlreadyOwnedByYou:
        # us-east-1 answers 200 to its owner re-creating a bucket (S3's
        # legacy behaviour there, kept for the tools that rely on it) and
        # keeps the bucket as it is; every other region answers 409.
        if ctx.config.region != "us-east-1":
            raise
        return Response(headers=[("location", f"/{req.bucket}")])
    await permissions.bucket_created(ctx, req, acl)
    return Response(headers=[("location", f"/{req.bucket}")])


async def delete_bucket(ctx: Context, req: S3Request) -> Response:
    await ctx.service.delete_bucket(req.bucket)
    await permissions.bucket_deleted(ctx, req.bucket)
    return Response(status=204)


async def head_bucket(ctx: Context, req: S3Request) -> Response:
    info = await ctx.service.bucket(req.bucket)
    return Response(headers=[("x-amz-bucket-region", info.region)])


async def get_location(ctx: Context, req: S3Request) -> Response:
    info = await ctx.service.bucket(req.bucket)
    return Response(body=xml.location(info.region), content_type=XML)


async def get_versioning(ctx: Context, req: S3Request) -> Response:
    info = await ctx.service.bucket(req.bucket)
    return Response(body=xml.versioning(info.versioning), content_type=XML)


async def put_versioning(ctx: Context, req: S3Request) -> Response:
    """Enabled or Suspended (never back to unversioned). MFA delete needs
    an MFA device's code with the request, as in S3; this gateway has no
    MFA devices to check one against, so it is never turned on."""
    status, mfa = xml.parse_versioning(await body.read_small(req, MAX_XML_BODY))
    if mfa and "x-amz-mfa" not in req.headers:
        raise S3Error("AccessDenied", "Mfa Authentication must be used for this request")
    if mfa:
        raise S3Error("NotImplemented", "MFA delete is not supported by this gateway: it has no MFA devices")
    await ctx.service.set_versioning(req.bucket, status)
    return Response()
