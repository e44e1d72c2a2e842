"""Epoch hints for small-object training epochs: what prefetch buys, with
the capacity store ``--latency-ms`` away.

One moto S3 server (with ranged GETs that read only the range, see
``capacity.serve_moto``) sits behind ``delay_proxy.py``, which adds
``--latency-ms`` (20) to every request, half each way. The data set,
``--objects`` random objects of ``--size`` bytes (20,000 of 64 KiB), is
written twice: straight into moto (``s3://source/``, one object per key) and
through the gateway into a managed bucket whose capacity store is moto behind
the proxy, then flushed and evicted. Each epoch reads every object once, in
a new order (``tiering.order.shuffled`` of the keys with the epoch's seed),
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

Run:  .venv/bin/python benchmarks/epoch.py [--quick] [--objects 20000] [--latency-ms 20]
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import math
import random
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _common  # first: puts the repo root on sys.path
import httpx
from _common import (
    client, gateway, machine, percentile, process_cpu, table, temp_dir, write_results,
)
from capacity import moto_client, moto_store, s3_capacity_args
from delay_proxy import DelayProxy

from gateway.hints import Hints
from tests.servers import ADMIN_TOKEN
from tiering.order import shuffled

KiB, MiB = 1024, 1024**2
BUCKET = "train"  # the managed bucket, in the gateway
SOURCE = "source"  # the same objects straight in moto, for `direct`
PREFIX = "train/"
HIGH_WATERMARK = 0.9  # tiering.hot.HotTier's default: reads fill the cache up to it
WRITERS = 16
POLL_S = 1.0  # how often an epoch's progress is sampled
SAMPLE_EVERY = 97  # every 97th object's bytes are compared, not only its length
STATUS = ("state", "consumed", "hits", "misses", "hit_ratio", "prefetched_objects",
          "prefetched_bytes", "lookahead_objects", "lookahead_bytes", "missing_objects")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def body_of(i: int, size: int) -> bytes:
    return random.Random(i).randbytes(size)


def key_of(i: int) -> str:
    return f"{PREFIX}{i:07d}.jpg"


# -- the admin API ----------------------------------------------------------------


class Admin:
    """The gateway's admin API, with the benchmark's token."""

    def __init__(self, url: str) -> None:
        self._http = httpx.Client(base_url=url, timeout=1800,
                                  headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})

    def __call__(self, method: str, path: str, **kwargs: object) -> dict:
        response = self._http.request(method, path, **kwargs)  # type: ignore[arg-type]
        response.raise_for_status()
        return response.json() if response.content else {}

    def job(self, kind: str, body: dict | None = None) -> dict:
        """Run a job to its end; its result (raise unless it succeeded)."""
        job = self("POST", f"/jobs/{kind}", params={"wait": "true"}, json=body)
        if job["state"] != "succeeded":
            raise RuntimeError(f"{kind} job ended {job['state']}: {job}")
        return job["result"] or {}

    def counters(self) -> dict[str, int]:
        """The counters an epoch is measured by (deltas taken later)."""
        stats, tiers = self("GET", "/stats"), self("GET", "/tiers")
        return {
            "hot_objects": stats["served"]["hot"]["objects"],
            "capacity_objects": stats["served"]["capacity"]["objects"],
            "cache_hits": tiers["cache_hits"], "cache_misses": tiers["cache_misses"],
            "store_gets": tiers["capacity_requests"]["gets"],
            "store_bytes_read": tiers["capacity_bytes_read"], "evicted_bytes": tiers["evicted"],
        }

    def close(self) -> None:
        self._http.close()


# -- one epoch ----------------------------------------------------------------------


def read_epoch(
    clients: list, bucket: str, order: list[str], check: Callable[[str, bytes], None],
    hook: tuple[float, Callable[[], object]] | None = None, poll: Callable[[], dict] | None = None,
    shared: bool = False,
) -> dict:
    """Read ``order`` once: reader r (``clients[r]``) GETs positions r, r + N,
    ... or, ``shared``, every reader takes the next position of one shared
    queue (as a DataLoader's workers do). Returns wall time, latencies, and
    what ``hook`` (called from another thread once a fraction of the reads
    is done) and ``poll`` (every ``POLL_S``) returned. Any failure stops
    every reader and is raised."""
    readers = len(clients)
    stop, fired = threading.Event(), threading.Event()
    lock = threading.Lock()
    done = [0]
    fire_at = max(1, int(len(order) * hook[0])) if hook else -1
    latencies: list[list[float]] = [[] for _ in clients]
    samples: list[dict] = []

    queue = iter(range(len(order)))

    def positions(r: int) -> Iterator[int]:
        if not shared:
            yield from range(r, len(order), readers)
            return
        while True:
            with lock:
                position = next(queue, None)
            if position is None:
                return
            yield position

    def reader(r: int) -> None:
        s3, mine = clients[r], latencies[r]
        for position in positions(r):
            if stop.is_set():
                return
            key = order[position]
            t0 = time.perf_counter()
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            mine.append(time.perf_counter() - t0)
            check(key, body)
            with lock:
                done[0] += 1
                if done[0] == fire_at:
                    fired.set()

    def run_hook() -> object:
        while not fired.wait(0.1):
            if stop.is_set():
                return None
        return hook[1]() if hook else None

    def run_poll(t0: float) -> None:
        while not stop.wait(POLL_S):
            sample = poll() if poll else {}
            samples.append({"t": round(time.perf_counter() - t0, 2), "read": done[0], **sample})

    pool = ThreadPoolExecutor(readers + 2, thread_name_prefix="epoch")
    try:
        t0 = time.perf_counter()
        hooked = pool.submit(run_hook) if hook else None
        if poll:
            pool.submit(run_poll, t0)
        futures = [pool.submit(reader, r) for r in range(readers)]
        for future in futures:
            future.result()
        wall = time.perf_counter() - t0
        hook_result = hooked.result() if hooked else None
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
    lat = [x for mine in latencies for x in mine]
    return {
        "wall_s": wall, "objects": len(order), "objects_per_s": len(order) / wall,
        "p50_ms": statistics.median(lat) * 1000, "p99_ms": percentile(lat, 99) * 1000,
        "hook": hook_result, "samples": samples,
    }


def checker(size: int) -> Callable[[str, bytes], None]:
    def check(key: str, body: bytes) -> None:
        if len(body) != size:
            raise AssertionError(f"{key}: {len(body)} bytes, expected {size}")
        i = int(key.rsplit("/", 1)[1].split(".")[0])
        if i % SAMPLE_EVERY == 0 and body != body_of(i, size):
            raise AssertionError(f"{key}: other bytes than were written")
    return check


class Meter:
    """Counters of the gateway, the proxy and the CPU of each process,
    before and after an epoch."""

    def __init__(self, admin: Admin | None, proxy: DelayProxy, pids: dict[str, int]) -> None:
        self.admin, self.proxy, self.pids = admin, proxy, pids

    def __enter__(self) -> Meter:
        self.proxy.reset()
        self._before = self.admin.counters() if self.admin else {}
        self._cpu = {name: process_cpu(pid) for name, pid in self.pids.items()}
        self._client = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            return
        after = self.admin.counters() if self.admin else {}
        self.delta = {k: after[k] - self._before[k] for k in after}
        self.delta["proxied_gets"] = self.proxy.snapshot()["operations"].get("GetObject", 0)
        for name, pid in self.pids.items():
            self.delta[f"{name}_cpu_s"] = process_cpu(pid) - self._cpu[name]
        self.delta["client_cpu_s"] = time.process_time() - self._client
        served = self.delta.get("hot_objects", 0) + self.delta.get("capacity_objects", 0)
        self.delta["hit_ratio"] = self.delta["hot_objects"] / served if served else None


def epoch_status(admin: Admin, epoch_id: str) -> dict:
    view = admin("GET", f"/epochs/{epoch_id}")
    return {k: view[k] for k in STATUS}


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
        f"{_pct(figures.get('hit_ratio'))}")
    return figures


def progress(admin: Admin | None, proxy: DelayProxy, epoch_id: str | None) -> Callable[[], dict]:
    """What an epoch's samples hold: the epoch's own counters (hinted), the
    hot tier's bytes, and the GETs and bytes moto has answered so far."""

    def sample() -> dict:
        out: dict = {}
        if admin is not None and epoch_id is not None:
            status = epoch_status(admin, epoch_id)
            out |= {k: status[k] for k in ("consumed", "hits", "misses", "prefetched_objects",
                                           "lookahead_objects")}
        if admin is not None:
            tiers = admin("GET", "/tiers")
            out |= {"hot_cached": tiers["hot_cached"], "evicted": tiers["evicted"]}
        seen = proxy.snapshot()
        return out | {"store_gets": seen["operations"].get("GetObject", 0),
                      "store_bytes": seen["bytes"]["down"]}

    return sample


def misses_by_part(figures: dict, parts: tuple[float, ...] = (0.1, 0.9)) -> list[int] | None:
    """A hinted epoch's misses in its first 10%, middle 80% and last 10% of
    reads, interpolated from its samples (consumed, misses)."""
    if "epoch" not in figures:
        return None
    points = [(0, 0)]
    points += [(s["consumed"], s["misses"]) for s in figures["samples"] if "consumed" in s]
    points.append((figures["epoch"]["consumed"], figures["epoch"]["misses"]))

    def at(consumed: float) -> float:
        for (c0, m0), (c1, m1) in zip(points, points[1:], strict=False):
            if c0 <= consumed <= c1:
                return m0 + (m1 - m0) * ((consumed - c0) / (c1 - c0) if c1 > c0 else 1)
        return points[-1][1]

    n = figures["objects"]
    marks = [0.0] + [at(f * n) for f in parts] + [float(points[-1][1])]
    return [round(b - a) for a, b in zip(marks, marks[1:], strict=False)]


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
            f"{_pct(figures['hit_ratio'])} (stats)"
            + (f", {_pct(figures['epoch']['hit_ratio'])} (epoch)" if current else ""))
        if hints and n + 1 < len(orders):
            epoch_id = figures["hook"] or hints.epoch(BUCKET, orders[n + 1], readers=args.readers)
    return out


