"""The stack's ceiling: an ASGI app on uvicorn (uvloop, httptools, access
log off, as the gateway runs it) that answers every request with the same
``size`` bytes and does nothing else. benchmarks/ab.py measures it beside
tierstore, so a hot GET's cost can be said as a multiple of the stack's own.

Run:  python benchmarks/_bare_app.py PORT SIZE
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn


def make_app(size: int) -> Any:
    body = b"x" * size
    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"application/octet-stream"), (b"content-length", str(size).encode())],
    }
    end = {"type": "http.response.body", "body": body}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send(start)
        await send(end)

    return app


def main() -> None:
    port, size = int(sys.argv[1]), int(sys.argv[2])
    uvicorn.run(make_app(size), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                lifespan="off", access_log=False, log_level="warning", server_header=False)


if __name__ == "__main__":
    main()
