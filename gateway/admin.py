"""The admin REST API (FastAPI), served on its own port next to the S3 port.

``GET /health`` is open so load balancers and orchestrators can probe it; every
API endpoint requires ``Authorization: Bearer <admin token>``. The OpenAPI
schema and docs pages stay open: they describe the API, they expose no data.
Errors use one JSON shape, ``{"error": {"code": ..., "message": ...}}``.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, replace
from typing import Annotated, Protocol

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.config import VERSION, Config, redacted
from tiering.errors import NoSuchBucket, TierstoreError
from tiering.objects import ObjectService


class S3Status(Protocol):
    """What the admin API needs to know about the S3 data plane."""

    @property
    def started(self) -> bool: ...

    @property
    def service(self) -> ObjectService | None: ...


class BucketPolicy(BaseModel):
    """A bucket's tiering policy (fields left out stay as they are)."""

    write_through: bool | None = None


class AdminError(Exception):
    """An admin API failure, rendered as the JSON error envelope."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _error(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = {"error": {"code": code, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


# HTTP status -> error code for the failures Starlette raises itself (404, 405).
_HTTP_CODES = {401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed"}

# RFC 6750 section 3: a 401 for a bearer-protected resource names the scheme.
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="tierstore-admin"'}

_bearer = HTTPBearer(auto_error=False, description="The admin token (TIERSTORE_ADMIN_TOKEN)")


def _token_checker(admin_token: str) -> Callable[..., Awaitable[None]]:
    expected = admin_token.encode()

    async def require_token(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> None:
        if credentials is None:
            raise AdminError(401, "Unauthorized", "missing Authorization: Bearer <admin token>")
        # Constant-time comparison: the token must not leak through timing.
        if not hmac.compare_digest(credentials.credentials.encode(), expected):
            raise AdminError(401, "Unauthorized", "invalid admin token")

    return require_token


def _install_error_handlers(app: FastAPI) -> None:
    async def on_admin_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, AdminError)
        headers = _CHALLENGE if exc.status == 401 else None
        return _error(exc.status, exc.code, exc.message, headers)

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, "Error")
        return _error(exc.status_code, code, str(exc.detail), exc.headers)

    async def on_invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _error(400, "InvalidRequest", str(exc.errors()))

    app.add_exception_handler(AdminError, on_admin_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_invalid)


def build_admin_app(config: Config, s3: S3Status) -> FastAPI:
    """The admin API for one gateway process."""
    app = FastAPI(title="tierstore admin API", version=VERSION)
    _install_error_handlers(app)

    @app.get("/health", tags=["health"])
    async def health() -> JSONResponse:
        """200 once the gateway serves S3, 503 before (start-up) and after (shutdown)."""
        if s3.started:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503)

    api = APIRouter(dependencies=[Depends(_token_checker(config.admin_token))])

    @api.get("/config", tags=["config"])
    async def get_config() -> dict[str, object]:
        """The running configuration, secrets replaced by ***."""
        return redacted(config)

    def service() -> ObjectService:
        if s3.service is None:
            raise AdminError(503, "Unavailable", "the gateway is starting or stopping")
        return s3.service

    @api.get("/tiers", tags=["tiers"])
    async def tiers() -> dict[str, object]:
        """Hot tier (budget, staged, cached, watermarks) and capacity tier
        (segments, bytes, live bytes, flush queue)."""
        return asdict(await service().tiers.status())

    @api.post("/flush", tags=["actions"])
    async def flush() -> dict[str, object]:
        """Flush every staged write to the capacity store now; answers when done."""
        try:
            await service().tiers.flush()
        except TierstoreError as exc:
            raise AdminError(503, "CapacityUnavailable", exc.message or str(exc)) from exc
        return asdict(await service().tiers.status())

    @api.post("/evict", tags=["actions"])
    async def evict() -> dict[str, object]:
        """Drop every cached extent from the hot tier (staged writes stay):
        the next reads come from the capacity store."""
        return {"evicted_bytes": await service().tiers.evict()}

    @api.post("/compact", tags=["actions"])
    async def compact(threshold: float | None = None) -> dict[str, object]:
        """Rewrite segments whose live fraction is below ``threshold``
        (default: the configured one) and delete unused ones; answers when done."""
        if threshold is not None and not 0 <= threshold <= 1:
            raise AdminError(400, "InvalidRequest", "threshold must be between 0 and 1")
        try:
            report = await service().tiers.compact(threshold)
        except TierstoreError as exc:
            raise AdminError(503, "CapacityUnavailable", exc.message or str(exc)) from exc
        return asdict(report)

    @api.get("/buckets/{name}", tags=["buckets"])
    async def get_bucket(name: str) -> dict[str, object]:
        """A bucket and its tiering policy."""
        try:
            return asdict(await service().bucket(name))
        except NoSuchBucket:
            raise AdminError(404, "NoSuchBucket", f"bucket {name!r} does not exist") from None

    @api.patch("/buckets/{name}", tags=["buckets"])
    async def patch_bucket(name: str, policy: BucketPolicy) -> dict[str, object]:
        """Change a bucket's policy, e.g. {"write_through": true}."""
        try:
            info = await service().bucket(name)
            changes = {k: v for k, v in policy.model_dump().items() if v is not None}
            return asdict(await service().set_policy(replace(info, **changes)))
        except NoSuchBucket:
            raise AdminError(404, "NoSuchBucket", f"bucket {name!r} does not exist") from None

    app.include_router(api)
    return app
