"""The stack's ceiling: an ASGI app on uvicorn (uvloop, httptools, access
log off, as the gateway runs it) that answers every request with the same
``size`` bytes and does nothing else. benchmarks/ab.py measures it beside
tierstore, so a hot GET's cost can be said as a multiple of the stack's own.

With ``--files DIR --batch N``, the floor of a hot batch instead: every
request is answered with a tar of N files of DIR picked at random, read
the way the gateway reads a hot batch (runs of members in buffers of just
under 1 MiB, each body read from the page cache by one ``preadv`` on a
descriptor kept open) on the gateway's own listener and loop (its malloc
tuning, its head-with-body send), with every header made beforehand and
nothing else done: no request parsed, no signature, no lookup, no log.
benchmarks/batch.py measures it beside the gateway's batches: what a
Python server on this stack pays for the bytes of a batch alone.

Run:  python benchmarks/_bare_app.py PORT SIZE [--files DIR --batch N]
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path
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


def make_files_app(directory: Path, batch: int) -> Any:
    import _common  # noqa: F401  (puts the repo root on sys.path)

    from gateway.handlers.batch import RUN
    from gateway.s3 import tar
    from tiering.files import unfilled

    paths = sorted(directory.iterdir())
    members = []  # (header, descriptor, size) per file
    for path in paths:
        size = path.stat().st_size
        members.append((tar.header(path.name, size, 0), os.open(path, os.O_RDONLY), size))
    step = len(members[0][0]) + members[0][2] + -members[0][2] % tar.BLOCK  # same-sized files
    per_run = max(1, RUN // step)
    total = batch * step + len(tar.END)
    start = {"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"application/x-tar"), (b"content-length", str(total).encode())]}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        picked = random.sample(members, batch)
        await send(start)
        for first in range(0, batch, per_run):
            run = picked[first:first + per_run]
            last = first + per_run >= batch
            buffer = unfilled(len(run) * step + (len(tar.END) if last else 0))
            view = memoryview(buffer)
            at = 0
            for head, fd, size in run:
                buffer[at:at + len(head)] = head
                at += len(head)
                os.preadv(fd, (view[at:at + size],), 0)
                at += size
                buffer[at:at + -size % tar.BLOCK] = tar.END[:-size % tar.BLOCK]
                at += -size % tar.BLOCK
            buffer[at:] = tar.END[:len(buffer) - at]
            await send({"type": "http.response.body", "body": buffer, "more_body": not last})

    return app


def main() -> None:
    port, size = int(sys.argv[1]), int(sys.argv[2])
    if "--files" not in sys.argv:
        uvicorn.run(make_app(size), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                    lifespan="off", access_log=False, log_level="warning", server_header=False)
        return
    import _common  # noqa: F401

    from gateway.config.values import Config
    from gateway.serving import listener, process

    directory = Path(sys.argv[sys.argv.index("--files") + 1])
    batch = int(sys.argv[sys.argv.index("--batch") + 1])
    app = make_files_app(directory, batch)

    async def serve() -> None:
        server = listener.http_server(app, Config(), s3=True)
        async with listener.running(server, listener.listen("127.0.0.1", port, "floor"), "floor"):
            await asyncio.Event().wait()

    process.run_loop(serve())


if __name__ == "__main__":
    main()
