"""What staying a cluster costs the store: idle gateways, counted at the store.

For each ``--nodes`` count (4, 8 and 16), that many ``tierstore serve``
processes with their own ``--node-id`` and ``--advertise-url`` (no fixed
``--peers``: they find each other through the node registry) over one moto
capacity store, reached through ``delay_proxy.DelayProxy`` (no delay), which
counts every request. On their defaults otherwise; one managed bucket with a
writer (node 0 takes its lease with a PUT and flushes it) and one user.

After ``--settle`` seconds (the cluster formed, the write flushed), the
proxy's counters are zeroed and the gateways are left alone for
``--seconds``: every request counted then is what being a cluster costs.
Reported per count of nodes: store requests per node per second, for the
cluster, by operation, and by what they touch (the node registry, terms,
seals, the follow head, leases, segments, the identity document), with
LISTs by the prefix they named.

Started on 127.0.0.1 and stopped by PID at the end; temp dirs removed.

Run:  .venv/bin/python benchmarks/cluster_idle.py [--nodes 4 8 16] [--seconds 60] [--settle 30]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import time
from pathlib import Path

from _common import gateway, machine, table, temp_dir, touches  # first: puts the repo root on sys.path
from _moto import CAPACITY_BUCKET, delayed_moto, s3_capacity_args

from tests.conftest import make_client
from tests.servers import free_ports

BUCKET = "idle-data"


def kind(path: str) -> str:
    """What a request's object path (or a listing's prefix) touches."""
    return touches(path.removeprefix(f"/{CAPACITY_BUCKET}").lstrip("/"))


def cluster_cost(nodes: int, seconds: float, settle: float) -> dict:
    with temp_dir("cluster-idle") as tmp, delayed_moto(0) as moto, contextlib.ExitStack() as stack:
        gateways = []
        for i in range(nodes):
            port, admin_port = free_ports(2)
            args = (*s3_capacity_args(moto.proxy.endpoint), "--node-id", f"n{i}",
                    "--advertise-url", f"http://127.0.0.1:{port}")
            gateways.append(stack.enter_context(gateway(tmp / f"n{i}", extra_args=args, ports=(port, admin_port))))
        first = gateways[0]
        client = make_client(first.endpoint)
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="k", Body=b"idle cluster")
        first.flush()
        first.admin("POST", "/users", json={"name": "trainer", "policies": [], "key": True})
        time.sleep(settle)
        moto.proxy.reset()
        started = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - started
        snap = moto.proxy.snapshot()
        paths = dict(moto.proxy.paths)
        listed = dict(moto.proxy.listed)
        live = [len([m for m in gw.admin("GET", "/tiers").json()["cluster"]["members"] or [] if m["live"]])
                for gw in gateways]
    operations: dict[str, int] = snap["operations"]  # type: ignore[assignment]
    by_kind: collections.Counter[str] = collections.Counter()
    for (operation, path), count in paths.items():
        if operation != "ListObjects":
            by_kind[f"{operation} {kind(path)}"] += count
    for (_, prefix), count in listed.items():
        by_kind[f"ListObjects {kind('/' + prefix)}"] += count
    total = sum(operations.values())
    return {
        "nodes": nodes, "seconds": round(elapsed, 1), "requests": total,
        "per_node_per_s": total / elapsed / nodes, "cluster_per_s": total / elapsed,
        "operations": operations, "by_kind": dict(by_kind.most_common()), "live_seen": live,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--seconds", type=float, default=60.0, help="idle time counted (default 60)")
    ap.add_argument("--settle", type=float, default=30.0, help="seconds before counting (default 30)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    results = []
    for count in args.nodes:
        result = cluster_cost(count, args.seconds, args.settle)
        results.append(result)
        print(f"{count} nodes: {result['per_node_per_s']:.3f} store requests per node per second "
              f"({result['requests']} in {result['seconds']} s); live as seen by each: {result['live_seen']}",
              flush=True)
    print(machine())
    print(f"idle gateways on their defaults, one managed bucket with a writer, one user; counted for "
          f"{args.seconds:g} s after {args.settle:g} s")
    base = results[0]["per_node_per_s"]
    print(table(
        ["nodes", "requests / node / s", f"x {results[0]['nodes']} nodes", "cluster / s", "by kind (count)"],
        [[r["nodes"], f"{r['per_node_per_s']:.3f}", f"{r['per_node_per_s'] / base:.2f}x" if base else "-",
          f"{r['cluster_per_s']:.1f}", ", ".join(f"{k} {n}" for k, n in r["by_kind"].items())]
         for r in results],
    ))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
