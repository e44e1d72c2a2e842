"""A hinted cold epoch over a cluster of gateways, against the store read
directly by the same readers.

``--nodes`` (4) gateways with ``--node-id`` and ``--peers`` naming them all,
over one moto store, each mounting one source bucket behind
``delay_proxy.DelayProxy`` (``--latency-ms``, 50, on every request, half
each way) of
``--objects`` (2,000) objects of ``--size`` (64 KiB). The epoch is a shuffled
order split among the nodes as a distributed sampler splits it, one rank a
node, ``--readers`` (8) readers in all (a node's share read by
readers/nodes lean SigV4 readers); each rank registers its share as an epoch
hint (``POST /epochs``) just before it reads, as the trainer's sampler
would. Every object has one owner, which fetches it ahead, so the store is
read once for the cluster.

The source is moto itself (``--store moto``, the default) or ``rclone serve
s3`` of a directory (``--store rclone``). moto's server closes the
connection after every answer and spends about 3 ms of CPU on each GET, so
on two cores the store alone takes most of a core at the rates a hinted
epoch reaches; rclone keeps connections alive and spends a tenth of that.
Either way the cluster's own capacity store is a moto without delay.

Reported, in one run: the store read directly by the same readers (the same
order, split the same way), then the hinted cold epoch over the cluster:
objects/s, their ratio, the store requests the proxy counted for each
(GETs and HEADs), and what each node's epoch reported (hits, late,
misses).

Run:  .venv/bin/python benchmarks/cluster_epoch.py [--quick] [--nodes 4] [--readers 8] [--latency-ms 50]
      [--store rclone]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from _common import (  # first: puts the repo root on sys.path
    data_filesystem,
    gateway,
    machine,
    run_and_report,
    table,
    temp_dir,
)
from _compare_client import SignedClient
from _compare_peers import RcloneStore
from _compare_workloads import cpu_meter
from _epoch_workload import Admin, body_of, checker, key_of
from _moto import MOTO_KEY, delayed_moto, moto_client, s3_capacity_args
from delay_proxy import DelayProxy

from tests.servers import free_ports

SOURCE = "cluster-source"
MOUNT = "data"


def read_shares(clients: list[list[SignedClient]], bucket: str, shares: list[list[str]], size: int) -> dict:
    """Each rank's share read by its own readers (reader r of a rank: its
    positions r, r + readers, ...), all ranks at once; every body checked."""
    check = checker(size)
    jobs = [(clients[n][r], share[r::len(clients[n])]) for n, share in enumerate(shares) for r in range(len(clients[n]))]

    def one(job: tuple[SignedClient, list[str]]) -> int:
        client, keys = job
        for key in keys:
            status, body = client.get(bucket, key)
            if status != 200:
                raise RuntimeError(f"GET {bucket}/{key}: {status} {body[:200]!r}")
            check(key, body)
        return len(keys)

    start = time.perf_counter()
    with ThreadPoolExecutor(len(jobs)) as pool:
        count = sum(pool.map(one, jobs))
    wall = time.perf_counter() - start
    return {"objects": count, "wall_s": wall, "objects_per_s": count / wall}


def run(args: argparse.Namespace) -> dict:
    keys = [key_of(i) for i in range(args.objects)]
    per_node = max(1, args.readers // args.nodes)
    with temp_dir("cluster-epoch") as tmp, ExitStack() as stack:
        store = stack.enter_context(delayed_moto(args.latency_ms, buckets=[SOURCE]))
        proxy, store_pid = store.proxy, store.pid
        if args.store == "moto":
            source = moto_client(store.endpoint)

            def put(i: int) -> None:
                source.put_object(Bucket=SOURCE, Key=keys[i], Body=body_of(i, args.size))
        else:  # the files first: rclone serves the directory as it finds it

            def put(i: int) -> None:
                path = tmp / "store" / SOURCE / keys[i]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(body_of(i, args.size))

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, range(len(keys))))
        if args.store == "rclone":
            rclone = stack.enter_context(RcloneStore(tmp / "rclone", tmp / "store"))
            proxy = stack.enter_context(DelayProxy(rclone.port))
            proxy.delay_s = args.latency_ms / 2000
            assert rclone.proc is not None
            store_pid = rclone.proc.pid
        data = stack.enter_context(data_filesystem(args.hot_fs, tmp))
        names = [f"n{i + 1}" for i in range(args.nodes)]
        free = iter(free_ports(2 * len(names)))
        ports = {name: (next(free), next(free)) for name in names}
        peers = ",".join(f"{name}=http://127.0.0.1:{ports[name][0]}" for name in names)
        nodes, admins = [], []
        for name in names:
            gw = stack.enter_context(gateway(data / name, ports=ports[name], extra_args=(
                *s3_capacity_args(store.endpoint), "--node-id", name, "--peers", peers, "--access-log", "off",
            )))
            admin = Admin(gw.admin_url)
            stack.callback(admin.close)
            admin("POST", "/mounts", json={"name": MOUNT, "source": f"s3://{SOURCE}",
                                           "endpoint": proxy.endpoint,
                                           "access_key": MOTO_KEY, "secret_key": MOTO_KEY})
            nodes.append(gw)
            admins.append(admin)
        order = list(keys)
        random.Random(0).shuffle(order)
        share = -(-len(order) // len(nodes))
        shares = [order[n * share:(n + 1) * share] for n in range(len(nodes))]
        results: dict = {"nodes": len(nodes), "readers": per_node * len(nodes), "objects": len(keys)}

        groups = {"gateways": lambda: [pid for gw in nodes for pid in gw.pids()],
                  args.store: lambda: [store_pid], "benchmark": lambda: [os.getpid()]}

        proxy.reset()
        direct = [[SignedClient(proxy.port) for _ in range(per_node)] for _ in nodes]
        with cpu_meter(groups, cpu := {}):
            results["direct"] = read_shares(direct, SOURCE, shares, args.size)
        results["direct"] |= {"store": dict(proxy.snapshot()["operations"]), "cpu_s": cpu}

        proxy.reset()
        ids = [admin("POST", "/epochs", json={"bucket": MOUNT, "keys": mine, "readers": per_node})["id"]
               for admin, mine in zip(admins, shares, strict=True)]
        clients = [[SignedClient(gw.port) for _ in range(per_node)] for gw in nodes]
        with cpu_meter(groups, cpu := {}):
            results["hinted"] = read_shares(clients, MOUNT, shares, args.size)
        results["hinted"] |= {"store": dict(proxy.snapshot()["operations"]), "cpu_s": cpu}
        results["hinted"]["epochs"] = []
        for admin, epoch_id in zip(admins, ids, strict=True):
            status = admin("GET", f"/epochs/{epoch_id}")
            results["hinted"]["epochs"].append({k: status[k] for k in ("hits", "late", "misses",
                                                                         "prefetched_objects")})
            admin("DELETE", f"/epochs/{epoch_id}")
        results["ratio"] = results["hinted"]["objects_per_s"] / results["direct"]["objects_per_s"]
        return results


def report(args: argparse.Namespace, results: dict) -> str:
    def reads(figures: dict) -> str:
        ops = figures["store"]
        return f"GetObject {ops.get('GetObject', 0)}, HeadObject {ops.get('HeadObject', 0)}"

    def cpu(figures: dict) -> str:
        return ", ".join(f"{name.removesuffix('_cpu_s')} {seconds:.1f}" for name, seconds in figures["cpu_s"].items())

    rows = [
        ["the store directly", f"{results['direct']['objects_per_s']:,.0f}", f"{results['direct']['wall_s']:.1f}",
         "1.00x", reads(results["direct"]), cpu(results["direct"])],
        [f"{results['nodes']} gateways, hinted cold epoch", f"{results['hinted']['objects_per_s']:,.0f}",
         f"{results['hinted']['wall_s']:.1f}", f"{results['ratio']:.2f}x", reads(results["hinted"]),
         cpu(results["hinted"])],
    ]
    lines = [
        machine(),
        f"{results['objects']:,} objects of {args.size:,} B in {args.store}, store +{args.latency_ms:g} ms, "
        f"{results['readers']} readers split over {results['nodes']} ranks, data dirs on the {args.hot_fs} "
        "filesystem",
        table(["epoch", "objects/s", "seconds", "x the store", "store requests", "CPU seconds"], rows),
        "per node (hits, late, misses, prefetched): " + "; ".join(
            f"{e['hits']}, {e['late']}, {e['misses']}, {e['prefetched_objects']}" for e in results["hinted"]["epochs"]),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64 * 1024)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--store", choices=("moto", "rclone"), default="moto",
                        help="the source's S3 server: moto (default) or rclone serve s3 of a directory")
    parser.add_argument("--hot-fs", choices=("root", "ext4"), default="root",
                        help="the gateways' data dirs on the temp dir's filesystem (root, default) or on a new "
                             "ext4 made for the run (a loop image: root only), as a node's own NVMe would be")
    parser.add_argument("--quick", action="store_true", help="800 objects")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.objects = 800
    return run_and_report(args, run, report)


if __name__ == "__main__":
    sys.exit(main())
