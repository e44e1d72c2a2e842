"""Admin routes for mounted buckets: existing S3 data served through the
hot tier (see ``tiering/mounts/buckets.py``)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from fastapi import APIRouter, Response

from gateway.admin.bodies import admin_router
from gateway.admin.context import AdminContext
from gateway.admin.errors import AdminError, responses
from gateway.admin.models import SOURCE_PATTERN, MountList, MountView, NewMount, mount_view
from tiering.errors import BucketAlreadyOwnedByYou, CapacityError, InvalidBucketName, NoSuchBucket
from tiering.meta import Mount, now_ms


def _source(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix), by the pattern the schema documents."""
    match = re.fullmatch(SOURCE_PATTERN, url)
    if match is None:
        raise AdminError("InvalidRequest", f"source {url!r}: expected s3://bucket or s3://bucket/prefix")
    return match[1], (match[2] or "").strip("/")


def _check_endpoint(url: str) -> None:
    """An http(s) URL with a host and a valid port, and no credentials in it:
    the URL is shown by GET /mounts and in error messages, the keys are not."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError when out of range)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise AdminError("InvalidRequest", "endpoint: expected an http(s) URL with a host")
    if parts.username is not None or parts.password is not None:
        raise AdminError("InvalidRequest",
                         "endpoint: give access_key and secret_key, not user:password@ in the URL")


def router(ctx: AdminContext) -> APIRouter:
    api = admin_router(responses=responses("Unavailable"))  # every route needs the running service

    @api.get("/mounts", tags=["mounts"], response_model=MountList)
    async def list_mounts() -> MountList:
        """Every mounted bucket (secret keys shown as ***)."""
        mounts = ctx.tiering().mounts
        return MountList(mounts=[mount_view(m, mounts.stats(m.name)) for m in mounts.all()])

    @api.post("/mounts", tags=["mounts"], status_code=201, response_model=MountView,
              responses=responses("InvalidRequest", "InvalidBucketName", "BucketAlreadyExists",
                                  "SourceUnavailable"))
    async def mount(new: NewMount) -> MountView:
        """Mount an existing S3 bucket/prefix as a gateway bucket (read-only
        unless ``read_write``).
        The source must answer now: a missing bucket, refused keys or an
        unreachable endpoint is 502 SourceUnavailable with the reason."""
        bucket, prefix = _source(new.source)
        if new.endpoint is not None:
            _check_endpoint(new.endpoint)
        if (new.access_key is None) != (new.secret_key is None):
            raise AdminError("InvalidRequest", "access_key and secret_key go together: give both or neither")
        record = Mount(
            name=new.name, bucket=bucket, prefix=prefix, created_ms=now_ms(), endpoint=new.endpoint,
            region=new.region, access_key=new.access_key, secret_key=new.secret_key,
            freshness=None if new.freshness == "immutable" else float(new.freshness),
            serve_stale=new.serve_stale, read_write=new.read_write, listing_ttl=new.listing_ttl,
            check_md5=new.check_md5,
        )
        try:
            mounts = ctx.tiering().mounts
            return mount_view(await mounts.mount(record), mounts.stats(record.name))
        except InvalidBucketName:
            raise AdminError("InvalidBucketName", f"invalid bucket name {new.name!r}") from None
        except BucketAlreadyOwnedByYou:
            raise AdminError("BucketAlreadyExists", f"a bucket or mount {new.name!r} exists") from None
        except CapacityError as exc:
            raise AdminError("SourceUnavailable", exc.message or str(exc)) from None
        except ValueError as exc:  # a prefix that is not a clean path, and the like
            raise AdminError("InvalidRequest", str(exc)) from None

    @api.get("/mounts/{name}", tags=["mounts"], response_model=MountView, responses=responses("NoSuchMount"))
    async def get_mount(name: str) -> MountView:
        """One mount, with the requests this node made of its source."""
        mounts = ctx.tiering().mounts
        found = mounts.get(name)
        if found is None:
            raise AdminError("NoSuchMount", f"no mount {name!r}")
        return mount_view(found, mounts.stats(name))

    @api.delete("/mounts/{name}", tags=["mounts"], status_code=204, responses=responses("NoSuchMount"))
    async def unmount(name: str) -> Response:
        """Unmount: the gateway bucket goes, with what it cached; the source
        is not touched."""
        try:
            await ctx.tiering().mounts.unmount(name)
        except NoSuchBucket:
            raise AdminError("NoSuchMount", f"no mount {name!r}") from None
        return Response(status_code=204)

    return api
