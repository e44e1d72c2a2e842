"""The admin API's one error shape and the handlers that produce it.

Every failure, ours or FastAPI's (404, 405, a body that does not validate),
leaves as ``{"error": {"code": ..., "message": ...}}`` with a CamelCase code a
script can switch on; the table below is the one place the codes live.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.s3.http import new_request_id
from tiering.errors import InsufficientStorage, NotWriter, ServiceUnavailable, SlowDown

log = logging.getLogger("tierstore.admin")

# code -> HTTP status
CODES = {
    "InvalidRequest": 400,
    "InvalidBucketName": 400,
    "MalformedPolicy": 400,
    "Unauthorized": 401,
    "NotFound": 404,
    "NoSuchBucket": 404,
    "NoSuchKey": 404,
    "NoSuchJob": 404,
    "NoSuchPin": 404,
    "NoSuchMount": 404,
    "NoSuchEpoch": 404,
    "NoSuchUser": 404,
    "NoSuchAccessKey": 404,
    "NoSuchPolicy": 404,
    "MethodNotAllowed": 405,
    "BucketAlreadyExists": 409,
    "BucketNotEmpty": 409,
    "JobFinished": 409,
    "UserAlreadyExists": 409,
    "PolicyInUse": 409,
    # A request body larger than the admin API reads (gateway/admin/bodies.py: MAX_BODY).
    "EntityTooLarge": 413,
    # One of several gateways, and another holds the bucket's write lease (RFC 9110 421: not
    # the server to ask); the message names the one that holds it.
    "NotWriter": 421,
    "InternalError": 500,
    "SourceUnavailable": 502,
    "Unavailable": 503,
    # The node's disk has no room and nothing it can free would make some
    # (docs/operations.md#a-full-disk); while it can, Unavailable (503).
    "InsufficientStorage": 507,
}

# RFC 6750 section 3: a 401 for a bearer-protected resource names the scheme.
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="tierstore-admin"'}


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    """What every admin API error looks like."""

    error: ErrorDetail


class AdminError(Exception):
    """An admin API failure; ``code`` is a key of :data:`CODES`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = CODES[code]
        self.message = message


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    # The message may quote what a client sent (a field name, say): text UTF-8
    # cannot encode is written as \udXXX, so the answer itself never fails.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    body = {"error": {"code": code, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


class CatchAll:
    """The admin app inside Starlette's ServerErrorMiddleware: an exception
    no handler took is logged here, once, with a request id, and answered
    500 InternalError in the one shape. It is not raised further: Starlette
    would re-raise it after its own handler ran, and uvicorn would log it a
    second time ("Exception in ASGI application")."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            request_id = new_request_id()
            log.error("admin request failed: request_id=%s %s %s", request_id, scope.get("method"),
                      scope.get("path"), exc_info=exc)
            if started:
                return  # the answer is under way: the connection closes short of it
            response = error_response(500, "InternalError",
                                      f"the gateway failed to answer; see its log (request id {request_id})",
                                      {"x-request-id": request_id})
            await response(scope, receive, send)


# The statuses Starlette raises by itself, and their codes.
_HTTP_CODES = {401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed"}


def install_error_handlers(app: FastAPI) -> None:
    async def on_admin_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, AdminError)
        headers = CHALLENGE if exc.status == 401 else None
        return error_response(exc.status, exc.code, exc.message, headers)

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, "InvalidRequest")
        headers = exc.headers
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": _allowed(app, request)}
        return error_response(exc.status_code, code, str(exc.detail), headers)

    async def on_invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
            for e in exc.errors()
        )
        return error_response(400, "InvalidRequest", problems or "invalid request")

    async def on_not_writer(_: Request, exc: Exception) -> JSONResponse:
        code = "NotWriter" if isinstance(exc, NotWriter) else "Unavailable"
        if isinstance(exc, InsufficientStorage):
            code = "InsufficientStorage"
        return error_response(CODES[code], code, str(exc), {"Retry-After": "1"} if code == "Unavailable" else None)

    # Anything else: CatchAll (a handler for Exception would be Starlette's
    # ServerErrorMiddleware's, which raises the exception again after it).
    app.add_middleware(CatchAll)
    app.add_exception_handler(AdminError, on_admin_error)
    app.add_exception_handler(NotWriter, on_not_writer)
    app.add_exception_handler(ServiceUnavailable, on_not_writer)
    app.add_exception_handler(SlowDown, on_not_writer)  # a full disk, while room can be made
    app.add_exception_handler(InsufficientStorage, on_not_writer)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_invalid)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed(app: FastAPI, request: Request) -> str:
    """Every method the request's path answers to (RFC 9110, 15.5.6), where
    Starlette's 405 names only those of the first route matching the path.

    Paths in the schema go by the schema, which matches a concrete path
    before a templated one (OpenAPI, "Paths Object"): /jobs/compact is the
    compact action, POST only, though GET /jobs/{job_id} would take it too.
    Other paths (the schema's own pages) are asked of the router.
    """
    path = request.scope["path"]
    documented = app.openapi()["paths"]
    for template in sorted(documented, key=lambda t: "{" in t):
        if _fits(template, path):
            return ", ".join(sorted(method.upper() for method in documented[template]))
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in app.router.routes):
            allowed.append(method)
    return ", ".join(allowed)


def _fits(template: str, path: str) -> bool:
    """Whether ``path`` is ``template`` with each {parameter} one segment."""
    names, parts = template.split("/"), path.split("/")
    return len(names) == len(parts) and all(
        name == part or (name.startswith("{") and part != "") for name, part in zip(names, parts, strict=True)
    )


# For route decorators: the error answers a route may give, in the schema.
def responses(*codes: str) -> dict[int | str, dict[str, object]]:
    out: dict[int | str, dict[str, object]] = {}
    for code in codes:
        status = CODES[code]
        entry = out.setdefault(status, {"model": ErrorBody, "description": ""})
        entry["description"] = ", ".join(filter(None, [str(entry["description"]), code]))
    return out


def fix_schema(app: FastAPI) -> None:
    """FastAPI documents request validation failures as 422 with its own
    body; this API answers them 400 with :class:`ErrorBody`. Make the
    OpenAPI schema say what the server does."""
    generate = app.openapi

    def openapi() -> dict[str, object]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        for operations in schema["paths"].values():  # type: ignore[union-attr]
            for operation in operations.values():
                answers = operation.get("responses", {})
                if answers.pop("422", None) is not None:
                    answers.setdefault("400", {
                        "description": "InvalidRequest",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                    })
                if "requestBody" in operation:  # gateway/admin/bodies.py: MAX_BODY
                    answers.setdefault("413", {
                        "description": "EntityTooLarge",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                    })
        components = schema.get("components", {}).get("schemas", {})  # type: ignore[union-attr]
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]

