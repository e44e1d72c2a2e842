"""The floor of a peer hit on the reading node: what asking another node
for a piece costs before the reading node does anything with it.

A process of its own reads ``keys`` (each named with its ETag, as a peer
read does) from one gateway with the gateway's own peer client (the lean
getter of ``tiering/capacity/s3_get.py``: signed ranged GETs with
``If-Match`` and ``x-tierstore-peer: fetch`` on kept-alive connections),
``readers`` at a time on the event loop the gateway runs (uvloop), and
prints, as one JSON line, its own CPU per GET from /proc: the fetch alone,
with no request taken from a client and no answer sent to one.
``benchmarks/peer_hits.py`` runs it beside the peer and local rounds.

Run (by peer_hits.py):  python _peer_fetch.py PORT BUCKET SIZE READERS < keys.json
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import uvloop
from _common import process_cpu  # first: puts the repo root on sys.path

from tests.servers import ACCESS_KEY, SECRET_KEY
from tiering.capacity.s3_get import Keys, LeanGetter


async def fetch(port: int, bucket: str, size: int, readers: int, wanted: list[tuple[str, str]]) -> dict:
    async def keys() -> Keys:
        return Keys(ACCESS_KEY, SECRET_KEY, None)

    getter = LeanGetter(f"http://127.0.0.1:{port}", "us-east-1", keys, connections=readers,
                        connect_timeout=5.0, read_timeout=30.0)
    await getter.start()

    async def reader(r: int) -> None:
        for key, etag in wanted[r::readers]:
            data = await getter.get_bytes(Bucket=bucket, Key=key, Range=f"bytes=0-{size - 1}",
                                          IfMatch=f'"{etag}"', extra={"x-tierstore-peer": "fetch"})
            if len(data) != size:
                raise RuntimeError(f"{key}: {len(data)} bytes")

    try:
        await asyncio.gather(*(reader(r) for r in range(readers)))  # connections opened, not measured
        before, start = process_cpu(os.getpid()), time.perf_counter()
        await asyncio.gather(*(reader(r) for r in range(readers)))
        cpu, wall = process_cpu(os.getpid()) - before, time.perf_counter() - start
    finally:
        await getter.close()
    return {"objects": len(wanted), "per_s": len(wanted) / wall, "cpu_us": cpu * 1e6 / len(wanted)}


def main() -> None:
    port, bucket, size, readers = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    wanted = [(key, etag) for key, etag in json.load(sys.stdin)]
    print(json.dumps(uvloop.run(fetch(port, bucket, size, readers, wanted))))


if __name__ == "__main__":
    main()
