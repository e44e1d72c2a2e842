"""The floor of a cold miss: an ASGI app that does only what any caching
relay must do for a small object it does not hold, with the gateway's own
store client: one ranged GET of the object from the store (signed, on a
kept-alive connection of the lean getter, ``tiering/capacity/s3_get.py``),
one write of the body at the end of one open file, and the answer. No
request signature checked, no record, no MD5, no eviction order, no
metrics or access log, the write on the event loop. ``benchmarks/app_cpu.py
--cold --floor`` calls it beside the S3 app, so a miss's cost can be said as
a multiple of this floor (issue 38, item 2).

``benchmarks/_cold_floor.py`` serves a stricter one on uvicorn, for the
whole process (:class:`ServedFloor` there): the reader's signature
checked, the body's CRC too, the write by a thread of its own, the
answer with the object's headers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tiering.capacity.s3_answers import read_body
from tiering.capacity.s3_get import Keys, LeanGetter

PROBE = 1024 * 1024  # as the gateway's first ranged GET of a cold object


class FloorRelay:
    """``app(scope, receive, send)`` for ``GET /<any bucket>/<key>``: the
    store's ``bucket``/``prefix``key, written to ``path`` and answered."""

    def __init__(self, endpoint: str, bucket: str, key: str, secret: str, path: Path, prefix: str = "") -> None:
        async def keys() -> Keys:
            return Keys(key, secret, None)

        self._getter = LeanGetter(endpoint, "us-east-1", keys, connections=64,
                                  connect_timeout=5.0, read_timeout=30.0)
        self._bucket = bucket
        self._prefix = prefix
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._end = 0

    async def start(self) -> None:
        await self._getter.start()

    async def close(self) -> None:
        await self._getter.close()
        os.close(self._fd)

    async def fetch(self, key: str, checksums: bool = False) -> tuple[dict[str, Any], bytes]:
        """The store's answer (botocore's fields) for the object's first
        ``PROBE`` bytes, and its body; with ``checksums``, the object's
        checksum asked for too."""
        answer = await self._getter.get_object(Bucket=self._bucket, Key=self._prefix + key,
                                               Range=f"bytes=0-{PROBE - 1}",
                                               ChecksumMode="ENABLED" if checksums else None)
        return answer, await read_body(answer)

    def append(self, data: bytes) -> None:
        """Blocking: ``data`` at the end of the file."""
        offset, self._end = self._end, self._end + len(data)
        os.pwrite(self._fd, data, offset)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        key = scope["path"].split("/", 2)[2]
        _, data = await self.fetch(key)
        self.append(data)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})
