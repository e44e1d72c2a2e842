"""The status page: one HTML page, its script and its stylesheet, served on
the admin port for operators to open in a browser (docs/status-page.md).

The three files are a shell without data, so they are served without the
token: a browser's navigation cannot send an ``Authorization`` header. The
script takes the token from the URL fragment (which browsers never send to
a server, so it reaches no log) or from a form, keeps it in the tab's
``sessionStorage`` and sends it as a bearer token with every poll of the
JSON routes, which check it as for any other client.

The files are read once, when the app is built, and are not in the OpenAPI
schema: like ``/docs``, they are pages about the API, not part of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response

STATIC = Path(__file__).with_name("static")
PATH = "/status"

# route -> (file under static/, media type)
FILES = {
    PATH: ("status.html", "text/html; charset=utf-8"),
    f"{PATH}/status.js": ("status.js", "text/javascript; charset=utf-8"),
    f"{PATH}/status.css": ("status.css", "text/css; charset=utf-8"),
}

# Only this origin's own script, style and API; no inline code, no framing
# (clickjacking), no referrer. The page draws its charts as inline SVG.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate on every load: after an upgrade the page and the API agree.
    "Cache-Control": "no-cache",
}


def _file(name: str, media_type: str) -> Callable[[], Awaitable[Response]]:
    body = (STATIC / name).read_bytes()

    async def serve() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    return serve


def router() -> APIRouter:
    api = APIRouter(include_in_schema=False)
    for route, (name, media_type) in FILES.items():
        api.add_api_route(route, _file(name, media_type), methods=["GET"])
    return api
