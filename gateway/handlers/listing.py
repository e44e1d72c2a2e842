"""ListObjectsV2, ListObjects (v1) and ListObjectVersions."""

from __future__ import annotations

import base64
import binascii
import re

from gateway.handlers.context import Context, owner_of
from gateway.s3 import xml
from gateway.s3.errors import S3Error
from gateway.s3.http import Response, S3Request
from tiering.index.db import ListPage
from tiering.model.versions import VersionPage, parse_version

XML = "application/xml"
MAX_KEYS = 1000  # a page holds at most this many; larger asks are clamped, as S3 does
MAX_INT32 = 2**31 - 1  # S3 parses max-keys as a 32-bit integer; larger is not one
_TOKEN = re.compile(r"[A-Za-z0-9_-]+={0,2}")


def max_keys(req: S3Request, name: str = "max-keys") -> int:
    raw = req.query.get(name)
    if raw is None:
        return MAX_KEYS
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_INT32:
        raise S3Error("InvalidArgument", f"Provided {name} not an integer or within integer range",
                      ArgumentName=name, ArgumentValue=raw)
    return min(value, MAX_KEYS)


def encoding_type(req: S3Request) -> str | None:
    value = req.query.get("encoding-type")
    if value is None or value == "":
        return None
    if value.lower() != "url":
        raise S3Error("InvalidArgument", "Invalid Encoding Method specified in Request",
                      ArgumentName="encoding-type", ArgumentValue=value)
    return "url"


def _token(last: str) -> str:
    # Opaque to clients; it is the last key or common prefix of the page.
    return base64.urlsafe_b64encode(last.encode()).decode()


def _untoken(token: str) -> str:
    # Strict: b64decode drops characters outside the alphabet, so "!!!!"
    # would decode to "" and restart the listing; keys never hold NUL.
    try:
        if not _TOKEN.fullmatch(token):
            raise ValueError(token)
        last = base64.urlsafe_b64decode(token.encode()).decode()
        if not last or "\x00" in last:
            raise ValueError(token)
        return last
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise S3Error("InvalidArgument", "The continuation token provided is incorrect",
                      ArgumentName="continuation-token") from exc


async def _page(ctx: Context, req: S3Request, prefix: str, delimiter: str, marker: str, limit: int) -> ListPage:
    """One page of the bucket; max-keys=0 asks for none, which S3 answers
    with an empty page that is not truncated (the bucket must still exist)."""
    if limit == 0:
        await ctx.service.bucket(req.bucket)
        return ListPage()
    return await ctx.service.list(req.bucket, prefix, delimiter, marker, limit)


async def list_objects(ctx: Context, req: S3Request) -> Response:
    if req.query.get("list-type") == "2":
        req.op = "ListObjectsV2"
        return await _list_v2(ctx, req)
    if "list-type" in req.query and req.query["list-type"] != "1":
        raise S3Error("InvalidArgument", "Invalid list type", ArgumentName="list-type")
    q = req.query
    prefix, delimiter, marker = q.get("prefix", ""), q.get("delimiter", ""), q.get("marker", "")
    limit = max_keys(req)
    page = await _page(ctx, req, prefix, delimiter, marker, limit)
    body = xml.list_objects_v1(
        req.bucket, page, prefix=prefix, delimiter=delimiter, max_keys=limit,
        encoding_type=encoding_type(req), marker=marker, owner=owner_of(req),
    )
    return Response(body=body, content_type=XML)


async def _list_v2(ctx: Context, req: S3Request) -> Response:
    q = req.query
    prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
    # An empty continuation-token lists from the start (clients that begin
    # a walk with token="" rely on it) and, like any token sent, is echoed:
    # S3 answers <ContinuationToken></ContinuationToken>.
    token = q.get("continuation-token")
    start_after = q.get("start-after", "")
    marker = _untoken(token) if token else start_after
    limit = max_keys(req)
    page = await _page(ctx, req, prefix, delimiter, marker, limit)
    fetch_owner = q.get("fetch-owner", "").lower() == "true"
    body = xml.list_objects_v2(
        req.bucket, page, prefix=prefix, delimiter=delimiter, max_keys=limit,
        encoding_type=encoding_type(req), start_after=start_after or None,
        continuation_token=token,
        next_token=_token(page.last) if page.truncated and page.last is not None else None,
        owner=owner_of(req) if fetch_owner else None,
    )
    return Response(body=body, content_type=XML)


async def list_versions(ctx: Context, req: S3Request) -> Response:
    """Every version and delete marker, key order then newest first."""
    q = req.query
    prefix, delimiter, key_marker = q.get("prefix", ""), q.get("delimiter", ""), q.get("key-marker", "")
    version_marker = q.get("version-id-marker", "")
    if version_marker and not key_marker:
        raise S3Error("InvalidArgument", "A version-id marker cannot be specified without a key marker.",
                      ArgumentName="version-id-marker", ArgumentValue=version_marker)
    if version_marker:
        parse_version(version_marker)
    limit = max_keys(req)
    if limit == 0:
        await ctx.service.bucket(req.bucket)
        page = VersionPage()
    else:
        page = await ctx.service.list_versions(req.bucket, prefix, delimiter, key_marker, version_marker, limit)
    body = xml.list_versions(
        req.bucket, page, prefix=prefix, delimiter=delimiter, max_keys=limit,
        encoding_type=encoding_type(req), key_marker=key_marker, version_marker=version_marker,
        owner=owner_of(req),
    )
    return Response(body=body, content_type=XML)
