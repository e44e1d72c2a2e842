"""The admin application: auth, probes, configuration, tiers, stats, metrics;
buckets and jobs come from their own routers, the status page from
``gateway/admin/page.py``."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.admin import buckets, epochs, jobs, mounts, page, users
from gateway.admin.bodies import admin_router
from gateway.admin.context import AdminContext, NodeStatus
from gateway.admin.errors import AdminError, fix_schema, install_error_handlers, responses
from gateway.config.values import Config, redacted
from gateway.observability import metrics
from gateway.version import VERSION

READY_TIMEOUT = 2.0  # seconds the capacity store gets to answer a readiness probe

_bearer = HTTPBearer(auto_error=False, description="The admin token (TIERSTORE_ADMIN_TOKEN)")


def _token_checker(admin_token: str) -> Callable[..., Awaitable[None]]:
    expected = admin_token.encode()

    async def require_token(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> None:
        if credentials is None:
            raise AdminError("Unauthorized", "missing Authorization: Bearer <admin token>")
        # Constant-time comparison: the token must not leak through timing.
        if not hmac.compare_digest(credentials.credentials.encode(), expected):
            raise AdminError("Unauthorized", "invalid admin token")

    return require_token


def build_admin_app(config: Config, node: NodeStatus) -> FastAPI:
    """The admin API for one gateway process."""
    app = FastAPI(title="tierstore admin API", version=VERSION)
    install_error_handlers(app)
    ctx = AdminContext(config, node)

    @app.get("/health", tags=["probes"], responses={503: {"description": "starting or stopping"}})
    async def health() -> JSONResponse:
        """Liveness: 200 once the gateway serves S3, 503 before (start-up)
        and after (shutdown)."""
        if node.started:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503)

    @app.get("/ready", tags=["probes"], responses={503: {"description": "a check failed"}})
    async def ready() -> JSONResponse:
        """Readiness: the index is open and the capacity store answers
        (within 2 s). 503 names the check that failed."""
        service = node.tiering
        checks = {"index": "ok" if service is not None else "closed"}
        if service is not None:
            reachable = await service.tiers.reachable(READY_TIMEOUT)
            checks["capacity"] = "ok" if reachable else "unreachable"
        else:
            checks["capacity"] = "unknown"
        ok = all(v == "ok" for v in checks.values())
        body = {"status": "ready" if ok else "unavailable", "checks": checks}
        return JSONResponse(body, status_code=200 if ok else 503)

    api = admin_router(
        dependencies=[Depends(_token_checker(config.admin_token))],
        responses=responses("Unauthorized"),
    )

    @api.get("/config", tags=["config"])
    async def get_config() -> dict[str, object]:
        """The effective configuration, secrets replaced by ***."""
        return redacted(config)

    @api.get("/tiers", tags=["tiers"], responses=responses("Unavailable"))
    async def tiers() -> dict[str, object]:
        """Hot tier (budget, used, staged, cached, pinned, watermarks) and
        capacity tier (segments, bytes, live ratio, flush queue, requests)."""
        return asdict(await ctx.tiering().tiers.status())

    @api.get("/stats", tags=["stats"], responses=responses("Unavailable"))
    async def stats() -> dict[str, Any]:
        """Requests and bytes by S3 operation with latency percentiles,
        hot-tier hit ratio (objects and bytes), capacity-store traffic,
        memory against its budget and every cache's bytes and bound."""
        capacity = asdict(ctx.tiering().tiers.capacity.stats)  # counters: no index scan needed
        body = node.metrics.stats()
        body["capacity"] = {
            "bytes_read": capacity.pop("bytes_read"),
            "bytes_written": capacity.pop("bytes_written"),
            "requests": capacity,
        }
        body["memory"] = node.memory.stats()
        return body

    @api.get(
        "/metrics",
        tags=["stats"],
        response_class=Response,
        responses={200: {"content": {metrics.CONTENT_TYPE: {}}, "description": "Prometheus text format"}},
    )
    async def prometheus() -> Response:
        """Prometheus metrics (text exposition format)."""
        service = node.tiering
        status = asdict(await service.tiers.status()) if service is not None else None
        jobs_by_state = service.jobs.count_by_state() if service is not None else None
        body = node.metrics.render(status, jobs_by_state, node.memory.stats())  # well under a millisecond
        return Response(body, media_type=metrics.CONTENT_TYPE)

    api.include_router(buckets.router(ctx))
    api.include_router(jobs.router(ctx))
    api.include_router(mounts.router(ctx))
    api.include_router(epochs.router(ctx))
    api.include_router(users.router(ctx))
    app.include_router(api)
    app.include_router(page.router())  # no token: a shell without data (see its docstring)
    fix_schema(app)
    return app
