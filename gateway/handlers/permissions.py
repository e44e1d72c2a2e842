"""Bucket policies and canned ACLs: Get/Put/DeleteBucketPolicy,
Get/PutBucketAcl, Get/PutObjectAcl, and ``x-amz-acl`` on the writes that
take it (CreateBucket, PutObject, CopyObject, CreateMultipartUpload).

Both live in the identities document (``tiering/identity``), so every node
honours them within its follow interval, and the authorisation point
(``gateway/auth/access.py``) reads them from its snapshot. Two canned ACLs are
honoured: ``private`` (the owner only) and ``public-read`` (the AllUsers
group may read: list a bucket, GET an object). ``bucket-owner-read`` and
``bucket-owner-full-control`` are ``private`` here (one account owns
everything); the rest (``public-read-write``, ``authenticated-read``, ...)
and grants to other accounts are 501 NotImplemented rather than read as
something they do not say.
"""

from __future__ import annotations

from gateway.handlers.context import Context, owner_of
from gateway.s3 import body, xml
from gateway.s3.errors import S3Error
from gateway.s3.http import Response, S3Request
from tiering.identity.policy import MAX_DOCUMENT, MAX_TEXT, PolicyError
from tiering.identity.state import MAX_OBJECT_ACLS, State

XML = "application/xml"
MAX_ACL_BODY = 64 * 1024
MAX_POLICY_BODY = MAX_TEXT  # a policy is at most 20 KiB without whitespace (tiering/identity/policy.py)
_AS_PRIVATE = ("private", "bucket-owner-read", "bucket-owner-full-control")
_CANNED = ("private", "public-read", "public-read-write", "authenticated-read", "aws-exec-read",
           "bucket-owner-read", "bucket-owner-full-control", "log-delivery-write")


def canned(req: S3Request) -> str | None:
    """The ``x-amz-acl`` of a request as honoured here (``private`` or
    ``public-read``), None when absent; checked before anything is written."""
    value = req.headers.get("x-amz-acl")
    if any(name.startswith("x-amz-grant-") for name in req.headers):
        raise S3Error("NotImplemented", "x-amz-grant-* headers are not implemented by this gateway; "
                      "use the canned ACLs private or public-read")
    if value is None:
        return None
    value = value.strip()
    if value not in _CANNED:
        raise S3Error("InvalidArgument", "Invalid canned ACL", ArgumentName="x-amz-acl", ArgumentValue=value)
    if value in _AS_PRIVATE:
        return "private"
    if value != "public-read":
        raise S3Error("NotImplemented", f"The canned ACL {value} is not implemented by this gateway; "
                      "it honours private and public-read")
    return value


def for_write(ctx: Context, req: S3Request) -> str | None:
    """:func:`canned` of a write of ``req.key``, checked against the
    bucket's room for object ACLs before anything is written."""
    acl = canned(req)
    access = ctx.identities.state.buckets.get(req.bucket) if ctx.identities is not None else None
    if acl == "public-read" and access is not None and req.key not in access.objects \
            and len(access.objects) >= MAX_OBJECT_ACLS:
        raise S3Error("InvalidRequest", f"Bucket {req.bucket} has {MAX_OBJECT_ACLS} objects with an ACL of their "
                      "own: make the bucket public with a bucket policy instead")
    return acl


async def object_written(ctx: Context, bucket: str, key: str, acl: str | None) -> None:
    """After a write of ``key``: its ACL is the one asked for (private when
    none, as a new object's is in S3). Changes the document only when that
    changes what it holds."""
    identities = ctx.identities
    if identities is None:
        return
    wanted = acl or "private"
    access = identities.state.buckets.get(bucket)
    held = access.objects.get(key, "private") if access is not None else "private"
    if held != wanted:
        await identities.change(lambda state: state.set_object_acl(bucket, key, wanted))


async def object_deleted(ctx: Context, bucket: str, key: str) -> None:
    """A deleted object's ACL goes with it."""
    await object_written(ctx, bucket, key, None)


async def objects_deleted(ctx: Context, bucket: str, keys: list[str]) -> None:
    """The ACLs of the objects a DeleteObjects deleted go with them (one change)."""
    identities = ctx.identities
    access = identities.state.buckets.get(bucket) if identities is not None else None
    if identities is None or access is None:
        return
    held = [key for key in keys if key in access.objects]

    def forget(state: State) -> None:
        for key in held:
            state.set_object_acl(bucket, key, "private")

    if held:
        await identities.change(forget)


