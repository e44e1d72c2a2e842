"""Two checkouts of tierstore and the stack's ceiling side by side: hot
GETs, rounds alternating.

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

Each round also runs the same GETs against ``bare``: an ASGI app on
uvicorn that answers every request with the same ``--size`` bytes
(benchmarks/_bare_app.py), the most any app on this stack can do; each
gateway's CPU per GET is also given as a multiple of the bare app's in the
same rounds. Without ``--old``, only this checkout and the bare app run.

Run:  .venv/bin/python benchmarks/ab.py [--old ../old-checkout] [--rounds 8]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _common  # first: puts the repo root on sys.path
from _common import client, gateway, machine, process_cpu, table, temp_dir
from _compare_client import SignedClient

from tests.servers import Gateway, free_port, stop_process, wait_http

BUCKET = "ab-hot"


def fill(gw: Gateway, objects: int, size: int) -> None:
    client(gw.endpoint).create_bucket(Bucket=BUCKET)
    signed = SignedClient(gw.port)
    for i in range(objects):
        assert signed.put(BUCKET, f"k{i:06d}", os.urandom(size)) == 200
    # Flushed now, not during the rounds: a flush packs and compresses in the
    # pool's threads, which would take the GIL from the reads measured.
    assert gw.admin("POST", "/jobs/flush?wait=true").status_code == 200
    for i in range(objects):  # read once: every object is hot
        assert signed.get(BUCKET, f"k{i:06d}")[0] == 200


@dataclasses.dataclass
class Bare:
    """A server script of benchmarks/ as a subprocess (the bare app, a
    floor): what hot_round needs of a server."""

    port: int
    proc: subprocess.Popen


@contextlib.contextmanager
def served(script: Path, *args: str) -> Iterator[Bare]:
    """``script PORT *args`` on a free loopback port, once it answers ``/``;
    stopped by its PID."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(script), str(port), *args])
    try:
        wait_http(f"http://127.0.0.1:{port}/", timeout=60, proc=proc)
        yield Bare(port, proc)
    finally:
        stop_process(proc, timeout=15)


def bare_app(size: int, files: Path | None = None, batch: int = 0) -> contextlib.AbstractContextManager[Bare]:
    """The bare app answering ``size`` constant bytes, or with ``files``,
    the floor of a hot batch of ``batch`` of them (benchmarks/_bare_app.py)."""
    floor = ["--files", str(files), "--batch", str(batch)] if files is not None else []
    return served(Path(__file__).with_name("_bare_app.py"), str(size), *floor)


def hot_round(gw: Gateway | Bare, gets: int, threads: int, objects: int,
              reader: Callable[[], Any] | None = None) -> tuple[float, float]:
    """(GETs per second, gateway CPU microseconds per GET) of one round;
    each thread's reader made by ``reader`` (a ``SignedClient`` of root's
    key unless given), with ``get(bucket, key) -> (status, body)``."""
    keys = [f"k{random.randrange(objects):06d}" for _ in range(gets)]
    chunks = [keys[i::threads] for i in range(threads)]
    clients = [reader() if reader is not None else SignedClient(gw.port) for _ in range(threads)]
    for c in clients:  # connections open, signing keys derived (and decisions made) outside the timing
        assert c.get(BUCKET, keys[0])[0] == 200
    failures: list[str] = []

    def run(client: Any, mine: list[str]) -> None:
        for key in mine:
            status, _ = client.get(BUCKET, key)
            if status != 200:
                failures.append(f"{key}: {status}")

    workers = [threading.Thread(target=run, args=(c, k)) for c, k in zip(clients, chunks, strict=True)]
    pids = gw.pids()  # the writer and its read workers
    cpu, start = sum(map(process_cpu, pids)), time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall, used = time.perf_counter() - start, sum(map(process_cpu, pids)) - cpu
    assert not failures, failures[:3]
    return gets / wall, used / gets * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, help="the checkout to compare against (none: this one and bare only)")
    ap.add_argument("--new", type=Path, default=_common.ROOT, help="the checkout measured (default: this one)")
    ap.add_argument("--objects", type=int, default=200)
    ap.add_argument("--size", type=int, default=64 * 1024)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--gets", type=int, default=3000, help="GETs per round and server")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--workers", type=int, default=1, help="the gateways' --workers (1)")
    ap.add_argument("--old-workers", type=int, help="--workers of the --old gateway (default: --workers); "
                    "with --old ., one checkout's two settings side by side")
    args = ap.parse_args(argv)
    _common.begin()
    checkouts = [("new", args.new)] + ([("old", args.old)] if args.old else [])
    names = [name for name, _ in checkouts] + ["bare"]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    workers = {"new": args.workers, "old": args.old_workers or args.workers}
    with temp_dir("ab") as tmp, contextlib.ExitStack() as stack:
        servers: dict[str, Gateway | Bare] = {
            name: stack.enter_context(gateway(tmp / name, root=root.resolve(),
                                              extra_args=("--workers", str(workers[name]))))
            for name, root in checkouts
        }
        for gw in servers.values():
            fill(gw, args.objects, args.size)  # type: ignore[arg-type]
        servers["bare"] = stack.enter_context(bare_app(args.size))
        for round_ in range(args.rounds):
            order = names if round_ % 2 == 0 else names[::-1]
            for name in order:
                results[name].append(hot_round(servers[name], args.gets, args.threads, args.objects))
    median_rate = {name: statistics.median(r for r, _ in results[name]) for name in names}
    median_cpu = {name: statistics.median(c for _, c in results[name]) for name in names}
    rows = []
    for name in names:
        cpus = [c for _, c in results[name]]
        rows.append([name, f"{median_rate[name]:,.0f}", f"{median_cpu[name]:,.0f}",
                     f"{min(cpus):,.0f}-{max(cpus):,.0f}", f"{median_cpu[name] / median_cpu['bare']:.2f}x"])
    print(machine())
    print(f"hot GETs of {args.size:,}-byte objects, {args.threads} threads, {args.rounds} alternating rounds "
          f"of {args.gets:,} GETs, --workers {workers['new']} (new), {workers['old']} (old)")
    print(table(["server", "GETs/s (median)", "CPU us/GET (median)", "CPU us/GET (range)", "CPU x bare"], rows))
    if args.old:
        print(f"new / old: {median_rate['new'] / median_rate['old']:.2f}x GETs/s, "
              f"{median_cpu['new'] / median_cpu['old']:.2f}x CPU per GET")
    return 0


if __name__ == "__main__":
    sys.exit(main())
