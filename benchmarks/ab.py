"""Two checkouts of tierstore side by side: hot GETs, rounds alternating.

On a shared, noisy machine a figure from one run says little about a change;
two gateways measured in turns, round after round, share the noise. This
starts the gateway of ``--old`` (another checkout, e.g. a ``git worktree``
of the commit before a change) and of ``--new`` (this checkout by default)
on 127.0.0.1, each on the embedded capacity directory, writes the same
``--objects`` objects of ``--size`` bytes through each and reads them once
(hot), then runs ``--rounds`` rounds; in each, first one gateway then the
other (the order swaps every round) serves ``--gets`` GETs of random keys
from ``--threads`` threads, each with its own keep-alive connection and
SigV4. Per round and gateway: GETs/s and the gateway's CPU per GET (user +
system from /proc). Reported: the median of each, and new / old.

Run:  .venv/bin/python benchmarks/ab.py --old ../old-checkout [--rounds 8]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import _common  # first: puts the repo root on sys.path
from _common import client, gateway, machine, process_cpu, table, temp_dir
from _compare_client import SignedClient

from tests.servers import Gateway

BUCKET = "ab-hot"


def fill(gw: Gateway, objects: int, size: int) -> None:
    client(gw.endpoint).create_bucket(Bucket=BUCKET)
    signed = SignedClient(gw.port)
    for i in range(objects):
        assert signed.put(BUCKET, f"k{i:06d}", os.urandom(size)) == 200
    for i in range(objects):  # read once: every object is hot
        assert signed.get(BUCKET, f"k{i:06d}")[0] == 200


def hot_round(gw: Gateway, gets: int, threads: int, objects: int) -> tuple[float, float]:
    """(GETs per second, gateway CPU microseconds per GET) of one round."""
    keys = [f"k{random.randrange(objects):06d}" for _ in range(gets)]
    chunks = [keys[i::threads] for i in range(threads)]
    clients = [SignedClient(gw.port) for _ in range(threads)]
    for c in clients:  # connections open and signing keys derived outside the timing
        assert c.get(BUCKET, keys[0])[0] == 200
    failures: list[str] = []

    def run(client: SignedClient, mine: list[str]) -> None:
        for key in mine:
            status, _ = client.get(BUCKET, key)
            if status != 200:
                failures.append(f"{key}: {status}")

    workers = [threading.Thread(target=run, args=(c, k)) for c, k in zip(clients, chunks, strict=True)]
    cpu, start = process_cpu(gw.proc.pid), time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall, used = time.perf_counter() - start, process_cpu(gw.proc.pid) - cpu
    assert not failures, failures[:3]
    return gets / wall, used / gets * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="the checkout to compare against")
    ap.add_argument("--new", type=Path, default=_common.ROOT, help="the checkout measured (default: this one)")
    ap.add_argument("--objects", type=int, default=200)
    ap.add_argument("--size", type=int, default=64 * 1024)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--gets", type=int, default=3000, help="GETs per round and gateway")
    ap.add_argument("--threads", type=int, default=16)
    args = ap.parse_args(argv)
    _common.exit_cleanly_on_sigterm()
    results: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
    with temp_dir("ab") as tmp, contextlib.ExitStack() as stack:
        gws = {
            name: stack.enter_context(gateway(tmp / name, root=root.resolve()))
            for name, root in (("old", args.old), ("new", args.new))
        }
        for gw in gws.values():
            fill(gw, args.objects, args.size)
        for round_ in range(args.rounds):
            order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
            for name in order:
                results[name].append(hot_round(gws[name], args.gets, args.threads, args.objects))
    rows = []
    for name in ("old", "new"):
        rates, cpus = zip(*results[name], strict=True)
        rows.append([name, f"{statistics.median(rates):,.0f}", f"{statistics.median(cpus):,.0f}",
                     f"{min(cpus):,.0f}-{max(cpus):,.0f}"])
    rate = statistics.median(r for r, _ in results["new"]) / statistics.median(r for r, _ in results["old"])
    cpu = statistics.median(c for _, c in results["new"]) / statistics.median(c for _, c in results["old"])
    print(machine())
    print(f"hot GETs of {args.size:,}-byte objects, {args.threads} threads, {args.rounds} alternating rounds "
          f"of {args.gets:,} GETs")
    print(table(["checkout", "GETs/s (median)", "CPU us/GET (median)", "CPU us/GET (range)"], rows))
    print(f"new / old: {rate:.2f}x GETs/s, {cpu:.2f}x CPU per GET")
    return 0


if __name__ == "__main__":
    sys.exit(main())