async def bucket_created(ctx: Context, req: S3Request, acl: str | None) -> None:
    if acl == "public-read" and ctx.identities is not None:
        await ctx.identities.change(lambda state: state.set_bucket_acl(req.bucket, "public-read"))


async def bucket_deleted(ctx: Context, bucket: str) -> None:
    """A deleted bucket's policy and ACLs go with it, as in S3."""
    identities = ctx.identities
    if identities is not None and bucket in identities.state.buckets:
        await identities.change(lambda state: state.forget_bucket(bucket))


def _identities(ctx: Context):  # type: ignore[no-untyped-def]
    if ctx.identities is None:  # a read worker passes these requests on: never here
        raise S3Error("ServiceUnavailable", "The gateway is starting or stopping; retry shortly.")
    return ctx.identities


# -- bucket policies ------------------------------------------------------------------------------


async def get_policy(ctx: Context, req: S3Request) -> Response:
    await ctx.service.bucket(req.bucket)
    access = _identities(ctx).state.buckets.get(req.bucket)
    if access is None or access.policy is None:
        raise S3Error("NoSuchBucketPolicy", BucketName=req.bucket)
    return Response(body=access.policy.encode(), content_type="application/json")


async def put_policy(ctx: Context, req: S3Request) -> Response:
    try:
        data = await body.read_small(req, MAX_POLICY_BODY)
    except S3Error as exc:
        if exc.code != "MaxMessageLengthExceeded":
            raise
        raise S3Error("MalformedPolicy", f"Policies must be at most {MAX_DOCUMENT} bytes without their "
                      "whitespace") from None
    await ctx.service.bucket(req.bucket)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise S3Error("MalformedPolicy", "Policies must be valid JSON (UTF-8 text)") from None
    bucket = req.bucket

    def put(state: State) -> None:
        state.put_bucket_policy(bucket, text)

    try:
        await _identities(ctx).change(put)
    except PolicyError as exc:
        raise S3Error("MalformedPolicy", str(exc)) from None
    return Response(status=204)


async def delete_policy(ctx: Context, req: S3Request) -> Response:
    await ctx.service.bucket(req.bucket)
    identities = _identities(ctx)
    access = identities.state.buckets.get(req.bucket)
    if access is not None and access.policy is not None:
        await identities.change(lambda state: state.put_bucket_policy(req.bucket, None))
    return Response(status=204)


# -- ACLs -------------------------------------------------------------------------------------------


async def get_acl(ctx: Context, req: S3Request) -> Response:
    """The owner's FULL_CONTROL, and AllUsers READ when public-read."""
    access = _identities(ctx).state.buckets.get(req.bucket)
    if req.key:
        await ctx.service.head(req.bucket, req.key)
        public = access is not None and access.objects.get(req.key) == "public-read"
    else:
        await ctx.service.bucket(req.bucket)
        public = access is not None and access.acl == "public-read"
    return Response(body=xml.acl(owner_of(req), public), content_type=XML)


async def put_acl(ctx: Context, req: S3Request) -> Response:
    """A canned ACL (``x-amz-acl``) or an AccessControlPolicy body that
    grants what one of them does."""
    acl = canned(req)
    data = await body.read_small(req, MAX_ACL_BODY)
    if acl is not None and data.strip():
        raise S3Error("UnexpectedContent", "This request does not support content when x-amz-acl is given")
    if acl is None:
        acl = _from_grants(xml.parse_acl(data)) if data.strip() else None
    if acl is None:
        raise S3Error("MissingSecurityHeader", "Your request was missing a required header",
                      MissingHeaderName="x-amz-acl")
    identities = _identities(ctx)
    if req.key:
        await ctx.service.head(req.bucket, req.key)
        await object_written(ctx, req.bucket, req.key, acl)
    else:
        await ctx.service.bucket(req.bucket)
        await identities.change(lambda state: state.set_bucket_acl(req.bucket, acl))
    return Response()


def _from_grants(grants: list[tuple[str, str]]) -> str:
    """The canned ACL a list of grants amounts to: the owner's, plus at
    most AllUsers READ."""
    public = False
    for who, permission in grants:
        if who == xml.ALL_USERS and permission == "READ":
            public = True
        elif not who.startswith("id:") or permission != "FULL_CONTROL":
            raise S3Error("NotImplemented", f"The grant of {permission} to {who} is not implemented by this "
                          "gateway; it honours the owner's FULL_CONTROL and AllUsers READ (public-read)")
    return "public-read" if public else "private"
