"""The floor of a cold miss: an ASGI app that does only what any caching
relay must do for a small object it does not hold, with the gateway's own
store client: one ranged GET of the object from the store (signed, on a
kept-alive connection of the lean getter, ``tiering/capacity/s3_get.py``),
one write of the body at the end of one open file, and the answer. No
request signature checked, no record, no MD5, no eviction order, no
metrics or access log, the write on the event loop. ``benchmarks/app_cpu.py
--cold --floor`` calls it beside the S3 app, so a miss's cost can be said as
a multiple of this floor (issue 38, item 2).
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
    store's ``bucket``/key, written to ``path`` and answered."""

    def __init__(self, endpoint: str, bucket: str, key: str, secret: str, path: Path) -> None:
        async def keys() -> Keys:
            return Keys(key, secret, None)

        self._getter = LeanGetter(endpoint, "us-east-1", keys, connections=64,
                                  connect_timeout=5.0, read_timeout=30.0)
        self._bucket = bucket
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._end = 0

    async def start(self) -> None:
        await self._getter.start()

    async def close(self) -> None:
        await self._getter.close()
        os.close(self._fd)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        key = scope["path"].split("/", 2)[2]
        answer = await self._getter.get_object(Bucket=self._bucket, Key=key, Range=f"bytes=0-{PROBE - 1}")
        data = await read_body(answer)
        offset, self._end = self._end, self._end + len(data)
        os.pwrite(self._fd, data, offset)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})
