"""Small-object PUT and GET throughput: tierstore and moto side by side.

Each target gets a fresh server on a free 127.0.0.1 port: the tierstore
gateway as a subprocess on a temp data directory, and moto's S3 server as a
subprocess too (so neither shares the benchmark's GIL). Against each, in the
same run:

  PUT phase: ``--clients`` threads, one boto3 client each, PUT objects of
             ``--size`` bytes (64 KiB) until ``--objects`` are written, or
             for ``--duration`` seconds;
  GET phase: the same threads GET every object written (in a shuffled
             order), or random ones for ``--duration`` seconds, reading each
             body to the end and checking its length.

Reported per target and phase: objects/s, MB/s, p50/p99 latency, and the CPU
the server and the client used; then the tierstore/moto ratios.

Run:  .venv/bin/python benchmarks/small_objects.py [--objects 2000] [--clients 16]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import _common  # first: puts the repo root on sys.path
from _common import (
    client,
    gateway,
    machine,
    moto_server,
    percentile,
    process_cpu,
    table,
    temp_dir,
    write_results,
)

BUCKET = "bench-small"


@contextlib.contextmanager
def target(name: str) -> Iterator[tuple[str, int]]:
    """(endpoint, server pid) of a fresh server of kind ``name``."""
    if name in ("tierstore", "tierstore-quiet"):
        # -quiet: the access log off, to weigh what one line per request costs.
        extra = ("--access-log", "off") if name == "tierstore-quiet" else ()
        with temp_dir("small") as tmp, gateway(tmp / "data", extra_args=extra) as gw:
            yield gw.endpoint, gw.proc.pid
    elif name == "moto":
        with moto_server() as (endpoint, pid):
            yield endpoint, pid
    else:
        raise ValueError(f"unknown target {name!r}")


def run_phase(
    clients: list, work: Callable[[object, int], None], *, count: int | None, duration: float | None,
    pick: Callable[[int], int],
) -> dict[str, object]:
    """Run ``work(client, i)`` from one thread per client until ``count``
    operations are done (i = 0..count-1, mapped through ``pick``) or
    ``duration`` seconds have passed. Returns latencies and wall time."""
    counter = itertools.count()
    lock = threading.Lock()
    latencies: list[list[float]] = [[] for _ in clients]
    errors: list[Exception] = []
    start = threading.Barrier(len(clients) + 1)
    deadline = [0.0]

    def worker(slot: int) -> None:
        s3, mine = clients[slot], latencies[slot]
        start.wait()
        while not errors:
            with lock:
                i = next(counter)
            if count is not None and i >= count:
                return
            if duration is not None and time.perf_counter() >= deadline[0]:
                return
            t0 = time.perf_counter()
            try:
                work(s3, pick(i))
            except Exception as exc:  # noqa: BLE001  (any failure ends the phase; raised after)
                errors.append(exc)
                return
            mine.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker, args=(slot,), daemon=True) for slot in range(len(clients))]
    for t in threads:
        t.start()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    deadline[0] = t0 + (duration or 0)
    start.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} request(s) failed; first: {errors[0]!r}") from errors[0]
    flat = [x for per in latencies for x in per]
    return {"ops": len(flat), "wall_s": wall, "latencies": flat,
            "client_cpu_s": time.process_time() - cpu0}


def bench_target(name: str, args: argparse.Namespace) -> dict[str, dict[str, object]]:
    payloads = [random.Random(seed).randbytes(args.size) for seed in range(args.clients)]
    with target(name) as (endpoint, pid):
        clients = [client(endpoint, max_pool=2) for _ in range(args.clients)]
        clients[0].create_bucket(Bucket=BUCKET)
        for slot, s3 in enumerate(clients):  # warm up: connections, endpoint resolution
            s3.put_object(Bucket=BUCKET, Key=f"warmup/{slot}", Body=b"x")
            s3.get_object(Bucket=BUCKET, Key=f"warmup/{slot}")["Body"].read()

        def key(i: int) -> str:
            return f"data/{i:08d}.bin"

        def put(s3, i: int) -> None:
            s3.put_object(Bucket=BUCKET, Key=key(i), Body=payloads[i % len(payloads)])

        def get(s3, i: int) -> None:
            body = s3.get_object(Bucket=BUCKET, Key=key(i))["Body"].read()
            if len(body) != args.size:
                raise AssertionError(f"{key(i)}: {len(body)} bytes, expected {args.size}")

        out: dict[str, dict[str, object]] = {}
        print(f"[{name}] PUT phase ...", file=sys.stderr, flush=True)
        cpu = process_cpu(pid)
        out["PUT"] = run_phase(clients, put, count=None if args.duration else args.objects,
                               duration=args.duration, pick=lambda i: i)
        out["PUT"]["server_cpu_s"] = process_cpu(pid) - cpu
        written = out["PUT"]["ops"]
        # Spot-check content, not only length: one object per payload.
        for i in range(min(written, len(payloads))):
            got = clients[0].get_object(Bucket=BUCKET, Key=key(i))["Body"].read()
            if got != payloads[i % len(payloads)]:
                raise AssertionError(f"{key(i)} came back different")

        order = list(range(written))
        random.Random(1).shuffle(order)
        rnd = random.Random(2)
        pick = (lambda i: rnd.randrange(written)) if args.duration else (lambda i: order[i])
        print(f"[{name}] GET phase ...", file=sys.stderr, flush=True)
        cpu = process_cpu(pid)
        out["GET"] = run_phase(clients, get, count=None if args.duration else written,
                               duration=args.duration, pick=pick)
        out["GET"]["server_cpu_s"] = process_cpu(pid) - cpu
        for s3 in clients:
            s3.close()
    return out


def summarise(phase: dict[str, object], size: int) -> dict[str, float]:
    lat = phase["latencies"]
    wall = phase["wall_s"]
    return {
        "ops": phase["ops"],
        "wall_s": wall,
        "ops_per_s": phase["ops"] / wall,
        "mb_per_s": phase["ops"] * size / wall / 1e6,
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "server_cores": phase["server_cpu_s"] / wall,
        "server_cpu_ms_per_op": phase["server_cpu_s"] / phase["ops"] * 1000,
        "client_cores": phase["client_cpu_s"] / wall,
    }


def report(results: dict[str, dict[str, dict[str, float]]], args: argparse.Namespace) -> str:
    mode = f"{args.duration:g} s per phase" if args.duration else f"{args.objects:,} objects"
    rows = []
    for name, phases in results.items():
        for op, s in phases.items():
            rows.append([name, op, f"{s['ops']:,}", f"{s['ops_per_s']:,.0f}", f"{s['mb_per_s']:.1f}",
                         f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}",
                         f"{s['server_cores']:.2f}", f"{s['server_cpu_ms_per_op']:.2f}",
                         f"{s['client_cores']:.2f}"])
    lines = [
        f"### Small objects: {args.size // 1024} KiB, {args.clients} concurrent clients, {mode}",
        "",
        f"Machine: {machine()}",
        "",
        table(["server", "phase", "objects", "objects/s", "MB/s", "p50 ms", "p99 ms",
               "server CPU (cores)", "server CPU ms/object", "client CPU (cores)"], rows),
        "",
    ]
    if "tierstore" in results and "moto" in results:
        ratio_rows = []
        for op in ("PUT", "GET"):
            t, m = results["tierstore"][op], results["moto"][op]
            ratio_rows.append([op, f"{t['ops_per_s'] / m['ops_per_s']:.2f}x",
                               f"{t['p50_ms'] / m['p50_ms']:.2f}x", f"{t['p99_ms'] / m['p99_ms']:.2f}x",
                               f"{t['server_cpu_ms_per_op'] / m['server_cpu_ms_per_op']:.2f}x"])
        lines += [
            ("tierstore / moto (a throughput ratio above 1, and latency or CPU ratios below 1,"
             " favour tierstore):"),
            "",
            table(["phase", "objects/s", "p50 latency", "p99 latency", "server CPU per object"],
                  ratio_rows),
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=2000, help="objects per PUT phase (default 2000)")
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds per phase instead of a fixed object count")
    ap.add_argument("--size", type=int, default=64 * 1024, help="object size in bytes (default 65536)")
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    ap.add_argument("--targets", default="tierstore,moto", help="comma-separated: tierstore, tierstore-quiet (no access log), moto")
    ap.add_argument("--json", type=Path, help="also write the summaries as JSON here")
    args = ap.parse_args(argv)
    _common.begin()

    results: dict[str, dict[str, dict[str, float]]] = {}
    for name in args.targets.split(","):
        raw = bench_target(name.strip(), args)
        results[name.strip()] = {op: summarise(phase, args.size) for op, phase in raw.items()}
    print(report(results, args))
    write_results(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
