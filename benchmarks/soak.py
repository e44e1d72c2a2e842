"""A soak run: mixed S3 load held for minutes, zero errors, flat memory.

moto's S3 server (with ``capacity.py``'s ranged-GET patch) is the capacity
store; the gateway runs as a subprocess with a hot tier smaller than the data
set (``--hot-size`` 256 MiB against ``--dataset-size`` 600 MiB), so objects
are flushed, evicted and fetched back all along. ``--threads`` (32) threads,
one boto3 client each, first write the data set, then for ``--seconds``
(300) pick operations at random:

  get / get_large  whole object, MD5 of the body checked (a deleted key: 404)
  get_range        a random byte range, compared byte for byte
  head             size and ETag checked (a deleted key: 404)
  put / overwrite  4 KiB..1 MiB (log-uniform), new key or an existing one
  put_large        16..64 MiB through boto3's transfer manager (multipart)
  delete           a key that exists
  list             the thread's own prefix: keys, sizes and ETags checked

With ``--hostile`` the mix is the one a gateway shared by many clients
sees, some of them broken or hostile: each thread also sends

  batch            GetBatch (POST /soak?batch) of 2..16 of its keys, each member checked
  copy             CopyObject of one of its keys onto another
  abort_upload     a multipart upload of a new key, one part, then aborted

and ``--hostile-threads`` (2) more threads (``_soak_hostile.py``) send
``--hostile-rate`` (10) requests/s each: bodies that stall or are cut off,
heads that never end, bytes that are not HTTP, requests signed by unknown
keys, anonymous ones, operations S3 does not have, each naming a new
bucket, key or parameter; and an operator flushes and evicts the whole
cache every ``--operator-every`` (10) seconds. ``--rate`` caps the
threads' requests per second in all (0: as fast as they go).

Each thread owns its keys (``t007/...``), so it knows what every read must
return; a mismatch counts as an error like a failed request, and a single
error fails the run (exit status 1). Clients do not retry (one attempt).

Every second the gateway's VmRSS, RssAnon (``/proc/<pid>/status``), threads and open
descriptors are sampled, every two seconds its capacity-store request
counters (admin ``/stats``). Reported: operations by kind with p50/p99
latency, throughput, capacity requests, RSS at 25/50/75/100% of the timed
run, VmHWM, and the slope of RSS over the second half of the run (least
squares, MiB/min) twice: of every sample, and of the floor (the lowest
sample of each 10 s), which is what is judged: memory is "flat" when the
floor's slope is below ``--max-rss-slope`` (10 MiB/min, see ``MAX_RSS_SLOPE``),
otherwise the run fails too. After the run one listing of the whole bucket
is checked against every thread's keys, the gateway is stopped and its data
directory checked with ``tiering.maintenance.fsck``, and its log is read: an error or a
traceback there fails the run as well (``--keep-log`` keeps a copy).

This module starts the servers and runs the phases (fill, timed run, final
checks); the workload and its checks are in ``_soak_workload.py``, the
sampling, figures, verdict and report in ``_soak_measure.py``.

Run:  .venv/bin/python benchmarks/soak.py [--quick] [--seconds 300] [--threads 32]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import _common  # first: puts the repo root on sys.path
from _common import client, gateway, process_cpu, temp_dir
from _moto import moto_store, s3_capacity_args
from _soak_hostile import Hostile, Operator
from _soak_measure import (
    MAX_RSS_SLOPE,
    Sampler,
    capacity_counters,
    log_problems,
    memory_probe,
    proc_status,
    report,
    summarise,
)
from _soak_workload import BUCKET, TRANSFER, Plan, Pool, Worker, final_listing, merge
from capacity import KiB, MiB, admin, log, parse_size

from gateway.client.batch import BatchClient
from tests.servers import ACCESS_KEY, SECRET_KEY, Gateway
from tiering.maintenance import fsck

# -- the run --------------------------------------------------------------------


def in_threads(workers: list[Worker], target: Callable[[Worker], None]) -> float:
    threads = [threading.Thread(target=target, args=(w,), daemon=True) for w in workers]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def tiers_view(gw: Gateway) -> dict:
    keep = ("hot_budget", "hot_used", "hot_staged", "hot_cached", "evicted", "cache_hits",
            "cache_misses", "segments", "capacity_bytes", "live_ratio", "flush_queue",
            "segments_written", "last_flush_error")
    tiers = admin(gw, "GET", "/tiers")
    return {k: tiers[k] for k in keep}


def memory_view(gw: Gateway) -> dict:
    """The gateway's memory against its budget, the buffers admitted by
    their bytes, and its caches (``GET /stats``)."""
    memory = admin(gw, "GET", "/stats")["memory"]
    return {k: memory[k] for k in ("rss", "peak_rss", "limit", "squeeze", "refusing", "sheds", "trims",
                                   "refused")} | {
        "buffers": memory.get("buffers"),
        "caches": {name: {k: row[k] for k in ("bytes", "entries", "bound")}
                   for name, row in memory["caches"].items()}}


def run(args: argparse.Namespace) -> dict:
    plan = Plan.of(args)
    pool = Pool(2 * max(args.large_max, args.small_max), args.seed)
    stop = threading.Event()
    out: dict = {"plan": vars(plan)}
    with moto_store() as (moto_port, _), temp_dir("soak") as tmp:
        extra = (*s3_capacity_args(f"http://127.0.0.1:{moto_port}"),
                 "--hot-size", str(args.hot_size))
        os.environ.update(args.gateway_env)  # the gateway's environment is this one's
        if args.tracemalloc:
            args.tracemalloc.mkdir(parents=True, exist_ok=True)
            hook = Path(__file__).resolve().parent / "tracemalloc_hook"
            os.environ.update(TIERSTORE_TRACEMALLOC_DIR=str(args.tracemalloc.resolve()),
                              PYTHONPATH=os.pathsep.join(
                                  filter(None, (str(hook), os.environ.get("PYTHONPATH")))))
        with gateway(tmp / "data", extra_args=extra) as gw:
            workers = [Worker(slot, client(gw.endpoint, max_pool=TRANSFER.max_concurrency,
                                           retries=args.client_retries),
                              plan, pool, args.seed, hostile=args.hostile,
                              rate=args.rate / args.threads,
                              batch=BatchClient(gw.endpoint, ACCESS_KEY, SECRET_KEY),
                              retries=args.client_retries)
                       for slot in range(args.threads)]
            out |= fill_run(gw, workers, plan, stop)
            fill_errors = sum(w.tally.errors.total() for w in workers)
            log(f"[fill] {out['fill_bytes'] / MiB:.0f} MiB in {out['fill_s']:.1f} s; "
                f"timed run of {args.seconds:g} s ...")
            out |= timed_run(gw, workers, args, stop)
            out["final_listing"] = final_listing(workers)
        out["fsck_problems"] = fsck.check(tmp / "data")
        out["gateway_log"] = log_problems(gw.log_path)
        if args.keep_log:
            shutil.copy(gw.log_path, args.keep_log)
    out |= merge([w.tally for w in workers], fill_errors)
    return out


def fill_run(gw: Gateway, workers: list[Worker], plan: Plan, stop: threading.Event) -> dict:
    """Every key written once; the gateway's memory and tiers before and after."""
    workers[0].s3.create_bucket(Bucket=BUCKET)
    rss_start = proc_status(gw.proc.pid)["VmRSS"]
    log(f"[fill] {plan.threads} threads x {plan.small_keys} objects of "
        f"{plan.small[0] // KiB} KiB..{plan.small[1] // KiB} KiB, and {plan.large_keys} "
        f"of {plan.large[0] // MiB}..{plan.large[1] // MiB} MiB ...")
    wall = in_threads(workers, lambda w: w.fill(stop))
    written = sum(w.tally.bytes_up for w in workers)
    for w in workers:  # the timed run counts its own bytes
        w.tally.bytes_up = w.tally.bytes_down = 0
    return {"rss_start_kib": rss_start, "fill_s": wall, "fill_bytes": written,
            "after_fill": proc_status(gw.proc.pid) | {"tiers": tiers_view(gw)}}


