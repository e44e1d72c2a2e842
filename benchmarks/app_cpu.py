"""CPU of the S3 app alone on a hot GET: no sockets, no uvicorn, one thread.

A gateway's data plane (``gateway.node.Node``, its S3 app, metrics and the
access log in text format, written to /dev/null) is built in this process,
on the event loop the gateway runs (uvloop), over a temp data dir;
``--objects`` objects of ``--size`` bytes are written
and read once (hot). Then, in ``--rounds`` rounds, the app is called
directly with ``--gets`` GETs of random keys, each a signed ASGI scope as
uvicorn would pass it (the headers a lean SigV4 client sends), and the
thread's CPU time per GET is taken (``time.thread_time``). Only the loop's
thread works: a hot GET never leaves it, and a GET that does (a miss, a
read the page cache cannot serve at once) is counted with its pool time
(process CPU is reported too).

With ``--batch N``, each request is instead a ``POST /{bucket}?batch`` of
N random keys (docs/batch.md), its whole tar taken by ``send``, and the
CPU is given per object.

With ``--cold``, every GET is a miss instead: a mounted bucket over
``rclone serve s3`` of a directory (another process, no added latency),
each object read once, ``--concurrency`` (16) at a time, a new set of
objects each round; the process's CPU per GET then counts the store GET,
the checks, the record write and the hot-tier fill (``--fs ext4`` puts the
data dir on a new ext4, see ``_common.data_filesystem``); ``--method HEAD``
sends each object a cold HEAD instead (one HEAD to the store); ``--managed``:
the objects are written through the gateway instead, flushed into segments
in rclone (the capacity store) and evicted, so each GET is a miss of a
small extent. With ``--floor``
each round is followed by one of the floor relay (benchmarks/_floor_relay.py:
the same ranged GET with the same store client, one write, the answer, and
nothing else) over objects of its own, and the miss is also given as a
multiple of that floor.

Far steadier than measuring a server from outside on a shared machine, so
it is the measure for changes to the app's own hot path; the whole stack's
figure (with uvicorn and the kernel) is benchmarks/ab.py's.

Run:  .venv/bin/python benchmarks/app_cpu.py [--rounds 5] [--gets 5000] [--batch 64 | --cold [--fs ext4] [--floor]]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import os
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import _common  # first: puts the repo root on sys.path
from _common import ACCESS_KEY, REGION, SECRET_KEY, data_filesystem, machine, temp_dir
from _compare_peers import MOTO_KEY, RcloneStore
from _floor_relay import FloorRelay

from gateway.app import S3App
from gateway.config.values import Config
from gateway.node import Node
from gateway.serving.process import loop_factory, tune_gc, tune_malloc
from tiering.capacity import sigv4
from tiering.capacity.sigv4 import EMPTY_SHA256
from tiering.meta import Mount, now_ms
from tiering.model.inputs import Integrity, NewObject

BUCKET = "app-cpu"


def signed_scope(key: str, host: str, batch: bytes | None = None, method: str = "GET") -> dict[str, Any]:
    """The ASGI scope of a GET (or another ``method`` of the key) as a lean
    SigV4 client sends it (header auth); with ``batch`` (a JSON body), of a
    ``POST /{bucket}?batch`` instead."""
    method, path, query = (method, f"/{BUCKET}/{key}", "") if batch is None else ("POST", f"/{BUCKET}", "batch=")
    payload = EMPTY_SHA256 if batch is None else hashlib.sha256(batch).hexdigest()
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    scope = sigv4.credential_scope(amz_date[:8], REGION)
    signed = "host;x-amz-content-sha256;x-amz-date"
    headers_block = f"host:{host}\nx-amz-content-sha256:{payload}\nx-amz-date:{amz_date}\n"
    canonical = "\n".join([method, path, query, headers_block, signed, payload])
    signature = sigv4.signature(sigv4.signing_key(SECRET_KEY, amz_date[:8], REGION),
                                sigv4.string_to_sign(amz_date, scope, canonical))
    headers = [
        (b"host", host.encode()),
        (b"accept-encoding", b"identity"),
        (b"x-amz-date", amz_date.encode()),
        (b"x-amz-content-sha256", payload.encode()),
        (b"authorization", f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, "
                           f"SignedHeaders={signed}, Signature={signature}".encode()),
    ]
    if batch is not None:
        headers.append((b"content-length", str(len(batch)).encode()))
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"batch" if batch else b"", "root_path": "",
        "headers": headers, "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 9100),
    }


def context_switches() -> int:
    """The context switches of this process's threads so far (voluntary and
    not, from /proc): a miss's handoffs between threads show here."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError), open(f"/proc/self/task/{task}/status") as status:
            total += sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
    return total


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def put_random(node: Node, keys: list[str], size: int) -> None:
    """``keys`` of ``size`` random bytes written through ``node`` into BUCKET (made here)."""
    service = node.tiering.objects  # type: ignore[union-attr]
    await service.create_bucket(BUCKET)
    for key in keys:
        data = os.urandom(size)
        await service.put(BUCKET, key, _body(data), NewObject(), Integrity(expected_size=len(data)))


