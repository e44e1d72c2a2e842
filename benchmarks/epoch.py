"""Epoch hints for small-object training epochs: what prefetch buys, with
the capacity store ``--latency-ms`` away.

One moto S3 server (with ranged GETs that read only the range, see
``_moto.serve_moto``) sits behind ``delay_proxy.py``, which adds
``--latency-ms`` (20) to every request, half each way. The data set,
``--objects`` random objects of ``--size`` bytes (20,000 of 64 KiB), is
written twice: straight into moto (``s3://source/``, one object per key) and
through the gateway into a managed bucket whose capacity store is moto behind
the proxy, then flushed and evicted. Each epoch reads every object once, in
a new order (``gateway.client.order.shuffled`` of the keys with the epoch's seed),
from ``--readers`` (8) threads with a boto3 client each: reader r reads
positions r, r + 8, r + 16, ... of the order.

  direct          moto through the proxy, no gateway
  cold, no hints  the gateway, hot tier evicted, no epoch registered
  cold, hinted    evicted, the epoch's order registered (readers=8) just before
  all hot         everything warmed first (POST /jobs/warm): the reference time
  half-size tier  the gateway restarted on the same data with ``--hot-size``
                  so that about half the data set fits; ``--half-epochs`` (3)
                  epochs from cold, unhinted, then the same orders hinted (the
                  next epoch registered at ``--register-ahead`` (90%) of the
                  current one), against Belady's offline optimum (demand
                  paging) for the same reads and a cache of as many objects
                  as fit

Hit ratios: the gateway's ``/stats`` (objects served from the hot tier) as a
delta over the epoch; for hinted epochs also the epoch's own ``GET
/epochs/{id}`` (a hit: the whole object hot when its GET began).

The data set and reading an epoch: ``_epoch_workload.py``; the report:
``_epoch_report.py``.

Run:  .venv/bin/python benchmarks/epoch.py [--quick] [--objects 20000] [--latency-ms 20]
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import math
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import _common  # first: puts the repo root on sys.path
from _common import client, gateway, temp_dir, write_results
from _epoch_report import pct, report
from _epoch_workload import (
    BUCKET,
    PREFIX,
    SOURCE,
    Admin,
    KiB,
    Meter,
    MiB,
    checker,
    epoch_status,
    key_of,
    progress,
    read_epoch,
    write_data,
)
from _moto import moto_client, moto_store, s3_capacity_args
from delay_proxy import DelayProxy

from gateway.client.hints import Hints
from gateway.client.order import shuffled
from tests.servers import ADMIN_TOKEN

HIGH_WATERMARK = 0.9  # tiering.hot.tier.HotTier's default: reads fill the cache up to it


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- one epoch ----------------------------------------------------------------------


def run_config(
    name: str, clients: list, bucket: str, order: list[str], check: Callable[[str, bytes], None],
    meter: Meter, hints: Hints | None = None, readers: int = 8,
) -> dict:
    """One epoch of a configuration; with ``hints``, its order registered just before."""
    log(f"[{name}] epoch of {len(order):,} objects ...")
    t0 = time.perf_counter()
    epoch_id = hints.epoch(bucket, order, readers=readers) if hints else None
    register_s = time.perf_counter() - t0
    poll = progress(meter.admin, meter.proxy, epoch_id)
    with meter:
        figures = read_epoch(clients, bucket, order, check, poll=poll)
    figures.update(meter.delta)
    if epoch_id:
        figures["epoch"] = epoch_status(meter.admin, epoch_id)  # type: ignore[arg-type]
        figures["epoch_id"] = epoch_id
        figures["register_s"] = register_s
    log(f"[{name}] {figures['wall_s']:.1f} s, {figures['objects_per_s']:.0f}/s, hit ratio "
        f"{pct(figures.get('hit_ratio'))}")
    return figures


# -- Belady ------------------------------------------------------------------------


def belady_hits(reads: list[str], capacity: int) -> list[bool]:
    """Hit or miss of each read under Belady's MIN with demand paging: every
    miss is loaded, and when the cache holds ``capacity`` objects the one
    next read furthest in the future (or never) makes room for it."""
    never = len(reads)
    next_use = [never] * len(reads)
    last: dict[str, int] = {}
    for t in range(len(reads) - 1, -1, -1):
        next_use[t] = last.get(reads[t], never)
        last[reads[t]] = t
    cached: dict[str, int] = {}  # key -> its next read
    furthest: list[tuple[int, str]] = []  # (-next read, key); stale entries skipped
    hits = []
    for t, key in enumerate(reads):
        hits.append(key in cached)
        if key not in cached and capacity and len(cached) >= capacity:
            while True:
                when, victim = heapq.heappop(furthest)
                if cached.get(victim) == -when:
                    del cached[victim]
                    break
        if capacity:
            cached[key] = next_use[t]
            heapq.heappush(furthest, (-next_use[t], key))
    return hits


# -- the half-size hot tier ---------------------------------------------------------


def half_series(
    args: argparse.Namespace, admin: Admin, hints: Hints | None, clients: list,
    orders: list[list[str]], check: Callable[[str, bytes], None], meter: Meter,
) -> list[dict]:
    """``orders`` read one after the other from a cold hot tier; with
    ``hints``, each registered before it (the next one at
    ``--register-ahead`` of the current one, queued behind it)."""
    tag = "hinted" if hints else "unhinted"
    admin.job("evict")
    out: list[dict] = []
    epoch_id = hints.epoch(BUCKET, orders[0], readers=args.readers) if hints else None
    for n, order in enumerate(orders):
        log(f"[half, {tag}] epoch {n + 1} of {len(orders)} ...")
        hook = None
        if hints and n + 1 < len(orders) and args.register_ahead > 0:
            nxt = orders[n + 1]
            hook = (args.register_ahead,
                    lambda nxt=nxt: hints.epoch(BUCKET, nxt, readers=args.readers))
        current = epoch_id
        with meter:
            poll = progress(admin, meter.proxy, current)
            figures = read_epoch(clients, BUCKET, order, check, hook=hook, poll=poll)
        figures.update(meter.delta)
        if current:
            figures["epoch"] = epoch_status(admin, current)
            figures["epoch_id"] = current
        out.append(figures)
        log(f"[half, {tag}] epoch {n + 1}: {figures['wall_s']:.1f} s, hit ratio "
            f"{pct(figures['hit_ratio'])} (stats)"
            + (f", {pct(figures['epoch']['hit_ratio'])} (epoch)" if current else ""))
        if hints and n + 1 < len(orders):
            epoch_id = figures["hook"] or hints.epoch(BUCKET, orders[n + 1], readers=args.readers)
    return out


# -- the run ------------------------------------------------------------------------


@contextlib.contextmanager
def keep_logs(tmp: Path, into: Path | None) -> Iterator[None]:
    """Copy the gateways' logs (``*-gateway.log`` in ``tmp``) to ``into``
    at the end, whatever happens."""
    try:
        yield
    finally:
        if into is not None:
            into.mkdir(parents=True, exist_ok=True)
            for path in tmp.glob("*-gateway.log"):
                shutil.copy(path, into / f"epoch-{path.name}")


def run(args: argparse.Namespace) -> dict:
    keys = [key_of(i) for i in range(args.objects)]
    check = checker(args.size)
    data_bytes = args.objects * args.size
    half_size = math.ceil(data_bytes * args.hot_fraction / HIGH_WATERMARK)
    results: dict = {"data_bytes": data_bytes}
    seeds = iter(range(1, 100))
    with (moto_store() as (moto_port, moto_pid), DelayProxy(moto_port) as proxy,
          temp_dir("epoch") as tmp, keep_logs(tmp, args.keep_logs)):
        moto = f"http://127.0.0.1:{moto_port}"
        moto_client(moto).create_bucket(Bucket=SOURCE)
        proxy.delay_s = args.latency_ms / 2000  # each way: the round trip gains latency_ms
        capacity = tuple(s3_capacity_args(proxy.endpoint))
        direct_clients = [client(proxy.endpoint, max_pool=2) for _ in range(args.readers)]
        configs: dict[str, dict] = {}
        with gateway(tmp / "data", extra_args=capacity) as gw:
            admin = Admin(gw.admin_url)
            hints = Hints(gw.admin_url, ADMIN_TOKEN, strict=True)
            try:
                client(gw.endpoint).create_bucket(Bucket=BUCKET)
                log(f"[setup] writing {args.objects:,} objects of {args.size:,} bytes, "
                    "through the gateway and straight into moto ...")
                results["write_s"] = write_data(gw.endpoint, moto, args.objects, args.size)
                t0 = time.perf_counter()
                admin.job("flush")
                results["flush_s"] = time.perf_counter() - t0
                admin.job("evict")
                tiers = admin("GET", "/tiers")
                if tiers["flush_queue"] or tiers["hot_staged"] or tiers["hot_cached"]:
                    raise RuntimeError(f"not flushed and evicted: {tiers}")
                results["segments"] = tiers["segments"]
                log(f"[setup] {results['write_s']:.0f} s writing, {results['flush_s']:.1f} s "
                    f"flush, {tiers['segments']} segments")
                gw_clients = [client(gw.endpoint, max_pool=2) for _ in range(args.readers)]
                pids = {"gateway": gw.proc.pid, "moto": moto_pid}
                meter = Meter(admin, proxy, pids)
                configs["direct"] = run_config(
                    "direct", direct_clients, SOURCE, shuffled(keys, next(seeds)), check,
                    Meter(None, proxy, {"moto": moto_pid}))
                configs["cold, no hints"] = run_config(
                    "cold, no hints", gw_clients, BUCKET, shuffled(keys, next(seeds)), check, meter)
                admin.job("evict")
                configs["cold, hinted"] = run_config(
                    "cold, hinted", gw_clients, BUCKET, shuffled(keys, next(seeds)), check, meter,
                    hints=hints, readers=args.readers)
                t0 = time.perf_counter()
                warm = admin.job("warm", {"bucket": BUCKET, "prefix": PREFIX})
                results["warm_all"] = warm | {"s": time.perf_counter() - t0}
                configs["all hot"] = run_config(
                    "all hot", gw_clients, BUCKET, shuffled(keys, next(seeds)), check, meter)
                admin.job("evict")  # the restarted gateway's smaller hot tier starts empty
            finally:
                hints.close()
                admin.close()
        results["configs"] = configs
        if args.half_epochs <= 0:
            return results

        # The same data, the gateway restarted with a hot tier for about half of it.
        orders = [shuffled(keys, next(seeds)) for _ in range(args.half_epochs)]
        with gateway(tmp / "data", extra_args=(*capacity, "--hot-size", str(half_size))) as gw:
            admin = Admin(gw.admin_url)
            hints = Hints(gw.admin_url, ADMIN_TOKEN, strict=True)
            try:
                log(f"[half] hot tier of {half_size / MiB:.0f} MiB: how much fits ...")
                warm = admin.job("warm", {"bucket": BUCKET, "prefix": PREFIX})
                tiers = admin("GET", "/tiers")
                fit = tiers["hot_cached"] // args.size
                results["half"] = {
                    "hot_size": half_size, "high_watermark": tiers["high_watermark"],
                    "warm": warm, "hot_cached": tiers["hot_cached"], "fit_objects": fit,
                    "fit_fraction": fit / args.objects,
                }
                log(f"[half] {fit:,} objects fit ({fit / args.objects:.1%}); warm job said "
                    f"{warm.get('hot_objects')} hot, {warm.get('left_out_objects')} left out")
                gw_clients = [client(gw.endpoint, max_pool=2) for _ in range(args.readers)]
                meter = Meter(admin, proxy, {"gateway": gw.proc.pid, "moto": moto_pid})
                unhinted = half_series(args, admin, None, gw_clients, orders, check, meter)
                hinted = half_series(args, admin, hints, gw_clients, orders, check, meter)
            finally:
                hints.close()
                admin.close()
    reads = [key for order in orders for key in order]
    hits = belady_hits(reads, fit)
    n = args.objects
    results["half"] |= {
        "unhinted": unhinted, "hinted": hinted,
        "belady": [sum(hits[i * n:(i + 1) * n]) / n for i in range(len(orders))],
        "belady_mean": sum(hits) / len(hits),
    }
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,000 objects instead of 20,000")
    ap.add_argument("--objects", type=int,
                    help="objects in the data set (default 20000; --quick 2000)")
    ap.add_argument("--size", type=int, default=64 * KiB,
                    help="object size in bytes (default 65536)")
    ap.add_argument("--readers", type=int, default=8,
                    help="reader threads, one boto3 client each (default 8)")
    ap.add_argument("--latency-ms", type=float, default=20.0,
                    help="added to each request to the capacity store, half each way (default 20)")
    ap.add_argument("--hot-fraction", type=float, default=0.5,
                    help="share of the data set the half-size hot tier is sized for, below its "
                         "high watermark (default 0.5)")
    ap.add_argument("--half-epochs", type=int, default=3,
                    help="epochs of the half-size series, each unhinted and hinted "
                         "(default 3; 0: skip it)")
    ap.add_argument("--register-ahead", type=float, default=0.9,
                    help="register the next hinted epoch when this fraction of the current one is "
                         "read (default 0.9; 0: just before it starts)")
    ap.add_argument("--keep-logs", type=Path, metavar="DIR",
                    help="copy the gateway's log (warnings, one line per request) here at the end")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    if args.objects is None:
        args.objects = 2000 if args.quick else 20_000
    _common.begin()
    results = run(args)
    args.keep_logs = str(args.keep_logs) if args.keep_logs else None  # for the JSON
    text, targets = report(args, results)
    print(text)
    write_results(args, results | {"targets": targets})
    return 0


if __name__ == "__main__":
    sys.exit(main())