def timed_run(gw: Gateway, workers: list[Worker], args: argparse.Namespace,
              stop: threading.Event) -> dict:
    """The workers' loops for ``--seconds`` (with the hostile clients and the
    operator when asked), sampled; the figures of the gateway over that time."""
    seconds, pid = args.seconds, gw.proc.pid
    quiet = threading.Event()  # ends the hostile clients and the operator
    others: list[Hostile | Operator] = []
    if args.hostile:
        others = [Hostile(gw, BUCKET, args.seed * 100 + i, args.hostile_rate, quiet)
                  for i in range(args.hostile_threads)]
        if args.operator_every > 0:
            others.append(Operator(gw, args.operator_every, quiet))
    capacity0, cpu0 = capacity_counters(gw), process_cpu(pid)
    t0 = time.perf_counter()
    samplers = [Sampler(memory_probe(gw, workers), 1.0, t0, stop),
                Sampler(lambda: capacity_counters(gw), 2.0, t0, stop)]
    for thread in (*samplers, *others):
        thread.start()
    wall = in_threads(workers, lambda w: w.run(t0 + seconds, stop))
    quiet.set()
    hostile: dict[str, int] = {}
    for other in others:
        for kind, n in other.finish().items():
            hostile[kind] = hostile.get(kind, 0) + n
    for sampler in samplers:
        sampler.finish()
    failures = [s.failure for s in samplers if s.failure]
    if failures:
        raise RuntimeError(f"the run ended early: {failures[0]}")
    cpu, capacity1 = process_cpu(pid) - cpu0, capacity_counters(gw)
    return {"wall_s": wall, "gateway_cpu_s": cpu, "hostile": hostile,
            "capacity": {k: capacity1[k] - capacity0[k] for k in capacity1},
            "end": proc_status(pid) | {"tiers": tiers_view(gw), "memory": memory_view(gw)},
            "samples": samplers[0].samples, "capacity_samples": samplers[1].samples}


