"""The floor of a cold miss, served: what a Python gateway on this stack
cannot do without for a small object it does not have, measured as a
whole process.

``FloorRelay`` (benchmarks/_floor_relay.py) on uvicorn (uvloop, httptools,
access log off, as the gateway runs it), made as strict as the gateway's
miss where any gateway must be: for every ``GET /<bucket>/<key>`` it
verifies the request's SigV4 (the gateway's own code, root's key),
fetches ``<key>`` under ``PREFIX`` of the store's ``BUCKET`` with one
signed ranged GET over the gateway's lean getter (its connections, its
signing), checks the body against the CRC32C or CRC32 the store sends,
hands the bytes to a writer thread that appends them to one file, and
answers with them and the store's ETag, date and type. Nothing else: no
index, no record of the object, no hot tier's bookkeeping, no single
flight, no access log, no metrics, no policy.
benchmarks/mounted_epoch.py (``--floor``) reads a cold epoch through it
beside the gateway's, so a miss's CPU can be said against the least any
gateway written this way spends on it, on this machine, in the same run.

Run:  python benchmarks/_cold_floor.py PORT STORE_ENDPOINT BUCKET PREFIX FILE
"""

from __future__ import annotations

import base64
import contextlib
import queue
import sys
import threading
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvicorn
from _common import ACCESS_KEY, SECRET_KEY
from _floor_relay import FloorRelay
from _moto import MOTO_KEY
from ab import Bare, served
from awscrt.checksums import crc32c

from gateway.auth import sigv4

_CHECKS = (("ChecksumCRC32C", crc32c), ("ChecksumCRC32", zlib.crc32))


class ServedFloor(FloorRelay):
    """The relay with the reader's signature and the body's CRC checked,
    its appends by a thread of their own, its answer with the object's
    headers."""

    def __init__(self, store: str, bucket: str, prefix: str, path: Path) -> None:
        super().__init__(store, bucket, MOTO_KEY, MOTO_KEY, path, prefix=f"{prefix}/")
        self._secrets = {ACCESS_KEY: SECRET_KEY}
        self._writes: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._started = False
        threading.Thread(target=self._write, name="floor-writer", daemon=True).start()

    def _write(self) -> None:
        """What the loop queued, appended, all that waits at once together."""
        while True:
            batch = [self._writes.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self._writes.get_nowait())
            for data in batch:
                self.append(data)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if not self._started:
            await self.start()
            self._started = True
        raw_path = scope["raw_path"].decode("latin-1")
        if raw_path.count("/") < 2:  # no key: the start-up check's request
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        sigv4.authenticate(scope["method"], raw_path, scope["query_string"].decode("latin-1"), headers,
                           self._secrets.get, datetime.now(UTC))
        key = raw_path.split("/", 2)[2]
        answer, data = await self.fetch(key, checksums=True)
        for field, crc in _CHECKS:
            sent = answer.get(field)
            if sent is not None and base64.b64encode(crc(data).to_bytes(4, "big")).decode() != sent:
                raise RuntimeError(f"{key}: the body fails its {field[8:]}")
        self._writes.put(data)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-length", str(len(data)).encode()), (b"etag", answer["ETag"].encode()),
            (b"last-modified", answer["LastModified"].strftime("%a, %d %b %Y %H:%M:%S GMT").encode()),
            (b"content-type", answer.get("ContentType", "binary/octet-stream").encode()),
            (b"accept-ranges", b"bytes"), (b"server", b"floor")]})
        await send({"type": "http.response.body", "body": data})


@contextlib.contextmanager
def cold_floor(store: str, bucket: str, prefix: str, directory: Path) -> Iterator[Bare]:
    """This floor as a process (``ab.served``), reading ``prefix`` of the
    store's ``bucket`` at ``store``, its bytes appended under
    ``directory``; once stopped, its file removed (with its page-cache
    pages, which later epochs would find taken)."""
    directory.mkdir(parents=True, exist_ok=True)
    appended = directory / "appended"
    try:
        with served(Path(__file__), store, bucket, prefix, str(appended)) as floor:
            yield floor
    finally:
        appended.unlink(missing_ok=True)


def main() -> None:
    port, store, bucket, prefix, path = sys.argv[1:6]
    uvicorn.run(ServedFloor(store, bucket, prefix, Path(path)), host="127.0.0.1", port=int(port), loop="uvloop",
                http="httptools", lifespan="off", access_log=False, log_level="warning", server_header=False)


if __name__ == "__main__":
    main()