async def measure(args: argparse.Namespace) -> list[tuple[float, float]]:
    with temp_dir("app-cpu") as tmp:
        config = Config(data_dir=tmp / "data", credentials={ACCESS_KEY: SECRET_KEY}, region=REGION)
        node = Node(config)
        app = S3App(config, node, node.metrics, node.access_log)
        await node.start()
        try:
            keys = [f"k{i:06d}" for i in range(args.objects)]
            await put_random(node, keys, args.size)
            statuses: list[int] = []
            body = [b""]
            received: list[bool] = []
            never = asyncio.Event()

            async def receive() -> dict[str, Any]:
                if received:  # the body was read: the next message would be the client leaving
                    await never.wait()
                received.append(True)
                return {"type": "http.request", "body": body[0], "more_body": False}

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])

            for key in keys:  # read once: hot, and the records cached
                received.clear()
                await app(signed_scope(key, "127.0.0.1:9100"), receive, send)
            rounds = []
            per_request = args.batch or 1
            for _ in range(args.rounds):
                if args.batch:
                    bodies = [json.dumps({"keys": random.sample(keys, args.batch)}).encode()
                              for _ in range(args.gets)]
                    scopes = [signed_scope("", "127.0.0.1:9100", b) for b in bodies]
                else:
                    bodies = [b""] * args.gets
                    scopes = [signed_scope(random.choice(keys), "127.0.0.1:9100") for _ in range(args.gets)]
                statuses.clear()
                thread, process = time.thread_time(), time.process_time()
                for scope, body[0] in zip(scopes, bodies, strict=True):
                    received.clear()
                    await app(scope, receive, send)
                thread, process = time.thread_time() - thread, time.process_time() - process
                bad = [s for s in statuses if s != 200]
                if bad:
                    raise SystemExit(f"{len(bad)} requests answered {sorted(set(bad))}")
                objects = args.gets * per_request
                rounds.append((thread / objects * 1e6, process / objects * 1e6))
            return rounds
        finally:
            await node.stop()


async def measure_cold(args: argparse.Namespace) -> list[tuple[float, float, float]]:
    """CPU per GET of objects missed once each (see ``--cold``) and the
    process's context switches per GET; with ``--floor``, each round's
    gateway figures are followed by the floor's."""
    with temp_dir("app-cpu-cold") as tmp, contextlib.ExitStack() as stack:
        sets = args.rounds * (2 if args.floor else 1)
        keys = [[f"r{r}/k{i:06d}" for i in range(args.gets)] for r in range(sets)]
        (tmp / "store" / "src").mkdir(parents=True)
        if args.checksum == "none":
            for key in (k for round_keys in keys for k in round_keys):
                path = tmp / "store" / "src" / key
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(os.urandom(args.size))
        store = stack.enter_context(RcloneStore(tmp / "rclone", tmp / "store"))  # started by entering
        if args.checksum != "none":
            upload(store.endpoint, [k for round_keys in keys for k in round_keys], args.size, args.checksum)
        data_fs = stack.enter_context(data_filesystem(args.fs, tmp))
        config = Config(data_dir=data_fs / "data", credentials={ACCESS_KEY: SECRET_KEY}, region=REGION)
        node = Node(config)
        app = S3App(config, node, node.metrics, node.access_log)
        floor = FloorRelay(store.endpoint, "src", MOTO_KEY, MOTO_KEY, data_fs / "floor-log")
        await node.start()
        await floor.start()
        try:
            await node.tiering.mounts.mount(Mount(  # type: ignore[union-attr]
                name=BUCKET, bucket="src", prefix="", created_ms=now_ms(), endpoint=store.endpoint,
                access_key=MOTO_KEY, secret_key=MOTO_KEY, freshness=60.0))
            rounds = []
            for number, round_keys in enumerate(keys):
                scopes = [signed_scope(key, "127.0.0.1:9100", method=args.method) for key in round_keys]
                serving = floor if args.floor and number % 2 else app
                rounds.append(await cold_round(serving, scopes, args.concurrency))
            return rounds
        finally:
            await floor.close()
            await node.stop()