def compare_snapshots(before: Path, after: Path, top: int = 25, frames: int = 3) -> str:
    """The allocation sites (the ``frames`` innermost frames, innermost
    first) that grew most from one tracemalloc snapshot to a later one."""
    import tracemalloc  # only here: the soak itself traces nothing

    old, new = tracemalloc.Snapshot.load(str(before)), tracemalloc.Snapshot.load(str(after))
    stats = new.compare_to(old, "traceback")
    total = sum(s.size_diff for s in stats)
    lines = [f"{before.name} -> {after.name}: {total / MiB:+.1f} MiB traced in all", ""]
    for stat in stats[:top]:
        # A traceback's frames run from the oldest to the innermost.
        where = " <- ".join(f"{'/'.join(f.filename.rsplit('/', 2)[-2:])}:{f.lineno}"
                            for f in reversed(stat.traceback[-frames:]))
        lines.append(f"{stat.size_diff / MiB:+8.2f} MiB {stat.count_diff:+8d} blocks  {where}")
    return "\n".join(lines)


def env_setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="180 s, 16 threads, 200 MiB data set, 96 MiB hot tier, 2 large objects")
    ap.add_argument("--seconds", type=float, help="timed run (default 300; --quick 180)")
    ap.add_argument("--threads", type=int, help="client threads (default 32; --quick 16)")
    ap.add_argument("--dataset-size", type=parse_size, help="bytes written first (default 600M)")
    ap.add_argument("--hot-size", type=parse_size, help="the gateway's --hot-size (default 256M)")
    ap.add_argument("--large-objects", type=int, help="large keys in all (default 6)")
    ap.add_argument("--small-min", type=parse_size, default=4 * KiB)
    ap.add_argument("--small-max", type=parse_size, default=MiB)
    ap.add_argument("--large-min", type=parse_size, default=16 * MiB)
    ap.add_argument("--large-max", type=parse_size, default=64 * MiB)
    ap.add_argument("--hostile", action="store_true",
                    help="add batch GETs, copies and aborted uploads to the mix, hostile clients "
                         "and an operator flushing and evicting")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="requests/s of all client threads together (default 0: unpaced)")
    ap.add_argument("--hostile-threads", type=int, default=2,
                    help="hostile client threads with --hostile (default 2)")
    ap.add_argument("--hostile-rate", type=float, default=10.0,
                    help="requests/s of each hostile thread (default 10)")
    ap.add_argument("--operator-every", type=float, default=10.0,
                    help="seconds between the operator's flush + evict with --hostile "
                         "(default 10; 0: no operator)")
    ap.add_argument("--max-rss-slope", type=float, default=MAX_RSS_SLOPE,
                    help="MiB/min of growth of the RSS floor over the second half that fails "
                         "the run (default 10; inf: not judged)")
    ap.add_argument("--gateway-env", type=env_setting, action="append", default=[],
                    metavar="NAME=VALUE",
                    help="set in the gateway's environment, e.g. MALLOC_ARENA_MAX=2 (repeatable)")
    ap.add_argument("--client-retries", type=int, default=1,
                    help="times a well-behaved client retries a failed request, 503 SlowDown among "
                         "them (default 1); raise it for a gateway with --memory-limit, "
                         "e.g. --gateway-env TIERSTORE_MEMORY_LIMIT=256M --client-retries 8")
    ap.add_argument("--keep-log", type=Path, metavar="PATH",
                    help="copy the gateway's log (warnings, one line per request) here at the end")
    ap.add_argument("--tracemalloc", type=Path, metavar="DIR",
                    help="trace the gateway's allocations: a tracemalloc snapshot in DIR every "
                         "TIERSTORE_TRACEMALLOC_EVERY (30) s (tracemalloc_hook/; slows it down)")
    ap.add_argument("--compare-snapshots", type=Path, nargs=2, metavar=("BEFORE", "AFTER"),
                    help="print the allocation sites that grew between two snapshots, and exit")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write every number as JSON here")
    args = ap.parse_args(argv)
    if args.compare_snapshots:
        print(compare_snapshots(*args.compare_snapshots))
        return 0
    quick = args.quick
    for name, full, short in (("seconds", 300.0, 180.0), ("threads", 32, 16),
                              ("dataset_size", 600 * MiB, 200 * MiB),
                              ("hot_size", 256 * MiB, 96 * MiB), ("large_objects", 6, 2)):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)
    _common.begin()

    results = run(args)
    summary = summarise(results, args)
    print(report(results, summary, args))
    args.keep_log = str(args.keep_log) if args.keep_log else None  # for the JSON
    args.tracemalloc = str(args.tracemalloc) if args.tracemalloc else None
    raw = {k: v for k, v in results.items() if k != "latencies"}  # summarised instead
    _common.write_results(args, raw | {"summary": summary})
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
