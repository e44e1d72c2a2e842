"""tierstore side by side with nginx and the gateways users would otherwise
pick, in one run, over the same capacity store ``--latency-ms`` away.

Started on 127.0.0.1, each stopped by its PID at the end (also on Ctrl-C or
SIGTERM), temp dirs removed:

  store        moto's S3 server (``_moto.serve_moto``: ranged GETs read
               only the range), or with ``--store rclone`` ``rclone serve s3``
               of a directory (a faster S3 server: Go, keep-alive; nginx-cache
               and JuiceFS are then left out), behind
               ``delay_proxy.DelayProxy``, which adds ``--latency-ms`` (20) to
               every request, half each way, and counts requests; the delay
               is checked by timing HEADs
  tierstore    a managed bucket whose capacity store is the delayed store;
               cold = flushed and evicted, hinted = evicted and the epoch's
               order registered (gateway.client.hints), hot = read once
  moto direct  the delayed store itself, no cache in between ("rclone direct"
               with ``--store rclone``)
  nginx-local  nginx serving the same files from local disk (the HTTP limit
               of this machine): GETs of /bucket/key
  nginx-cache  nginx as a caching reverse proxy (proxy_cache, 1 MiB slices)
               of the delayed store; cold = fresh cache, hot = read once
  rclone       ``rclone serve s3`` over the delayed store, VFS cache full
  juicefs      the JuiceFS S3 gateway on a volume in the delayed store
               (metadata in SQLite), its disk cache; cold = cache dir
               dropped and the gateway restarted

Workloads (``--quick`` sizes in parentheses):

  1. an epoch of ``--objects`` 64 KiB objects (4,000; 1,000) in a shuffled
     order (``gateway.client.order.shuffled``), ``--readers`` (16) threads with a
     lean client each (one keep-alive connection, SigV4 by a cached key,
     whichever server it reads: nginx ignores the signature, and every
     server is read by the same client): objects/s, MiB/s, p50/p99,
     server CPU seconds per 1,000 GETs
  2. one ``--large-mib`` object (256; 64): a whole GET, and ``--ranges``
     (64) random 4 MiB ranged GETs from ``--range-readers`` (4) threads
  3. PUTs of the small objects from ``--writers`` (16) threads: objects/s,
     and requests to the capacity store per 500 objects (PUTs and flush)
  4. a ListObjectsV2 listing of the small objects' prefix, pages of 1,000
  5. server efficiency: wrk (C, ``-t2 -c16 -d10s --latency``) against ONE
     hot 64 KiB object of every server (a presigned SigV4 URL for the S3
     ones): requests/s, p50/p99, server CPU seconds per 1,000 requests and
     cores busy (nginx-local near 1 core with 1 worker: saturated)

Run:  .venv/bin/python benchmarks/compare.py [--quick] [--objects 4000] [--latency-ms 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from http.client import HTTPConnection
from pathlib import Path

import _common  # first: puts the repo root on sys.path
from _common import client, data_filesystem, gateway, machine, table, temp_dir, write_results
from _compare_client import SignedClient
from _compare_peers import JuiceFS, NginxCache, NginxLocal, Peer, Rclone, RcloneStore
from _compare_workloads import epoch, ingest, listing, random_ranges, ranged_gets, whole_get
from _compare_wrk import ensure_wrk, presigned_get, server_efficiency
from _epoch_workload import Admin, body_of, checker, key_of
from _moto import CAPACITY_BUCKET, moto_client, moto_store, s3_capacity_args
from delay_proxy import DelayProxy

from gateway.client.hints import Hints
from gateway.client.order import shuffled
from tests.servers import ADMIN_TOKEN

KiB, MiB = 1024, 1024**2
BUCKET = "data"  # in tierstore, in moto (moto direct, nginx-cache, rclone), in JuiceFS
JFS_BUCKET = "jfs"  # in moto: JuiceFS's chunks
PREFIX = "train/"  # epoch.key_of's
LARGE_KEY = "large/object.bin"
SEED = 11
PUBLIC_READ = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
    "Resource": f"arn:aws:s3:::{BUCKET}/*"}]}  # unsigned GETs, as nginx-cache sends them
Pids = dict[str, Callable[[], list[int]]]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- set-up ---------------------------------------------------------------------------


def measure_delay(moto_port: int, proxy_port: int, count: int = 20) -> dict:
    """Median HEAD time straight to moto and through the proxy (one
    keep-alive connection each, after one warm-up request)."""

    def heads(port: int) -> float:
        conn = HTTPConnection("127.0.0.1", port, timeout=30)
        times = []
        try:
            for n in range(count + 1):
                t0 = time.perf_counter()
                conn.request("HEAD", f"/{BUCKET}")
                conn.getresponse().read()
                if n:
                    times.append(time.perf_counter() - t0)
        finally:
            conn.close()
        return statistics.median(times) * 1000

    direct, proxied = heads(moto_port), heads(proxy_port)
    return {"direct_ms": direct, "proxied_ms": proxied, "added_ms": proxied - direct}


def start_peer(make: Callable[[], Peer], stack: contextlib.ExitStack, skipped: dict) -> Peer | None:
    """A peer started (and stopped with ``stack``); None, and why in
    ``skipped``, if it could not be made to run."""
    try:
        peer = make()
        stack.enter_context(peer)
        return peer
    except Exception as exc:  # noqa: BLE001  reported, and the run goes on without it
        name = getattr(make, "peer_name", repr(make))
        skipped[name] = f"{type(exc).__name__}: {exc}"
        log(f"[{name}] left out: {skipped[name]}")
        return None


def named(name: str, make: Callable[[], Peer]) -> Callable[[], Peer]:
    make.peer_name = name  # type: ignore[attr-defined]
    return make


class Run:
    """The servers of one comparison and the figures gathered so far."""

    def __init__(self, args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
        self.args, self.stack = args, stack
        self.results: dict = {"skipped": {}, "epoch": [], "large": [], "ingest": [], "listing": [],
                              "wrk": []}
        self.keys = [key_of(i) for i in range(args.objects)]
        self.direct = self.results["direct"] = f"{args.store} direct"  # the store read directly
        rng = random.Random(7)  # randbytes takes at most 2**31 bits at a time
        self.large = b"".join(rng.randbytes(MiB) for _ in range(args.large_mib))
        self.check = checker(args.size)
        tmp = stack.enter_context(temp_dir("compare"))
        # Every server's files (the gateway's data dir, the caches, nginx's root) on one filesystem.
        tmp = stack.enter_context(data_filesystem(args.fs, tmp, size_gib=32))
        self.tmp = tmp
        if args.store == "rclone":
            store = stack.enter_context(RcloneStore(tmp / "rclone-store", tmp / "store-root"))
            assert store.proc is not None
            moto_port, self.moto_pid = store.port, store.proc.pid
        else:
            moto_port, self.moto_pid = stack.enter_context(moto_store())
        self.moto = f"http://127.0.0.1:{moto_port}"
        self.proxy = stack.enter_context(DelayProxy(moto_port))
        self.proxy.delay_s = args.latency_ms / 2000
        moto = moto_client(self.moto)
        buckets = (BUCKET, JFS_BUCKET) if args.store == "moto" else (BUCKET, CAPACITY_BUCKET)
        for bucket in buckets:
            moto.create_bucket(Bucket=bucket)
        if args.store == "moto":
            moto.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(PUBLIC_READ))  # nginx-cache
        self.results["delay"] = measure_delay(moto_port, self.proxy.port)
        log(f"[store] HEAD p50 {self.results['delay']['direct_ms']:.2f} ms straight to {args.store}, "
            f"{self.results['delay']['proxied_ms']:.2f} ms through the proxy: "
            f"+{self.results['delay']['added_ms']:.1f} ms")
        (tmp / "tierstore").mkdir()
        self.gw = stack.enter_context(gateway(
            tmp / "tierstore" / "data",
            extra_args=(*s3_capacity_args(self.proxy.endpoint), "--workers", str(args.workers))))
        self.admin = Admin(self.gw.admin_url)
        stack.callback(self.admin.close)
        client(self.gw.endpoint).create_bucket(Bucket=BUCKET)

    def moto_pids(self) -> list[int]:
        return [self.moto_pid]

    def gw_pids(self) -> list[int]:
        """The gateway and its read workers."""
        return self.gw.pids()

    def evict(self) -> None:
        self.admin.job("evict")
        tiers = self.admin("GET", "/tiers")
        if tiers["flush_queue"] or tiers["hot_staged"] or tiers["hot_cached"]:
            raise RuntimeError(f"tierstore not flushed and evicted: {tiers}")

    # -- workload 3 (and the data every other workload reads) ---------------------

    def put_small(self, name: str, lean, pids: Pids, flush: bool = False) -> None:  # type: ignore[no-untyped-def]
        args = self.args
        log(f"[ingest] {name}: PUT {args.objects:,} objects of {args.size // KiB} KiB ...")
        self.proxy.reset()
        figures = ingest(lean, BUCKET, self.keys, lambda i: body_of(i, args.size), args.writers, pids)
        during = self.proxy.snapshot()
        if flush:
            t0 = time.perf_counter()
            self.admin.job("flush")
            figures["flush_s"] = time.perf_counter() - t0
        after = self.proxy.snapshot()
        figures["store_requests_put"] = sum(during["methods"].values())
        figures["store_requests"] = sum(after["methods"].values())
        figures["store_operations"] = after["operations"]
        figures["mib_per_s"] = figures["objects_per_s"] * args.size / MiB
        self.results["ingest"].append({"config": name} | figures)
        log(f"[ingest] {name}: {figures['objects_per_s']:.0f} objects/s, "
            f"{figures['store_requests']:,} store requests")

    def write_everything(self, juicefs: Peer | None) -> Path:
        """The small objects and the large one into every server; the
        directory nginx-local serves."""
        gw_lean, direct_lean = SignedClient(self.gw.port), SignedClient(self.proxy.port)
        self.put_small("tierstore", gw_lean, {"server": self.gw_pids, "moto": self.moto_pids},
                       flush=True)
        self.results["segments"] = self.admin("GET", "/tiers")["segments"]
        if gw_lean.put(BUCKET, LARGE_KEY, self.large) != 200:
            raise RuntimeError("PUT of the large object into tierstore failed")
        self.admin.job("flush")
        self.put_small(self.direct, direct_lean, {"server": self.moto_pids})
        moto_client(self.moto).put_object(Bucket=BUCKET, Key=LARGE_KEY, Body=self.large)
        if juicefs is not None:
            jfs_lean = SignedClient(juicefs.port)
            client(juicefs.endpoint).create_bucket(Bucket=BUCKET)
            self.put_small("juicefs", jfs_lean, {"server": juicefs.pids, "moto": self.moto_pids})
            if jfs_lean.put(BUCKET, LARGE_KEY, self.large) != 200:
                raise RuntimeError("PUT of the large object into JuiceFS failed")
        root = self.tmp / "www"
        for i, key in enumerate(self.keys):
            path = root / BUCKET / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body_of(i, self.args.size))
        (root / BUCKET / LARGE_KEY).parent.mkdir(parents=True, exist_ok=True)
        (root / BUCKET / LARGE_KEY).write_bytes(self.large)
        return root

    # -- workload 4 -----------------------------------------------------------------

    def list_all(self, configs: list[tuple[str, int]]) -> None:
        for name, port in configs:
            self.proxy.reset()
            figures = listing(port, BUCKET, PREFIX, self.args.objects)
            figures["store_requests"] = self.proxy.snapshot()["operations"]
            self.results["listing"].append({"config": name} | figures)
            log(f"[listing] {name}: {figures['keys_per_s']:,.0f} keys/s")

    # -- workload 1 -----------------------------------------------------------------

    def run_epoch(self, name: str, state: str, lean, pids: Pids,  # type: ignore[no-untyped-def]
                  before: Callable[[], None] | None = None) -> None:
        args = self.args
        order = shuffled(self.keys, SEED)
        if before is not None:
            before()
        self.proxy.reset()
        figures = epoch(lean, BUCKET, order, args.readers, args.size, self.check, pids)
        figures["store_gets"] = self.proxy.snapshot()["operations"].get("GetObject", 0)
        self.results["epoch"].append({"config": name, "state": state} | figures)
        log(f"[epoch] {name} ({state}): {figures['objects_per_s']:,.0f} objects/s, "
            f"p99 {figures['p99_ms']:.1f} ms, {figures['store_gets']:,} store GETs")

    def epochs_tierstore(self) -> None:
        lean = SignedClient(self.gw.port)
        pids = {"server": self.gw_pids, "moto": self.moto_pids}
        hints = Hints(self.gw.admin_url, ADMIN_TOKEN, strict=True)
        try:
            self.run_epoch("tierstore", "cold", lean, pids, before=self.evict)

            def hinted() -> None:
                self.evict()
                hints.epoch(BUCKET, shuffled(self.keys, SEED), readers=self.args.readers)

            self.run_epoch("tierstore", "cold, hinted", lean, pids, before=hinted)
            self.run_epoch("tierstore", "hot", lean, pids)
        finally:
            hints.close()

    def epochs_peer(self, peer: Peer, cold_first: bool = True) -> None:
        lean = SignedClient(peer.port)  # every server is read by the same signed readers
        pids = {"server": peer.pids, "moto": self.moto_pids}
        if cold_first:
            self.run_epoch(peer.name, "cold", lean, pids, before=peer.cold)
        self.run_epoch(peer.name, "hot", lean, pids)

    # -- workload 5 -----------------------------------------------------------------

    def wrk_all(self, by_name: dict[str, Peer]) -> None:
        """wrk against one hot small object of tierstore and every peer."""
        args = self.args
        try:
            binary = ensure_wrk()
        except (OSError, RuntimeError) as exc:
            self.results["skipped"]["wrk"] = str(exc)
            log(f"[wrk] left out: {exc}")
            return
        key = self.keys[0]
        targets: list[tuple[str, str, Callable[[], list[int]]]] = [
            ("tierstore", presigned_get(self.gw.endpoint, BUCKET, key), self.gw_pids)]
        for name in ("nginx-local", "nginx-cache", "rclone", "juicefs"):
            if (peer := by_name.get(name)) is not None:
                url = (presigned_get(peer.endpoint, BUCKET, key) if peer.signed
                       else f"{peer.endpoint}/{BUCKET}/{key}")
                targets.append((name, url, peer.pids))
        for name, url, pids in targets:
            try:
                figures = server_efficiency(binary, url, args.size, args.wrk_seconds,
                                            args.wrk_connections, {"server": pids})
            except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
                self.results["skipped"][f"wrk {name}"] = str(exc)
                log(f"[wrk] {name} left out: {exc}")
                continue
            self.results["wrk"].append({"config": name, "state": "hot"} | figures)
            log(f"[wrk] {name}: {figures['requests_per_s']:,.0f} requests/s, p99 "
                f"{figures['p99_ms']:.1f} ms, server {figures['server_cores']:.2f} cores busy")

    # -- workload 2 -----------------------------------------------------------------

    def large_reads(self, name: str, lean, make_cold: Callable[[], None] | None) -> None:  # type: ignore[no-untyped-def]
        """Whole GET and ranged GETs, each cold then hot (or once, for a
        server without a cache: ``make_cold`` None)."""
        args = self.args
        ranges = random_ranges(len(self.large), args.ranges, args.range_kib * KiB)
        states = ["cold", "hot"] if make_cold else ["direct" if name == self.direct else "local"]
        whole: dict[str, dict] = {}
        ranged: dict[str, dict] = {}
        for n, state in enumerate(states):
            if make_cold and n == 0:
                make_cold()
            whole[state] = whole_get(lean, BUCKET, LARGE_KEY, len(self.large))
        for n, state in enumerate(states):
            if make_cold and n == 0:
                make_cold()
            ranged[state] = ranged_gets(lean, BUCKET, LARGE_KEY, ranges, args.range_readers,
                                        expect=lambda s, e: self.large[s:e + 1])
        for state in states:
            self.results["large"].append({"config": name, "state": state, "whole": whole[state],
                                          "ranged": ranged[state]})
            log(f"[large] {name} ({state}): whole {whole[state]['mib_per_s']:,.0f} MiB/s, ranged "
                f"{ranged[state]['mib_per_s']:,.0f} MiB/s, p99 {ranged[state]['p99_ms']:.0f} ms")


def run(args: argparse.Namespace) -> dict:
    with contextlib.ExitStack() as stack:
        r = Run(args, stack)
        skipped = r.results["skipped"]
        tmp = r.tmp
        juicefs = None
        if "juicefs" not in args.skip:
            juicefs = start_peer(named("juicefs", lambda: JuiceFS(tmp / "juicefs", r.proxy.endpoint,
                                                                  JFS_BUCKET)), stack, skipped)
        root = r.write_everything(juicefs)
        peers: list[Peer] = []
        makers = {
            "nginx-local": lambda: NginxLocal(tmp / "nginx-local", root, args.nginx_workers),
            "nginx-cache": lambda: NginxCache(tmp / "nginx-cache", r.proxy.port, args.nginx_workers),
            "rclone": lambda: Rclone(tmp / "rclone", r.proxy.endpoint),
        }
        for name, make in makers.items():
            if name not in args.skip and (peer := start_peer(named(name, make), stack, skipped)):
                peers.append(peer)
        by_name = {p.name: p for p in peers} | ({"juicefs": juicefs} if juicefs else {})

        listed = [("tierstore", r.gw.port), (r.direct, r.proxy.port)]
        listed += [(n, by_name[n].port) for n in ("rclone", "juicefs") if n in by_name]
        r.list_all(listed)

        if "nginx-local" in by_name:
            r.run_epoch("nginx-local", "local", SignedClient(by_name["nginx-local"].port),
                        {"server": by_name["nginx-local"].pids})
        r.run_epoch(r.direct, "direct", SignedClient(r.proxy.port), {"server": r.moto_pids})
        r.epochs_tierstore()
        for name in ("nginx-cache", "rclone", "juicefs"):
            if name in by_name:
                r.epochs_peer(by_name[name])
        if "wrk" not in args.skip:  # while everything is hot
            r.wrk_all(by_name)

        if "nginx-local" in by_name:
            r.large_reads("nginx-local", SignedClient(by_name["nginx-local"].port), None)
        r.large_reads(r.direct, SignedClient(r.proxy.port), None)
        r.large_reads("tierstore", SignedClient(r.gw.port), r.evict)
        for name in ("nginx-cache", "rclone", "juicefs"):
            if name in by_name:
                peer = by_name[name]
                r.large_reads(name, SignedClient(peer.port), peer.cold)
        return r.results


# -- report -----------------------------------------------------------------------------


def _ratio(value: float | None, base: float | None) -> str:
    if not value or not base:
        return ""
    return f"{value / base:.2f}x"


def _tierstore_match(rows: list[dict], state: str, value: Callable[[dict], float]) -> float | None:
    """tierstore's figure in the state comparable to ``state``: cold for
    cold and direct (no cache), hot for hot and local."""
    want = {"direct": "cold", "local": "hot"}.get(state, state)
    for row in rows:
        if row["config"] == "tierstore" and row.get("state") == want:
            return value(row)
    return None


def _base(rows: list[dict], config: str, value: Callable[[dict], float]) -> float | None:
    return next((value(row) for row in rows if row["config"] == config), None)


def report_epoch(rows: list[dict]) -> list[str]:
    ops = (lambda row: row["objects_per_s"])
    local = _base(rows, "nginx-local", ops)
    out = []
    for row in rows:
        out.append([
            row["config"], row["state"], f"{row['objects_per_s']:,.0f}", f"{row['mib_per_s']:,.1f}",
            f"{row['p50_ms']:.1f}", f"{row['p99_ms']:.1f}", f"{row['server_cpu_per_1k']:.2f}",
            f"{row['moto_cpu_per_1k']:.2f}" if "moto_cpu_per_1k" in row else "",
            f"{row['store_gets']:,}", _ratio(row["objects_per_s"], local),
            _ratio(_tierstore_match(rows, row["state"], ops), row["objects_per_s"]),
        ])
    return [table(["config", "state", "objects/s", "MiB/s", "p50 ms", "p99 ms",
                   "server CPU s / 1k GETs", "store CPU s / 1k GETs", "GETs to the store",
                   "x nginx-local", "tierstore / this"], out)]


def report_large(rows: list[dict]) -> list[str]:
    rng = (lambda row: row["ranged"]["mib_per_s"])
    local = _base(rows, "nginx-local", rng)
    out = []
    for row in rows:
        whole, ranged = row["whole"], row["ranged"]
        out.append([
            row["config"], row["state"], f"{whole['mib_per_s']:,.0f}", f"{ranged['mib_per_s']:,.0f}",
            f"{ranged['p50_ms']:.1f}", f"{ranged['p99_ms']:.1f}", _ratio(rng(row), local),
            _ratio(_tierstore_match(rows, row["state"], rng), rng(row)),
        ])
    odd = sorted({row["config"] for row in rows if row["ranged"].get("answered_200")})
    notes = ([f"Ranged GETs answered 200 (not 206) with just the range: {', '.join(odd)}.", ""]
             if odd else [])
    return notes + [table(["config", "state", "whole GET MiB/s", "ranged GETs MiB/s", "ranged p50 ms",
                   "ranged p99 ms", "ranged x nginx-local", "tierstore / this (ranged)"], out)]


def report_ingest(rows: list[dict], objects: int, direct_name: str) -> list[str]:
    ops = (lambda row: row["objects_per_s"])
    direct = _base(rows, direct_name, ops)
    ours = _base(rows, "tierstore", ops)
    out = []
    for row in rows:
        out.append([
            row["config"], f"{row['objects_per_s']:,.0f}", f"{row['mib_per_s']:,.1f}",
            f"{row['server_cpu_s'] * 1000 / objects:.2f}",
            f"{row['store_requests'] * 500 / objects:,.1f}", _ratio(row["objects_per_s"], direct),
            _ratio(ours, row["objects_per_s"]),
        ])
    return [table(["config", "objects/s", "MiB/s", "server CPU s / 1k PUTs",
                   "store requests / 500 objects", f"x {direct_name}", "tierstore / this"], out)]


def report_listing(rows: list[dict]) -> list[str]:
    ours = _base(rows, "tierstore", lambda row: row["keys_per_s"])
    out = [[row["config"], f"{row['keys_per_s']:,.0f}", row["pages"], f"{row['wall_s']:.2f}",
            ", ".join(f"{op} {n:,}" for op, n in sorted(row["store_requests"].items())),
            _ratio(ours, row["keys_per_s"])] for row in rows]
    return [table(["config", "keys/s", "pages", "seconds", "requests to the store",
                   "tierstore / this"], out)]


def report_wrk(rows: list[dict], workers: int) -> list[str]:
    rps = (lambda row: row["requests_per_s"])
    local = _base(rows, "nginx-local", rps)
    out = [[row["config"], f"{row['requests_per_s']:,.0f}", f"{row['p50_ms']:.2f}",
            f"{row['p99_ms']:.2f}", f"{row['server_cpu_per_1k']:.3f}", f"{row['server_cores']:.2f}",
            f"{row['wrk_cores']:.2f}", f"{row['non_2xx'] + row['socket_errors']:,}",
            _ratio(row["requests_per_s"], local)] for row in rows]
    notes = []
    nginx = next((row for row in rows if row["config"] == "nginx-local"), None)
    if nginx is not None:
        busy = nginx["server_cores"] / workers
        verdict = ("saturated: wrk drives it to its limit" if busy >= 0.9
                   else "not saturated: the load generator or the machine is the limit")
        notes = [f"nginx-local: {nginx['requests_per_s']:,.0f} requests/s with "
                 f"{nginx['server_cores']:.2f} cores busy for worker_processes {workers} "
                 f"({busy:.0%} of its workers): {verdict}.", ""]
    return notes + [table(["config", "requests/s", "p50 ms", "p99 ms", "server CPU s / 1k requests",
                           "server cores busy", "wrk cores busy", "errors", "x nginx-local"], out)]


def report(args: argparse.Namespace, r: dict) -> str:
    d = r["delay"]
    lines = [
        "## Side by side: nginx, nginx cache, rclone, JuiceFS",
        "",
        f"Machine: {machine()}",
        "",
        f"Capacity store: {args.store} behind the delay proxy, +{args.latency_ms:g} ms a request "
        f"(measured: HEAD p50 {d['direct_ms']:.2f} ms direct, {d['proxied_ms']:.2f} ms through "
        f"the proxy, +{d['added_ms']:.1f} ms). {args.objects:,} objects of {args.size // KiB} KiB, "
        f"{args.readers} readers, {args.writers} writers; large object {args.large_mib} MiB, "
        f"{args.ranges} ranges of {args.range_kib // KiB} MiB from {args.range_readers} threads; "
        f"nginx worker_processes {args.nginx_workers}.",
        "",
    ]
    for name, why in r["skipped"].items():
        lines += [f"Left out: {name}: {why}", ""]
    lines += [f"### 1. Small-object epoch ({args.objects:,} x {args.size // KiB} KiB, shuffled, "
              f"{args.readers} readers)", ""]
    lines += report_epoch(r["epoch"]) + [""]
    lines += [f"### 2. Large object ({args.large_mib} MiB): whole GET, {args.ranges} random "
              f"{args.range_kib // KiB} MiB ranges", ""]
    lines += report_large(r["large"]) + [""]
    lines += [f"### 3. Ingest ({args.objects:,} PUTs of {args.size // KiB} KiB, {args.writers} "
              "threads)", "",
              "tierstore's store requests include its flush of the small objects "
              f"(segments in the store after it: {r.get('segments', '?')}).", ""]
    lines += report_ingest(r["ingest"], args.objects, r["direct"]) + [""]
    lines += [f"### 4. Listing ({args.objects:,} keys, ListObjectsV2 pages of 1,000)", ""]
    lines += report_listing(r["listing"]) + [""]
    if r["wrk"]:
        lines += [f"### 5. Server efficiency (wrk -t2 -c{args.wrk_connections} -d{args.wrk_seconds}s, "
                  f"one hot {args.size // KiB} KiB object, presigned GETs to the S3 servers)", ""]
        lines += report_wrk(r["wrk"], args.nginx_workers) + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 objects and a 64 MiB large object")
    ap.add_argument("--objects", type=int, help="small objects (default 4000; --quick 1000)")
    ap.add_argument("--size", type=int, default=64 * KiB, help="small object bytes (default 65536)")
    ap.add_argument("--large-mib", type=int, help="large object MiB (default 256; --quick 64)")
    ap.add_argument("--ranges", type=int, default=64, help="ranged GETs of the large object (64)")
    ap.add_argument("--range-kib", type=int, default=4096, help="bytes per ranged GET, KiB (4096)")
    ap.add_argument("--range-readers", type=int, default=4, help="threads of ranged GETs (4)")
    ap.add_argument("--readers", type=int, default=16, choices=range(8, 33), metavar="8-32",
                    help="reader threads of the epochs, a lean client each (16)")
    ap.add_argument("--writers", type=int, default=16, help="PUT threads (16)")
    ap.add_argument("--latency-ms", type=float, default=20.0,
                    help="added to each request to the capacity store, half each way (20)")
    ap.add_argument("--workers", type=int, default=1,
                    help="tierstore's --workers: processes serving S3 (1)")
    ap.add_argument("--nginx-workers", type=int,
                    help="nginx worker_processes (default: --workers, as many processes as tierstore runs)")
    ap.add_argument("--skip", action="append", default=[],
                    choices=["nginx-local", "nginx-cache", "rclone", "juicefs", "wrk"],
                    help="leave a peer, or the wrk workload, out (repeatable)")
    ap.add_argument("--wrk-seconds", type=int, default=10, help="wrk's run per server, seconds (10)")
    ap.add_argument("--wrk-connections", type=int, default=16, help="wrk's connections (16)")
    ap.add_argument("--fs", choices=("root", "ext4"), default="root",
                    help="every server's files (the gateway's data dir, the caches, nginx's root) in the temp "
                         "dir (root, default) or on an ext4 made for the run (a loop image: root only)")
    ap.add_argument("--store", choices=("moto", "rclone"), default="moto",
                    help="the capacity store: moto (default) or rclone serve s3 of a directory")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    if args.store == "rclone":  # nginx-cache reads the store unsigned, JuiceFS formats a volume in it
        args.skip = sorted({*args.skip, "nginx-cache", "juicefs"})
    args.objects = args.objects or (1000 if args.quick else 4000)
    args.large_mib = args.large_mib or (64 if args.quick else 256)
    args.nginx_workers = args.nginx_workers or args.workers
    _common.begin()
    results = run(args)
    print(report(args, results))
    write_results(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