async def cold_round(app: Any, scopes: list[dict[str, Any]], concurrency: int) -> tuple[float, float, float]:
    """``scopes`` through ``app``, ``concurrency`` at a time: the loop
    thread's and the process's CPU per request (us), and the process's
    context switches per request. Every answer must be a 200."""
    statuses: list[int] = []
    never = asyncio.Event()
    gate = asyncio.Semaphore(concurrency)

    async def one(scope: dict[str, Any]) -> None:
        received: list[bool] = []

        async def receive() -> dict[str, Any]:
            if received:
                await never.wait()
            received.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        async with gate:
            await app(scope, receive, send)

    switches, thread, process = context_switches(), time.thread_time(), time.process_time()
    await asyncio.gather(*(one(scope) for scope in scopes))
    thread, process = time.thread_time() - thread, time.process_time() - process
    switches = context_switches() - switches
    bad = [s for s in statuses if s != 200]
    if bad or len(statuses) != len(scopes):
        raise SystemExit(f"{len(bad)} requests answered {sorted(set(bad))}")
    return thread / len(scopes) * 1e6, process / len(scopes) * 1e6, switches / len(scopes)


async def measure_managed_cold(args: argparse.Namespace) -> list[tuple[float, float, float]]:
    """CPU per GET of objects written through the gateway, flushed into
    segments in the capacity store (``rclone serve s3``) and evicted: each
    round reads a new set once, every GET a miss of a small extent."""
    with temp_dir("app-cpu-managed") as tmp, contextlib.ExitStack() as stack:
        (tmp / "store" / "capacity").mkdir(parents=True)
        store = stack.enter_context(RcloneStore(tmp / "rclone", tmp / "store"))  # started by entering
        data_fs = stack.enter_context(data_filesystem(args.fs, tmp))
        config = Config(data_dir=data_fs / "data", credentials={ACCESS_KEY: SECRET_KEY}, region=REGION,
                        capacity="s3://capacity", capacity_endpoint=store.endpoint,
                        capacity_access_key=MOTO_KEY, capacity_secret_key=MOTO_KEY)
        node = Node(config)
        app = S3App(config, node, node.metrics, node.access_log)
        await node.start()
        try:
            keys = [[f"r{r}/k{i:06d}" for i in range(args.gets)] for r in range(args.rounds)]
            await put_random(node, [k for round_keys in keys for k in round_keys], args.size)
            await node.tiering.tiers.flush()  # type: ignore[union-attr]
            await node.tiering.tiers.residency.evict(BUCKET, "")  # type: ignore[union-attr]
            return [await cold_round(app, [signed_scope(key, "127.0.0.1:9100") for key in round_keys],
                                     args.concurrency) for round_keys in keys]
        finally:
            await node.stop()