# -- the run ------------------------------------------------------------------------


def write_data(gw_endpoint: str, moto_endpoint: str, objects: int, size: int) -> float:
    """Every object PUT through the gateway (boto3) and straight into moto
    (a plain unsigned PUT: moto does not check signatures, and boto3's own
    CPU would double the set-up time), from ``WRITERS`` threads; the wall time."""
    local = threading.local()

    def put(task: tuple[str, int]) -> None:
        target, i = task
        if not hasattr(local, "s3"):
            local.s3 = client(gw_endpoint, max_pool=2)
            local.http = httpx.Client(base_url=moto_endpoint, timeout=120)
        if target == "gw":
            local.s3.put_object(Bucket=BUCKET, Key=key_of(i), Body=body_of(i, size))
        else:
            local.http.put(f"/{SOURCE}/{key_of(i)}", content=body_of(i, size)).raise_for_status()

    tasks = [(target, i) for i in range(objects) for target in ("gw", "moto")]
    pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="writer")
    try:
        t0 = time.perf_counter()
        for _ in pool.map(put, tasks):
            pass
        return time.perf_counter() - t0
    finally:  # on Ctrl-C, do not go on with the queued PUTs
        pool.shutdown(wait=True, cancel_futures=True)


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


# -- report -------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _parts(figures: dict) -> str:
    return " / ".join(map(str, misses_by_part(figures) or []))


