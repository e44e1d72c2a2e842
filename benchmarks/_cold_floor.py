"""The floor of a cold miss: what a Python gateway on this stack cannot do
without for a small object it does not have.

An ASGI app on uvicorn (uvloop, httptools, access log off, as the gateway
runs it) that, for every ``GET /<bucket>/<key>``: verifies the request's
SigV4 (the gateway's own code, root's key), fetches ``<key>`` under
``PREFIX`` of the store's ``BUCKET`` with one signed ranged GET over the
gateway's lean getter (its connections, its signing), checks the body's
CRC32C or CRC32 when the store sends one, hands the bytes to a writer thread that
appends them to one file, and answers with them and the store's ETag,
date and type. Nothing else: no index, no record of the object, no hot
tier's bookkeeping, no single flight, no access log, no metrics, no
policy. benchmarks/mounted_epoch.py (``--floor``) reads a cold epoch
through it beside the gateway's, so a miss's CPU can be said against the
least any gateway written this way spends on it, on this machine, in the
same run.

Run:  python benchmarks/_cold_floor.py PORT STORE_ENDPOINT BUCKET PREFIX FILE
"""

from __future__ import annotations

import base64
import contextlib
import os
import queue
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import _common  # noqa: F401  (puts the repo root on sys.path)
import uvicorn
from _common import free_port, stop_process, wait_http
from _moto import MOTO_KEY
from awscrt.checksums import crc32c

from gateway.auth import sigv4
from tests.servers import ACCESS_KEY, SECRET_KEY
from tiering.capacity.s3_get import Keys, LeanGetter

PIECE = 8 * 1024 * 1024  # the gateway's first ranged GET of a cold object asks for up to a piece


def writer(path: str) -> queue.SimpleQueue[bytes]:
    """A thread appending what it is given to ``path``, all queued at once together."""
    pending: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def run() -> None:
        offset = 0
        while True:
            batch = [pending.get()]
            with_more = True
            while with_more:
                try:
                    batch.append(pending.get_nowait())
                except queue.Empty:
                    with_more = False
            for data in batch:
                offset += os.pwrite(fd, data, offset)

    threading.Thread(target=run, name="floor-writer", daemon=True).start()
    return pending


def make_app(store: str, bucket: str, prefix: str, path: str) -> Any:
    writes = writer(path)
    secrets = {ACCESS_KEY: SECRET_KEY}

    async def keys() -> Keys:
        return Keys(MOTO_KEY, MOTO_KEY, None)

    getter = LeanGetter(store, "us-east-1", keys, connections=64, connect_timeout=5, read_timeout=60)
    started = False

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal started
        if scope["type"] != "http":
            return
        if not started:
            await getter.start()
            started = True
        raw_path = scope["raw_path"].decode("latin-1")
        if raw_path.count("/") < 2:  # no key: the start-up check's request
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        sigv4.authenticate(scope["method"], raw_path, scope["query_string"].decode("latin-1"), headers,
                           secrets.get, datetime.now(UTC))
        key = raw_path.split("/", 2)[2]
        answer = await getter.get_object(Bucket=bucket, Key=f"{prefix}/{key}", Range=f"bytes=0-{PIECE - 1}",
                                         ChecksumMode="ENABLED")
        data = await answer["Body"].read()
        for field, crc in (("ChecksumCRC32C", crc32c), ("ChecksumCRC32", zlib.crc32)):
            sent = answer.get(field)
            if sent is not None and base64.b64encode(crc(data).to_bytes(4, "big")).decode() != sent:
                raise RuntimeError(f"{key}: the body fails its {field[8:]}")
        writes.put(data)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-length", str(len(data)).encode()), (b"etag", answer["ETag"].encode()),
            (b"last-modified", answer["LastModified"].strftime("%a, %d %b %Y %H:%M:%S GMT").encode()),
            (b"content-type", answer.get("ContentType", "binary/octet-stream").encode()),
            (b"accept-ranges", b"bytes"), (b"server", b"floor")]})
        await send({"type": "http.response.body", "body": data})

    return app


@contextlib.contextmanager
def cold_floor(store: str, bucket: str, prefix: str, directory: Path) -> Iterator[Floor]:
    """This floor as a process on a free loopback port, reading ``prefix``
    of the store's ``bucket`` at ``store``, its bytes appended under
    ``directory``; stopped by its PID, its file then removed (with its
    page-cache pages, which later epochs would find taken)."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    appended = directory / "appended"
    proc = subprocess.Popen([sys.executable, __file__, str(port), store, bucket, prefix, str(appended)])
    try:
        wait_http(f"http://127.0.0.1:{port}/", timeout=60, proc=proc)
        yield Floor(port, proc)
    finally:
        stop_process(proc, timeout=15)
        appended.unlink(missing_ok=True)


class Floor(NamedTuple):
    port: int
    proc: subprocess.Popen[bytes]


def main() -> None:
    port, store, bucket, prefix, path = sys.argv[1:6]
    uvicorn.run(make_app(store, bucket, prefix, path), host="127.0.0.1", port=int(port), loop="uvloop",
                http="httptools", lifespan="off", access_log=False, log_level="warning", server_header=False)


if __name__ == "__main__":
    main()