def upload(endpoint: str, keys: list[str], size: int, checksum: str) -> None:
    """PUT ``keys`` of random bytes to the store's ``src`` bucket with a
    ``checksum`` (as an SDK of 2025 uploads: boto3 sends a CRC32 unless
    told otherwise, S3 itself adds a CRC64NVME to every new object)."""
    import boto3
    from botocore.config import Config as BotoConfig

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=MOTO_KEY, aws_secret_access_key=MOTO_KEY,
                          region_name="us-east-1", config=BotoConfig(s3={"addressing_style": "path"},
                                                                    max_pool_connections=8))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: client.put_object(Bucket="src", Key=key, Body=os.urandom(size),
                                                    ChecksumAlgorithm=checksum), keys))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=200)
    ap.add_argument("--size", type=int, default=64 * 1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gets", type=int, default=5000, help="GETs (or batches) per round")
    ap.add_argument("--batch", type=int, default=0, help="keys per POST ?batch instead of GETs (0: GETs)")
    ap.add_argument("--cold", action="store_true", help="every GET a miss of a mounted object (rclone store)")
    ap.add_argument("--concurrency", type=int, default=16, help="--cold: GETs at a time (16)")
    ap.add_argument("--fs", choices=("root", "ext4"), default="root", help="--cold: the data dir's filesystem")
    ap.add_argument("--floor", action="store_true", help="--cold: alternate with the floor relay's rounds")
    ap.add_argument("--managed", action="store_true",
                    help="--cold: objects written through the gateway, flushed to rclone and evicted, not mounted")
    ap.add_argument("--checksum", choices=("none", "CRC32", "CRC32C", "CRC64NVME"), default="none",
                    help="--cold: objects PUT with this checksum (none: written as files, MD5 ETags only)")
    ap.add_argument("--method", choices=("GET", "HEAD"), default="GET",
                    help="--cold: the request each object gets (HEAD: a cold HEAD, as s3fs sends before a GET)")
    args = ap.parse_args(argv)
    _common.begin()
    tune_malloc()  # as `tierstore serve` does
    tune_gc()
    stderr = sys.stderr
    with open(os.devnull, "w") as sink:
        sys.stderr = sink  # the access log's default destination
        try:
            # The gateway's own event loop (uvloop): a miss's store GET goes
            # through its socket transport, which costs several times more
            # on asyncio's own selector loop.
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                cold = measure_managed_cold if args.managed else measure_cold
                rounds = runner.run(cold(args) if args.cold else measure(args))
        finally:
            sys.stderr = stderr
    thread = [r[0] for r in rounds]
    process = [r[1] for r in rounds]
    switches = [r[2] for r in rounds] if args.cold else []
    print(machine())
    what, unit = (f"batches of {args.batch}", "object") if args.batch else ("GETs", "GET")
    if args.cold and args.floor:
        gateway, floor = process[0::2], process[1::2]
        ratios = [g / f for g, f in zip(gateway, floor, strict=True)]
        print(f"cold GETs of mounted {args.size:,}-byte objects (rclone store, {args.concurrency} at a time, "
              f"data dir on {args.fs}), {args.rounds} rounds of {args.gets:,} each, alternating: process CPU "
              f"per miss, S3 app {statistics.median(gateway):.0f} us ({min(gateway):.0f}-{max(gateway):.0f}), "
              f"floor relay {statistics.median(floor):.0f} us ({min(floor):.0f}-{max(floor):.0f}); "
              f"app / floor {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}); context "
              f"switches per miss, app {statistics.median(switches[0::2]):.1f}, floor {statistics.median(switches[1::2]):.1f}")
        return 0
    if args.cold:
        what = "managed (flushed, evicted)" if args.managed else "mounted"
        print(f"S3 app alone, cold GETs of {what} {args.size:,}-byte objects (rclone store, {args.concurrency} "
              f"at a time, data dir on {args.fs}), {args.rounds} rounds of {args.gets:,}: process CPU "
              f"{statistics.median(process):.0f} us/GET (median; {min(process):.0f}-{max(process):.0f}), "
              f"loop thread {statistics.median(thread):.0f}; {statistics.median(switches):.1f} context switches/GET")
        return 0
    print(f"S3 app alone, hot {what} of {args.size:,}-byte objects, {args.rounds} rounds of {args.gets:,}: "
          f"loop thread CPU {statistics.median(thread):.1f} us/{unit} (median; {min(thread):.1f}-{max(thread):.1f}), "
          f"process {statistics.median(process):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
