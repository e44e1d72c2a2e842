"""Cooperative warm: one data set warmed on three gateways, each alone or together.

Three gateways (`--node-id n1..n3`) over one moto S3 server behind the delay
proxy: ``--latency-ms`` (20) on every request, and ``--store-mib-s`` (0:
unlimited) as the store's bandwidth shared by all nodes, as a capacity
store's link is when every training node pulls from it at once. n1 writes the data set
(``--objects`` of ``--size`` bytes, incompressible, in 8 MiB segments) and flushes it; n2 and
n3 follow. Then, ``--rounds`` times, alternating:

- independent: every node evicts, then all three run the same warm job at
  once, each reading the whole set from the store;
- cooperative: the same with ``peers`` naming the three nodes: each reads
  the segments it owns from the store and the rest from their owners.

Reported per run: wall time from the first job started to the last ended,
the store's GETs and bytes sent as the proxy counted them (lease and
follow traffic included), what the jobs report (store GETs and bytes, peer
extents), and whether every node ended with the whole set hot.

Run:  .venv/bin/python benchmarks/coop_warm.py [--objects 400] [--size 256K] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import _common  # first: puts the repo root on sys.path
from _common import client, machine, table, temp_dir, write_results
from _moto import delayed_moto, s3_capacity_args
from capacity import gateway, log

from gateway.config.sizes import parse_size
from tests.servers import Gateway

NODES = ("n1", "n2", "n3")


def start_nodes(stack: ExitStack, tmp: Path, store: str) -> list[Gateway]:
    common = [*s3_capacity_args(store), "--lease-ttl", "10", "--follow-interval", "0.5", "--segment-size", "8M",
              "--access-log", "off"]
    return [stack.enter_context(gateway(tmp / name, [*common, "--node-id", name])) for name in NODES]


def fill(nodes: list[Gateway], objects: int, size: int) -> None:
    s3 = client(nodes[0].endpoint, max_pool=16)
    s3.create_bucket(Bucket="data")
    for i in range(objects):
        s3.put_object(Bucket="data", Key=f"train/{i:06d}", Body=os.urandom(size))
    nodes[0].flush()
    for gw in nodes[1:]:
        reader = client(gw.endpoint)
        deadline = time.monotonic() + 300
        while reader.list_objects_v2(Bucket="data", Prefix="train/", MaxKeys=1000).get("KeyCount", 0) < min(objects, 1000):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{gw.data_dir.name} did not catch up")
            time.sleep(0.2)
        while gw.admin("GET", "/tiers").json()["cluster"]["lag_segments"]:
            time.sleep(0.2)


def warm_all(nodes: list[Gateway], body: dict) -> tuple[float, list[dict]]:
    started = time.monotonic()
    jobs = [gw.admin("POST", "/jobs/warm", json=body).json() for gw in nodes]
    results = []
    for gw, job in zip(nodes, jobs, strict=True):
        while (view := gw.admin("GET", f"/jobs/{job['id']}").json())["state"] in ("queued", "running"):
            time.sleep(0.05)
        if view["state"] != "succeeded":
            raise RuntimeError(f"warm on {gw.data_dir.name}: {view}")
        results.append(view["result"])
    return time.monotonic() - started, results


def one_run(mode: str, nodes: list[Gateway], proxy, objects: int) -> dict:
    for gw in nodes:
        gw.evict()
    body: dict = {"bucket": "data", "prefix": "train/", "concurrency": 4}
    if mode == "cooperative":
        body["peers"] = {gw.data_dir.name: gw.endpoint for gw in nodes}
    proxy.reset()
    wall, results = warm_all(nodes, body)
    counted = proxy.snapshot()
    return {
        "mode": mode,
        "wall_s": wall,
        "store_gets": counted["methods"].get("GET", 0),
        "store_bytes_sent": counted["bytes"]["down"],
        "job_store_gets": sum(r["requests"] for r in results),
        "job_store_bytes": sum(r["fetched_bytes"] for r in results),
        "peer_extents": sum(r["peer_extents"] for r in results),
        "peer_bytes": sum(r["peer_bytes"] for r in results),
        "fallbacks": sum(r["peer_fallbacks"] for r in results),
        "all_hot": all(r["hot_objects"] == objects for r in results),
    }


def report(runs: list[dict], args: argparse.Namespace, data_bytes: int) -> str:
    rows = [[r["mode"], f"{r['wall_s']:.2f}", r["store_gets"], f"{r['store_bytes_sent'] / 2**20:.1f}",
             r["job_store_gets"], f"{r['job_store_bytes'] / 2**20:.1f}", r["peer_extents"],
             f"{r['peer_bytes'] / 2**20:.1f}", r["fallbacks"], "yes" if r["all_hot"] else "NO"] for r in runs]
    head = ["mode", "wall s", "store GETs (proxy)", "store MiB sent (proxy)", "store GETs (jobs)",
            "store MiB (jobs)", "peer extents", "peer MiB", "fallbacks", "all hot on 3 nodes"]
    by_mode = {m: [r for r in runs if r["mode"] == m] for m in ("independent", "cooperative")}
    ratio = ""
    if all(by_mode.values()):
        best = {m: min(r["wall_s"] for r in rs) for m, rs in by_mode.items()}
        sent = {m: min(r["store_bytes_sent"] for r in rs) for m, rs in by_mode.items()}
        ratio = (f"cooperative / independent: wall time {best['cooperative'] / best['independent']:.2f}x, "
                 f"store bytes sent {sent['cooperative'] / sent['independent']:.2f}x (best of each)")
    return "\n".join([
        "# Cooperative warm on three gateways", "", machine(), "",
        f"{args.objects} objects x {args.size} ({data_bytes / 2**20:.0f} MiB) in 8 MiB segments, store latency "
        f"{args.latency_ms} ms, store bandwidth {args.store_mib_s or 'unlimited'} MiB/s shared by the nodes", "",
        table(head, rows), "", ratio,
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=400, help="objects in the set (400)")
    ap.add_argument("--size", default="256K", help="bytes per object (256K)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each mode, alternating (2)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="added to every store request (20)")
    ap.add_argument("--store-mib-s", type=float, default=0.0, help="store bandwidth shared by all nodes (0: unlimited)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    _common.begin()
    size = parse_size(args.size)
    with temp_dir("coop") as tmp, delayed_moto(0.0) as store, ExitStack() as stack:
        nodes = start_nodes(stack, tmp, store.proxy.endpoint)
        log(f"[coop] writing {args.objects} objects through n1")
        fill(nodes, args.objects, size)
        store.proxy.delay_s = args.latency_ms / 2000
        store.proxy.rate_down = args.store_mib_s * 2**20
        runs = []
        for _ in range(args.rounds):
            for mode in ("independent", "cooperative"):
                runs.append(one_run(mode, nodes, store.proxy, args.objects))
                log(f"[coop] {mode}: {runs[-1]['wall_s']:.2f} s, {runs[-1]['store_bytes_sent'] / 2**20:.1f} MiB")
    print(report(runs, args, args.objects * size))
    write_results(args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
