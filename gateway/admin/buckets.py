"""Admin routes for buckets and their policies, objects' whereabouts, and pins."""

from __future__ import annotations

from dataclasses import replace

from fastapi import APIRouter, Response

from gateway.admin.bodies import admin_router, printable
from gateway.admin.context import AdminContext
from gateway.admin.errors import AdminError, responses
from gateway.admin.models import (
    Bucket,
    BucketList,
    BucketPolicy,
    NewBucket,
    ObjectLocation,
    Pin,
    PinList,
    bucket_view,
    location_view,
)
from tiering.errors import (
    AccessDenied,
    BucketAlreadyOwnedByYou,
    BucketNotEmpty,
    InvalidBucketName,
    NoSuchBucket,
    NoSuchKey,
)
from tiering.meta import BucketInfo
from tiering.node import Node


def _no_bucket(name: str) -> AdminError:
    return AdminError("NoSuchBucket", f"bucket {name!r} does not exist")


def _view(service: Node, info: BucketInfo) -> Bucket:
    policies = service.policies
    return bucket_view(info, policies.resolve(info), policies.bucket_pinned(info.name))


def _check(service: Node, policy: BucketPolicy) -> None:
    """Combinations a field's own bounds cannot express."""
    small = policy.small_object_size
    if small is not None and small > service.settings.segment_size:
        raise AdminError(
            "InvalidRequest",
            f"small_object_size {small} is larger than the segment size {service.settings.segment_size}",
        )


async def _set_pinned(service: Node, name: str, pinned: bool | None) -> None:
    """The bucket's ``pinned`` policy is the pin of its whole key space."""
    if pinned is None or pinned == service.policies.bucket_pinned(name):
        return
    if pinned:
        # What is cached already is pinned now; later reads and flushes too.
        await service.tiers.residency.hold(name, "")
    else:
        await service.tiers.residency.unpin(name, "")


def router(ctx: AdminContext) -> APIRouter:
    api = admin_router(responses=responses("Unavailable"))  # every route needs the running service

    @api.get("/buckets", tags=["buckets"], response_model=BucketList)
    async def list_buckets() -> BucketList:
        """Every bucket with its effective policy."""
        service = ctx.tiering()
        return BucketList(buckets=[_view(service, b) for b in await service.objects.list_buckets()])

    @api.post(
        "/buckets",
        tags=["buckets"],
        status_code=201,
        response_model=Bucket,
        responses=responses("InvalidBucketName", "BucketAlreadyExists", "InvalidRequest", "NotWriter"),
    )
    async def create_bucket(new: NewBucket) -> Bucket:
        """Create a managed bucket with a policy (unset fields follow the
        node's settings)."""
        service = ctx.tiering()
        _check(service, new)
        fields = new.model_dump(exclude={"name", "pinned"}, exclude_none=True)
        try:
            info = await service.objects.create_bucket(new.name, **fields)
        except InvalidBucketName as exc:
            raise AdminError("InvalidBucketName", exc.message or f"invalid bucket name {new.name!r}") from None
        except BucketAlreadyOwnedByYou:
            raise AdminError("BucketAlreadyExists", f"bucket {new.name!r} already exists") from None
        await _set_pinned(service, new.name, new.pinned)
        return _view(service, info)

    @api.get("/buckets/{name}", tags=["buckets"], response_model=Bucket,
             responses=responses("NoSuchBucket"))
    async def get_bucket(name: str) -> Bucket:
        """A bucket and its effective policy."""
        service = ctx.tiering()
        try:
            return _view(service, await service.objects.bucket(name))
        except NoSuchBucket:
            raise _no_bucket(name) from None

    @api.patch("/buckets/{name}", tags=["buckets"], response_model=Bucket,
               responses=responses("NoSuchBucket", "InvalidRequest", "NotWriter"))
    async def patch_bucket(name: str, policy: BucketPolicy) -> Bucket:
        """Change a bucket's policy, e.g. ``{"write_through": true}``. New
        writes follow it; data already written keeps its layout."""
        service = ctx.tiering()
        _check(service, policy)
        try:
            info = await service.objects.bucket(name)
            changes = policy.model_dump(exclude={"pinned"}, exclude_none=True)
            if changes:
                info = await service.objects.set_policy(replace(info, **changes))
        except NoSuchBucket:
            raise _no_bucket(name) from None
        await _set_pinned(service, name, policy.pinned)
        return _view(service, info)

    @api.delete("/buckets/{name}", tags=["buckets"], status_code=204,
                responses=responses("NoSuchBucket", "BucketNotEmpty", "NotWriter"))
    async def delete_bucket(name: str) -> Response:
        """Delete an empty bucket (and its pins)."""
        try:
            await ctx.tiering().objects.delete_bucket(name)
        except NoSuchBucket:
            raise _no_bucket(name) from None
        except BucketNotEmpty:
            raise AdminError("BucketNotEmpty", f"bucket {name!r} is not empty") from None
        except AccessDenied:
            raise AdminError("InvalidRequest", f"{name!r} is a mount: DELETE /mounts/{name}") from None
        return Response(status_code=204)

    @api.get("/objects/{bucket}/{key:path}", tags=["objects"], response_model=ObjectLocation,
             responses=responses("NoSuchBucket", "NoSuchKey"))
    async def locate(bucket: str, key: str) -> ObjectLocation:
        """Where one object lives: staged, cached in the hot tier, or only in
        the capacity store, chunk by chunk with its segment and extent."""
        service = ctx.tiering()
        try:
            meta = await service.objects.head(bucket, key)
        except NoSuchBucket:
            raise _no_bucket(bucket) from None
        except NoSuchKey:
            raise AdminError("NoSuchKey", f"no object {key!r} in bucket {bucket!r}") from None
        if service.mounts.get(bucket) is None:
            return location_view(meta, service.tiers.residency.states(meta), service.policies.pinned(bucket, key))
        # A mounted object: its cached pieces, or only at the source.
        names = service.mounts.piece_names(bucket, meta)
        part = service.settings.part_size
        sizes = [min(part, meta.size - i * part) for i in range(len(names))] if meta.size else [0]
        states = ["cached" if service.hot.is_cached(n) else "capacity" for n in names]
        return location_view(meta, states, False, sizes)

    @api.get("/pins", tags=["pins"], response_model=PinList)
    async def list_pins() -> PinList:
        """Every pinned bucket/prefix (start a pin with ``POST /jobs/pin``)."""
        pins = ctx.tiering().policies.pins()
        return PinList(pins=[Pin(bucket=printable(b), prefix=printable(p)) for b, p in pins])

    @api.delete("/pins", tags=["pins"], status_code=204, responses=responses("NoSuchPin"))
    async def delete_pin(bucket: str, prefix: str = "") -> Response:
        """Unpin: what the pin covered stays cached but may be evicted again."""
        try:
            await ctx.tiering().tiers.residency.unpin(bucket, prefix)
        except KeyError:
            raise AdminError("NoSuchPin", f"{bucket}/{prefix} is not pinned") from None
        return Response(status_code=204)

    return api
