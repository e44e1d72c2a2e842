"""What a peer hit costs the reading node, against a local hot hit.

Two gateways (``--node-id`` a and b, ``--peers`` naming both) over one moto
store, both mounting one source bucket of ``--objects`` (2,000) objects of
``--size`` (64 KiB). Every object has one owner (rendezvous hashing of the
mount and key); the set is read once through node a, so each object is hot
on its owner and nowhere else. Then, in ``--rounds`` (4) rounds that
alternate the order of the two:

- local: node a GETs the objects it owns (a hot hit);
- peer: node a GETs the objects b owns (a asks b, keeps no copy);

each with ``--readers`` (8) lean SigV4 readers, one keep-alive connection
each; and the floor of a peer hit (``_peer_fetch.py``): a process of its own
asks node b for the same objects with the gateway's peer client, as node a
does, and nothing else. (local + floor) / local is what a peer hit would cost
if node a spent nothing on it beyond asking. Reported: GETs/s and CPU per GET of node a (its process and any read
workers, from /proc) and of node b, per round and as medians, and the ratio
peer/local of node a's CPU per GET in each round. With ``--batch N`` (64),
also ``POST ?batch`` requests of N keys, all owned by b, sent to a: node a's
CPU per object of a batch.

The machine is shared and noisy: compare the ratios of one run.

Run:  .venv/bin/python benchmarks/peer_hits.py [--quick] [--objects 2000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from _common import (  # first: puts the repo root on sys.path
    gateway,
    machine,
    process_cpu,
    run_and_report,
    table,
    temp_dir,
)
from _compare_client import SignedClient
from _moto import delayed_moto, moto_client, s3_capacity_args

from gateway.config.sizes import parse_size
from tests.servers import Gateway, free_ports
from tiering.cluster.peers import owner

SOURCE = "peer-source"
MOUNT = "data"
NODES = ("a", "b")


def cpu(gw: Gateway) -> float:
    total = 0.0
    for pid in gw.pids():
        try:
            total += process_cpu(pid)
        except OSError:
            pass
    return total


def measured(nodes: Sequence[Gateway], work: Callable[[], int]) -> dict:
    """``work()`` (it returns how many objects it read) with each node's CPU."""
    before = [cpu(gw) for gw in nodes]
    start = time.perf_counter()
    count = work()
    wall = time.perf_counter() - start
    after = [cpu(gw) for gw in nodes]
    out = {"objects": count, "per_s": count / wall}
    for gw, b, a in zip(nodes, before, after, strict=True):
        out[f"{gw.data_dir.name}_cpu_us"] = (a - b) * 1e6 / count
    return out


def read_all(port: int, keys: list[str], readers: int, size: int) -> int:
    clients = [SignedClient(port) for _ in range(readers)]

    def one(r: int) -> int:
        for key in keys[r::readers]:
            status, body = clients[r].get(MOUNT, key)
            if status != 200 or len(body) != size:
                raise RuntimeError(f"GET {key}: {status}, {len(body)} bytes")
        return len(keys[r::readers])

    with ThreadPoolExecutor(readers) as pool:
        return sum(pool.map(one, range(readers)))


def batches(port: int, keys: list[str], per: int, readers: int) -> int:
    clients = [SignedClient(port) for _ in range(readers)]
    groups = [keys[i:i + per] for i in range(0, len(keys), per)]

    def one(r: int) -> int:
        n = 0
        for group in groups[r::readers]:
            status, body = clients[r].post(MOUNT, "batch", json.dumps({"keys": group}).encode())
            if status != 200 or not body:
                raise RuntimeError(f"batch: {status} {body[:200]!r}")
            n += len(group)
        return n

    with ThreadPoolExecutor(readers) as pool:
        return sum(pool.map(one, range(readers)))


def peer_fetch(port: int, wanted: list[tuple[str, str]], size: int, readers: int) -> dict:
    """``_peer_fetch.py``'s figures: its CPU per GET of ``wanted`` from the node at ``port``."""
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("_peer_fetch.py")), str(port), MOUNT,
                           str(size), str(readers)], input=json.dumps(wanted), capture_output=True, text=True,
                          check=True, timeout=600)
    return json.loads(done.stdout)


