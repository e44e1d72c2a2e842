"""Two jobs writing two buckets through two gateways: one writer, or one each.

Two gateways (`--node-id n1, n2`) over one moto S3 server behind the delay
proxy (``--latency-ms``, 20, on every store request). Two clients each write
``--objects`` objects of ``--size`` bytes into a bucket of their own,
``--threads`` PUTs at a time, in write-through buckets (a PUT is answered
once its segment is in the store: a checkpoint, say; ``--write-back``: once
staged on the node's disk). ``--rounds`` times, alternating:

- one writer: both clients write through n1, which holds both buckets'
  leases (all a single write lease for the store allowed);
- a writer per bucket: each client writes through its own node, which
  takes its bucket's lease.

Reported per run: wall time from the first PUT to the last answer, objects
per second over both clients, and how long after that the other node
listed every object of both buckets (follow lag).

Run:  .venv/bin/python benchmarks/bucket_writers.py [--objects 300] [--size 64K] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import _common  # first: puts the repo root on sys.path
from _common import client, machine, table, temp_dir, write_results
from _moto import delayed_moto, s3_capacity_args
from botocore.exceptions import ClientError
from capacity import gateway, log

from gateway.config.sizes import parse_size
from tests.servers import Gateway

MODES = ("one writer", "a writer per bucket")


def start_nodes(stack: ExitStack, tmp: Path, store: str) -> list[Gateway]:
    common = [*s3_capacity_args(store), "--lease-ttl", "10", "--follow-interval", "0.5", "--access-log", "off"]
    return [stack.enter_context(gateway(tmp / name, [*common, "--node-id", name])) for name in ("n1", "n2")]


def write_set(gw: Gateway, bucket: str, objects: int, size: int, threads: int) -> None:
    s3 = client(gw.endpoint, max_pool=threads)
    body = os.urandom(size)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=f"ckpt/{i:06d}", Body=body), range(objects)))


def listed(gw: Gateway, bucket: str) -> int:
    try:
        return client(gw.endpoint).list_objects_v2(Bucket=bucket, Prefix="ckpt/").get("KeyCount", 0)
    except ClientError:
        return -1  # the bucket's creation not followed yet


def one_run(mode: str, run: int, nodes: list[Gateway], args: argparse.Namespace, size: int) -> dict:
    buckets = [f"job{j}-{run}-{'one' if mode == MODES[0] else 'each'}" for j in (1, 2)]
    through = [nodes[0], nodes[0]] if mode == MODES[0] else nodes
    for gw, bucket in zip(through, buckets, strict=True):
        client(gw.endpoint).create_bucket(Bucket=bucket)  # takes the bucket's lease
        gw.admin("PATCH", f"/buckets/{bucket}", json={"write_through": not args.write_back})
    started = time.monotonic()
    with ThreadPoolExecutor(2) as jobs:
        list(jobs.map(lambda pair: write_set(pair[0], pair[1], args.objects, size, args.threads),
                      zip(through, buckets, strict=True)))
    wall = time.monotonic() - started
    # n2 (which wrote neither bucket, or only the second): when does it list them all?
    follower = nodes[1]
    deadline = time.monotonic() + 120
    while not all(listed(follower, b) == args.objects for b in buckets):
        if time.monotonic() > deadline:
            raise RuntimeError("the follower did not catch up")
        time.sleep(0.05)
    lag = time.monotonic() - started - wall
    writing = {gw.data_dir.name: gw.admin("GET", "/tiers").json()["cluster"]["writing"] for gw in nodes}
    return {"mode": mode, "wall_s": wall, "objects_per_s": 2 * args.objects / wall, "follow_lag_s": lag,
            "writers": {b: n for n, bs in writing.items() for b in bs if b in buckets}}


def report(runs: list[dict], args: argparse.Namespace) -> str:
    rows = [[r["mode"], f"{r['wall_s']:.2f}", f"{r['objects_per_s']:.0f}", f"{r['follow_lag_s']:.2f}",
             ", ".join(f"{b.split('-')[0]} on {n}" for b, n in sorted(r["writers"].items()))] for r in runs]
    best = {m: max(r["objects_per_s"] for r in runs if r["mode"] == m) for m in MODES}
    return "\n".join([
        "# Two buckets written through two gateways", "", machine(), "",
        f"2 clients x {args.objects} objects x {args.size}, {args.threads} PUTs at a time each, "
        f"{'write-back' if args.write_back else 'write-through'}, "
        f"store latency {args.latency_ms} ms", "",
        table(["mode", "wall s", "objects/s", "follow lag s", "writers"], rows), "",
        f"a writer per bucket / one writer: {best[MODES[1]] / best[MODES[0]]:.2f}x objects/s (best of each)",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=300, help="objects per client (300)")
    ap.add_argument("--size", default="64K", help="bytes per object (64K)")
    ap.add_argument("--threads", type=int, default=8, help="PUTs in flight per client (8)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each mode, alternating (2)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="added to every store request (20)")
    ap.add_argument("--write-back", action="store_true", help="write-back buckets: a PUT is answered once staged")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    _common.begin()
    size = parse_size(args.size)
    with temp_dir("writers") as tmp, delayed_moto(args.latency_ms) as store, ExitStack() as stack:
        nodes = start_nodes(stack, tmp, store.proxy.endpoint)
        runs = []
        for run in range(args.rounds):
            for mode in MODES:
                runs.append(one_run(mode, run, nodes, args, size))
                log(f"[writers] {mode}: {runs[-1]['wall_s']:.2f} s, {runs[-1]['objects_per_s']:.0f} objects/s")
    print(report(runs, args))
    write_results(args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
