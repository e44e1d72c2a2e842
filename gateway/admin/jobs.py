"""Admin routes for actions (each starts a job) and for jobs themselves.

``POST /jobs/<kind>`` answers 202 with the job at once; with ``?wait=true``
it answers when the job has ended, 200 with its final state (a failed job
is still a 200: the job resource was served; its ``state`` says how it went).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Body, Response

from gateway.admin.bodies import admin_router
from gateway.admin.context import AdminContext
from gateway.admin.errors import AdminError, responses
from gateway.admin.models import (
    CompactRequest,
    EvictRequest,
    JobList,
    JobView,
    Pin,
    WarmRequest,
    job_view,
)
from gateway.client.order import PatternError, expand_all
from gateway.storage import peer_client
from tiering import pool
from tiering.cluster.peers import PeerClient
from tiering.errors import InvalidArgument, NoSuchBucket, NoSuchKey
from tiering.jobs import Job, JobFinished, Work

# Longest a ?wait=true request holds on; the job goes on after it.
WAIT_LIMIT = 3600.0
# A job action answers 202 at once, or 200 once the job has ended (?wait=true).
ENDED: dict[int | str, dict[str, Any]] = {
    200: {"model": JobView, "description": "with ?wait=true: the job has ended; its state says how"},
}


def router(ctx: AdminContext) -> APIRouter:
    api = admin_router(responses=responses("Unavailable"))  # every route needs the running service

    async def start(kind: str, params: Mapping[str, Any], work: Work, wait: bool, response: Response) -> JobView:
        service = ctx.tiering()
        job = service.jobs.start(kind, params, work)
        if wait:
            await service.jobs.wait(job.id, WAIT_LIMIT)
        response.status_code = 200 if job.done else 202
        return job_view(job)

    async def known_bucket(name: str) -> None:
        try:
            await ctx.tiering().objects.bucket(name)
        except NoSuchBucket:
            raise AdminError("NoSuchBucket", f"bucket {name!r} does not exist") from None

    @api.post("/jobs/flush", tags=["jobs"], status_code=202, response_model=JobView, responses=ENDED)
    async def flush(response: Response, wait: bool = False) -> JobView:
        """Write every staged object and pending footer record to the
        capacity store now. Progress counts objects and bytes."""
        tiers = ctx.tiering().tiers

        async def work(job: Job) -> dict[str, Any]:
            await tiers.flush(job)
            return {"objects": job.items_done, "bytes": job.bytes_done}

        return await start("flush", {}, work, wait, response)

    @api.post("/jobs/compact", tags=["jobs"], status_code=202, response_model=JobView, responses=ENDED)
    async def compact(
        response: Response, request: Annotated[CompactRequest | None, Body()] = None, wait: bool = False
    ) -> JobView:
        """Delete unused segments and rewrite those whose live fraction is
        under ``threshold`` (default: the configured one)."""
        tiers = ctx.tiering().tiers
        threshold = request.threshold if request else None

        async def work(job: Job) -> dict[str, Any]:
            return asdict(await tiers.compact(threshold, job))

        return await start("compact", {"threshold": threshold}, work, wait, response)

    @api.post("/jobs/evict", tags=["jobs"], status_code=202, response_model=JobView,
              responses={**ENDED, **responses("NoSuchBucket")})
    async def evict(
        response: Response, request: Annotated[EvictRequest | None, Body()] = None, wait: bool = False
    ) -> JobView:
        """Drop cached extents from the hot tier: all of them, or those of a
        bucket and prefix. Staged writes and pinned data stay."""
        request = request or EvictRequest()
        if request.bucket is not None:
            await known_bucket(request.bucket)
        residency = ctx.tiering().tiers.residency

        async def work(job: Job) -> dict[str, Any]:
            return asdict(await residency.evict(request.bucket, request.prefix, job))

        return await start("evict", request.model_dump(), work, wait, response)

    @api.post("/jobs/pin", tags=["jobs"], status_code=202, response_model=JobView,
              responses={**ENDED, **responses("NoSuchBucket", "InvalidRequest")})
    async def pin(response: Response, request: Pin, wait: bool = False) -> JobView:
        """Pin a bucket/prefix: record it, then pull everything under it into
        the hot tier, where it is never evicted. Fails, keeping what it
        pinned, when the data does not fit."""
        await known_bucket(request.bucket)
        if ctx.tiering().mounts.get(request.bucket) is not None:
            raise AdminError("InvalidRequest", f"{request.bucket!r} is a mount: pins apply to managed buckets")
        residency = ctx.tiering().tiers.residency

        async def work(job: Job) -> dict[str, Any]:
            return asdict(await residency.pin(request.bucket, request.prefix, job))

        return await start("pin", request.model_dump(), work, wait, response)

    @api.post("/jobs/warm", tags=["jobs"], status_code=202, response_model=JobView,
              responses={**ENDED, **responses("NoSuchBucket", "InvalidRequest")})
    async def warm(response: Response, request: WarmRequest, wait: bool = False) -> JobView:
        """Bring a prefix, a key list or the keys a manifest object lists
        (literal keys; shard patterns and s3:// URLs when asked) into the hot tier, managed or
        mounted bucket. A set larger than the hot tier is warmed as far as
        it fits; the result says what was left out."""
        await known_bucket(request.bucket)
        service = ctx.tiering()
        keys = request.keys
        try:
            if request.manifest is not None:
                keys = await service.warmer.manifest(request.bucket, request.manifest)
            if keys is not None:
                keys = await pool.run(expand_all, keys, request.bucket, patterns=request.patterns, urls=request.urls)
        except NoSuchKey:
            raise AdminError("InvalidRequest", f"no manifest {request.manifest!r} in {request.bucket!r}") from None
        except InvalidArgument as exc:
            raise AdminError("InvalidRequest", exc.message) from None
        except PatternError as exc:
            raise AdminError("InvalidRequest", str(exc)) from None

        spread = _spread(ctx, request)
        peers = None if spread else _peer_client(ctx, request)

        async def work(job: Job) -> dict[str, Any]:
            if peers is not None:
                await peers.start()
            try:
                return asdict(await service.warmer.warm(
                    request.bucket, prefix=request.prefix, keys=keys, concurrency=request.concurrency,
                    bandwidth=request.bandwidth, job=job, peers=peers, peer_wait=request.peer_wait, spread=spread,
                ))
            finally:
                if peers is not None:
                    await peers.close()

        params = request.model_dump(exclude={"keys"}) | ({"keys": len(request.keys)} if request.keys else {})
        return await start("warm", params, work, wait, response)

    @api.get("/jobs", tags=["jobs"], response_model=JobList)
    async def list_jobs() -> JobList:
        """Running jobs and the most recent finished ones, newest first."""
        return JobList(jobs=[job_view(job) for job in ctx.tiering().jobs.list()])

    def find(job_id: str) -> Job:
        job = ctx.tiering().jobs.get(job_id)
        if job is None:
            raise AdminError("NoSuchJob", f"no job {job_id!r} (finished jobs are kept until 100 newer ones end)")
        return job

    @api.get("/jobs/{job_id}", tags=["jobs"], response_model=JobView, responses=responses("NoSuchJob"))
    async def get_job(job_id: str) -> JobView:
        """A job's state, progress (items, bytes), rate, ETA, errors and result."""
        return job_view(find(job_id))

    @api.post("/jobs/{job_id}/cancel", tags=["jobs"], response_model=JobView,
              responses=responses("NoSuchJob", "JobFinished"))
    async def cancel_job(job_id: str) -> JobView:
        """Stop a running job; what it already did stays done."""
        job = find(job_id)
        try:
            await ctx.tiering().jobs.cancel(job.id)
        except JobFinished as exc:
            raise AdminError("JobFinished", str(exc)) from None
        return job_view(job)

    return api


def _spread(ctx: AdminContext, request: WarmRequest) -> bool:
    """True for a cooperative warm with no node list, on a gateway in the
    node registry: its live nodes are the group, and the job, run on this
    node alone, has each extent brought in by its owner
    (``tiering/prefetch/spread.py``); a mount's warm asks the owners anyway."""
    config = ctx.config
    return (request.cooperative and request.peers is None and not config.peers and config.registry
            and ctx.tiering().peers is not None)


def _peer_client(ctx: AdminContext, request: WarmRequest) -> PeerClient | None:
    """The other gateways of a cooperative warm, asked with this gateway's
    first key pair (the nodes of one group accept the same pairs)."""
    if not request.cooperative and request.peers is None:
        return None
    config = ctx.config
    endpoints = request.peers if request.peers is not None else config.peers
    if config.node_id is None:
        raise AdminError("InvalidRequest", "a cooperative warm needs a gateway started with --node-id")
    if config.node_id not in endpoints:
        raise AdminError("InvalidRequest", f"the peers must include this gateway ({config.node_id}); "
                         f"got {sorted(endpoints) or 'none (set --peers, give peers, or start it in the node registry with --advertise-url)'}")
    for node, url in endpoints.items():
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AdminError("InvalidRequest", f"peer {node}: {url!r} is not an http(s) URL")
    if ctx.tiering().mounts.get(request.bucket) is not None:
        raise AdminError("InvalidRequest", f"{request.bucket!r} is a mount: cooperative warm applies to managed buckets")
    return peer_client(config, endpoints)