def run(args: argparse.Namespace) -> dict:
    size = parse_size(args.size)
    keys = [f"train/{i:06d}.bin" for i in range(args.objects)]
    with temp_dir("peer-hits") as tmp, ExitStack() as stack:
        store = stack.enter_context(delayed_moto(0, buckets=[SOURCE]))
        source = moto_client(store.endpoint)
        etags = {key: source.put_object(Bucket=SOURCE, Key=key, Body=os.urandom(size))["ETag"].strip('"')
                 for key in keys}
        free = iter(free_ports(2 * len(NODES)))
        ports = {name: (next(free), next(free)) for name in NODES}
        peers = ",".join(f"{name}=http://127.0.0.1:{ports[name][0]}" for name in NODES)
        nodes = []
        for name in NODES:
            gw = stack.enter_context(gateway(tmp / name, ports=ports[name], extra_args=(
                *s3_capacity_args(store.endpoint), "--node-id", name, "--peers", peers, "--access-log", "off",
            )))
            answer = gw.admin("POST", "/mounts", json={
                "name": MOUNT, "source": f"s3://{SOURCE}", "endpoint": store.endpoint,
                "access_key": "testing", "secret_key": "testing"})
            if answer.status_code != 201:
                raise RuntimeError(answer.text)
            nodes.append(gw)
        a = nodes[0]
        mine = [k for k in keys if owner(f"{MOUNT}\0{k}", list(NODES)) == "a"]
        theirs = [k for k in keys if k not in set(mine)]
        read_all(a.port, keys, args.readers, size)  # each object hot on its owner
        rounds = []
        for r in range(args.rounds):
            order = [("local", mine), ("peer", theirs)]
            if r % 2:
                order.reverse()
            figures = {name: measured(nodes, lambda ks=ks: read_all(a.port, ks, args.readers, size))
                       for name, ks in order}
            figures["floor"] = peer_fetch(nodes[1].port, [(k, etags[k]) for k in theirs], size, args.readers)
            if args.batch:
                figures["batch"] = measured(nodes, lambda: batches(a.port, theirs, args.batch, args.readers))
            figures["ratio"] = figures["peer"]["a_cpu_us"] / figures["local"]["a_cpu_us"]
            figures["floor_ratio"] = (figures["local"]["a_cpu_us"] + figures["floor"]["cpu_us"]) \
                / figures["local"]["a_cpu_us"]
            rounds.append(figures)
        return {"size": size, "local_objects": len(mine), "peer_objects": len(theirs), "rounds": rounds}


def report(args: argparse.Namespace, results: dict) -> str:
    rows = []
    kinds = ["local", "peer", *(["batch"] if args.batch else [])]
    for n, figures in enumerate(results["rounds"]):
        for kind in kinds:
            f = figures[kind]
            rows.append([n, kind, f"{f['per_s']:.0f}", f"{f['a_cpu_us']:.0f}", f"{f['b_cpu_us']:.0f}",
                         f"{figures['ratio']:.2f}" if kind == "peer" else ""])
        floor = figures["floor"]
        rows.append([n, "floor (a process asking b)", f"{floor['per_s']:.0f}", f"{floor['cpu_us']:.0f}", "",
                     f"{figures['floor_ratio']:.2f}"])
    med = {kind: statistics.median(r[kind]["a_cpu_us"] for r in results["rounds"]) for kind in kinds}
    lines = [
        machine(),
        f"{results['local_objects']} objects owned by a, {results['peer_objects']} by b, {results['size']:,} B each",
        table(["round", "read", "objects/s", "a µs CPU/object", "b µs CPU/object", "x local (a)"], rows),
        "medians, node a: " + ", ".join(f"{kind} {v:.0f} µs" for kind, v in med.items())
        + f"; peer/local {statistics.median(r['ratio'] for r in results['rounds']):.2f}x"
        + f"; floor {statistics.median(r['floor']['cpu_us'] for r in results['rounds']):.0f} µs, (local + floor)/local "
        + f"{statistics.median(r['floor_ratio'] for r in results['rounds']):.2f}x",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--size", default="64K")
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64, help="keys per batch request (0: none)")
    parser.add_argument("--quick", action="store_true", help="400 objects, 2 rounds")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.objects, args.rounds = 400, 2
    return run_and_report(args, run, report)


if __name__ == "__main__":
    sys.exit(main())
