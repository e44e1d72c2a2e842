"""Training epochs over a small-object data set: straight from the object
store, through a managed bucket, and through a mounted bucket, side by side.

One moto S3 server is the object store. The data set (``--objects`` of
``--size`` bytes) is written twice: straight into moto under
``s3://source/set/`` (what a mount sees), and through the gateway into a
managed bucket whose capacity store is the same moto (then flushed and
evicted, so its first epoch is cold too). Each epoch GETs every object once,
in a new shuffled order, from ``--clients`` threads:

  direct     every epoch from moto itself (no gateway): the baseline
  managed    epoch 1 cold (extents fetched from moto), epoch 2 from the hot tier
  mounted    epoch 1 cold (objects read through from moto), epoch 2 from the hot tier

Reported per epoch: objects/s, MB/s, p50/p99 latency, requests the gateway
made of moto. Run:  .venv/bin/python benchmarks/epochs.py [--objects 2000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

import _common  # first: puts the repo root on sys.path
import httpx
from _common import (
    client,
    gateway,
    machine,
    moto_server,
    percentile,
    table,
    temp_dir,
    write_results,
)
from small_objects import run_phase

from tests.servers import ADMIN_TOKEN

MOTO_KEYS = ("testing", "testing")


def admin(gw, method: str, path: str, **kwargs: object) -> dict:  # type: ignore[no-untyped-def]
    response = httpx.request(method, gw.admin_url + path, timeout=600,
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, **kwargs)  # type: ignore[arg-type]
    response.raise_for_status()
    return response.json() if response.content else {}


def moto_requests(gw, bucket: str) -> int:  # type: ignore[no-untyped-def]
    """GETs and HEADs the gateway has made of moto for ``bucket``'s data."""
    if bucket == "mounted":
        stats = admin(gw, "GET", "/mounts/mounted")["source_requests"]
    else:
        stats = admin(gw, "GET", "/tiers")["capacity_requests"]
    return stats["gets"] + stats["heads"]


def epoch(clients: list, bucket: str, keys: list[str], size: int, seed: int) -> dict[str, float]:
    order = list(keys)
    random.Random(seed).shuffle(order)

    def get(s3, i: int) -> None:  # type: ignore[no-untyped-def]
        body = s3.get_object(Bucket=bucket, Key=order[i])["Body"].read()
        if len(body) != size:
            raise AssertionError(f"{order[i]}: {len(body)} bytes, expected {size}")

    phase = run_phase(clients, get, count=len(order), duration=None, pick=lambda i: i)
    lat, wall = phase["latencies"], phase["wall_s"]
    return {
        "objects_per_s": len(order) / wall,
        "mb_per_s": len(order) * size / wall / 1e6,
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=2000, help="objects in the data set (default 2000)")
    ap.add_argument("--size", type=int, default=64 * 1024, help="object size in bytes (default 65536)")
    ap.add_argument("--clients", type=int, default=16, help="concurrent reader threads (default 16)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    _common.begin()

    keys = [f"train/{i:07d}.jpg" for i in range(args.objects)]
    payload = random.Random(0).randbytes(args.size)
    results: dict[str, dict[str, object]] = {}
    with moto_server() as (moto, _), temp_dir("epochs") as tmp:
        direct = client(moto)
        direct.create_bucket(Bucket="source")
        direct.create_bucket(Bucket="capacity")
        capacity = ("--capacity", "s3://capacity/tier", "--capacity-endpoint", moto,
                    "--capacity-access-key", MOTO_KEYS[0], "--capacity-secret-key", MOTO_KEYS[1])
        with gateway(tmp / "data", extra_args=capacity) as gw:
            writer = client(gw.endpoint)
            writer.create_bucket(Bucket="managed")
            print(f"writing {args.objects} objects twice ...", file=sys.stderr, flush=True)
            for key in keys:
                direct.put_object(Bucket="source", Key=f"set/{key}", Body=payload)
                writer.put_object(Bucket="managed", Key=key, Body=payload)
            admin(gw, "POST", "/jobs/flush", params={"wait": "true"})
            admin(gw, "POST", "/jobs/evict", params={"wait": "true"})
            admin(gw, "POST", "/mounts", json={
                "name": "mounted", "source": "s3://source/set", "endpoint": moto,
                "access_key": MOTO_KEYS[0], "secret_key": MOTO_KEYS[1], "freshness": "immutable",
            })
            direct_clients = [client(moto, max_pool=2) for _ in range(args.clients)]
            gw_clients = [client(gw.endpoint, max_pool=2) for _ in range(args.clients)]
            runs = [("direct", "source", direct_clients, "set/")] * 2
            runs += [("managed", "managed", gw_clients, "")] * 2 + [("mounted", "mounted", gw_clients, "")] * 2
            seen: dict[str, int] = {}
            for n, (name, bucket, clients, prefix) in enumerate(runs):
                number = seen[name] = seen.get(name, 0) + 1
                print(f"[{name}] epoch {number} ...", file=sys.stderr, flush=True)
                before = moto_requests(gw, bucket) if name != "direct" else 0
                figures = epoch(clients, bucket, [prefix + k for k in keys], args.size, seed=n)
                if name != "direct":
                    figures["moto_requests"] = moto_requests(gw, bucket) - before
                results[f"{name} epoch {number}"] = figures

    rows = [[run, f"{r['objects_per_s']:,.0f}", f"{r['mb_per_s']:.1f}", f"{r['p50_ms']:.1f}",
             f"{r['p99_ms']:.1f}", f"{r.get('moto_requests', '-')}"] for run, r in results.items()]
    base = results["direct epoch 2"]["objects_per_s"]
    ratios = [[run, f"{r['objects_per_s'] / base:.2f}x"] for run, r in results.items() if run.startswith(("managed", "mounted"))]
    print("\n".join([
        f"### Epochs over {args.objects:,} objects of {args.size // 1024} KiB, {args.clients} readers",
        "", f"Machine: {machine()}", "",
        table(["run", "objects/s", "MB/s", "p50 ms", "p99 ms", "gateway requests to moto"], rows),
        "", "Against reading moto directly (objects/s, its second epoch):", "",
        table(["run", "ratio"], ratios), "",
    ]))
    write_results(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