def report_configs(args: argparse.Namespace, r: dict) -> list[str]:
    configs = r["configs"]
    hot_s = configs["all hot"]["wall_s"]
    rows = []
    for name, c in configs.items():
        if "epoch" in c:
            hit = f"{_pct(c['epoch']['hit_ratio'])} (epoch), {_pct(c['hit_ratio'])} (stats)"
        else:
            hit = _pct(c.get("hit_ratio"))
        gateway_cpu = f"{c['gateway_cpu_s']:.0f}" if "gateway_cpu_s" in c else "-"
        rows.append([name, f"{c['wall_s']:.1f}", f"{c['objects_per_s']:.0f}", hit,
                     f"{c['wall_s'] / hot_s:.2f}x", f"{c['p50_ms']:.0f} / {c['p99_ms']:.0f}",
                     f"{c['proxied_gets']:,}", gateway_cpu, f"{c['moto_cpu_s']:.0f}",
                     f"{c['client_cpu_s']:.0f}"])
    hinted = configs["cold, hinted"]
    status = hinted["epoch"]
    return [
        f"### Epochs over {args.objects:,} objects of {args.size // KiB} KiB, "
        f"{args.readers} readers, +{args.latency_ms:g} ms per request to the capacity store",
        "",
        f"Machine: {machine()}",
        "",
        f"Setup: written in {r['write_s']:.0f} s (through the gateway and straight into moto, "
        f"{WRITERS} threads), flushed in {r['flush_s']:.1f} s into {r['segments']} segments; "
        f"the all-hot warm job took {r['warm_all']['s']:.1f} s.",
        "",
        table(["configuration", "epoch s", "objects/s", "hit ratio", "time / all hot",
               "p50 / p99 ms", "GETs to moto", "gateway CPU s", "moto CPU s", "client CPU s"],
              rows),
        "",
        f"Cold, hinted: registered in {hinted['register_s']:.1f} s (before the clock starts); "
        f"{status['prefetched_objects']:,} objects prefetched; lookahead window "
        f"{status['lookahead_objects']} objects at the end; misses in the first 10% / middle "
        f"80% / last 10% of the reads: {_parts(hinted)}. The readers are one Python process "
        "of boto3 threads (200 to 280 GETs/s on 2 cores): the all-hot time is theirs, not "
        "the gateway's. Client CPU includes the delay proxy's thread.",
        "",
    ]


def report_half(args: argparse.Namespace, h: dict) -> tuple[list[str], float, float]:
    """The half-size table; and the hinted and unhinted hit ratios over all
    its epochs."""
    rows = []
    for n, (u, k, b) in enumerate(zip(h["unhinted"], h["hinted"], h["belady"], strict=True)):
        rows.append([
            f"epoch {n + 1}", f"{u['wall_s']:.1f}", _pct(u["hit_ratio"]), f"{k['wall_s']:.1f}",
            _pct(k["epoch"]["hit_ratio"]), _pct(k["hit_ratio"]), _pct(b), _parts(k),
            f"{k['epoch']['prefetched_objects']:,}",
            f"{u['evicted_bytes'] / MiB:,.0f} / {k['evicted_bytes'] / MiB:,.0f}",
            f"{u['proxied_gets']:,} / {k['proxied_gets']:,}",
            f"{u['store_bytes_read'] / MiB:,.0f} / {k['store_bytes_read'] / MiB:,.0f}",
        ])
    unhinted = _mean([u["hit_ratio"] for u in h["unhinted"]])
    statuses = [k["epoch"] for k in h["hinted"]]
    hinted = sum(e["hits"] for e in statuses) / sum(e["hits"] + e["misses"] for e in statuses)
    rows.append(["all", f"{_mean([u['wall_s'] for u in h['unhinted']]):.1f}", _pct(unhinted),
                 f"{_mean([k['wall_s'] for k in h['hinted']]):.1f}", _pct(hinted),
                 _pct(_mean([k["hit_ratio"] for k in h["hinted"]])), _pct(h["belady_mean"]),
                 "", "", "", "", ""])
    ahead = (f"each next epoch registered at {args.register_ahead:.0%} of the current one"
             if args.register_ahead > 0 else "each epoch registered just before it")
    fit = h["fit_objects"]
    lines = [
        f"### Hot tier for about half the data set: {h['hot_size'] / MiB:,.0f} MiB "
        f"(high watermark {h['high_watermark'] / MiB:,.0f} MiB)",
        "",
        f"{fit:,} of {args.objects:,} objects fit ({h['fit_fraction']:.1%}: a warm job of the "
        f"whole set left {h['hot_cached'] / MiB:,.0f} MiB cached). {len(h['belady'])} epochs "
        f"from a cold hot tier in new random orders, the same orders unhinted, then hinted "
        f"({ahead}). Belady: the offline optimum with demand paging for the same reads and a "
        f"cache of {fit:,} objects. Time and hit ratio of the last row: the mean of the epochs.",
        "",
        table(["", "unhinted s", "unhinted hit ratio", "hinted s", "hinted hit ratio (epoch)",
               "hinted (stats)", "Belady", "hinted misses: first 10% / middle / last 10%",
               "prefetched", "evicted MiB (unhinted / hinted)", "GETs to moto (u / h)",
               "MiB from moto (u / h)"], rows),
        "",
    ]
    if hinted > h["belady_mean"]:
        lines += ["The hinted hit ratio is above Belady's: prefetching brings objects in before "
                  "their read, which demand paging (every miss loads the object) cannot.", ""]
    return lines, hinted, unhinted


def report(args: argparse.Namespace, r: dict) -> tuple[str, list[dict]]:
    """The markdown tables, and the targets (met or missed)."""
    lines = report_configs(args, r)
    hinted_s, hot_s = r["configs"]["cold, hinted"]["wall_s"], r["configs"]["all hot"]["wall_s"]
    targets = [{
        "target": "cold, hinted epoch time within 1.25x of all hot", "value": hinted_s / hot_s,
        "limit": 1.25, "met": hinted_s / hot_s <= 1.25,
        "measured": f"{hinted_s:.1f} s / {hot_s:.1f} s = {hinted_s / hot_s:.2f}x",
    }]
    if "half" in r:
        half, hinted, unhinted = report_half(args, r["half"])
        lines += half
        belady = r["half"]["belady_mean"]
        to_belady = hinted / belady if belady else math.inf
        to_unhinted = hinted / unhinted if unhinted else math.inf
        targets += [
            {"target": "half-size tier: hinted hit ratio at least 95% of Belady's",
             "value": to_belady, "limit": 0.95, "met": to_belady >= 0.95,
             "measured": f"{hinted:.1%} / {belady:.1%} = {to_belady:.2f}x"},
            {"target": "half-size tier: hinted hit ratio at least 2x unhinted",
             "value": to_unhinted, "limit": 2.0, "met": to_unhinted >= 2.0,
             "measured": f"{hinted:.1%} / {unhinted:.1%} = {to_unhinted:.2f}x"},
        ]
    lines += [
        "### Targets",
        "",
        table(["target", "measured", ""],
              [[t["target"], t["measured"], "met" if t["met"] else "**missed**"]
               for t in targets]),
        "",
    ]
    return "\n".join(lines), targets


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
    _common.exit_cleanly_on_sigterm()
    results = run(args)
    args.keep_logs = str(args.keep_logs) if args.keep_logs else None  # for the JSON
    text, targets = report(args, results)
    print(text)
    write_results(args, results | {"targets": targets})
    return 0


if __name__ == "__main__":
    sys.exit(main())
