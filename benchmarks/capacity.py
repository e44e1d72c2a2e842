"""The capacity tier: requests per object, bytes stored, and cold reads.

Three measurements, each on fresh servers (127.0.0.1, free ports):

  puts         ``--objects`` objects of ``--size`` bytes (10,000 of 64 KiB),
               PUT through the gateway by 16 threads, then ``POST /flush``:
               how many write requests (PUT and POST) the capacity store saw,
               counted by a proxy in front of it (moto's S3 server), and how
               many segments carried them. Target: at most 20 for 10,000.
  compression  ``--dataset-size`` bytes (64 MiB) of objects of 64 KiB..1 MiB,
               once compressible text (JSON lines and CSV), once random
               bytes, written through the gateway into a local-directory
               capacity store and flushed: bytes in segment files against
               bytes written by the clients.
  cold         one ``--large-size`` object (1 GiB) PUT through the gateway
               and flushed to moto, with ~20 ms of round trip added in front
               of moto (``--delay-ms`` each way). The object is made cold
               (gateway stopped, its hot-tier cache emptied, started again),
               then read whole through the gateway, read again (warm), and
               its segment read straight from moto with one plain GET through
               the same proxy. Three rounds, alternating; medians reported.
               Target: the cold read at least 4x the single stream.

moto runs as its own process, with one change: its ranged GET reads the
requested range only (stock moto 5 reads the whole object for every ranged
GET, about 1 s of CPU per request on a 1 GiB segment here, which real S3
stores do not do). See ``_moto.serve_moto``.

Run:  .venv/bin/python benchmarks/capacity.py [--quick] [--part puts|compression|cold|all]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _common  # first: puts the repo root on sys.path
import httpx
import zstandard
from _common import client, machine, process_cpu, table, temp_dir, write_results
from _moto import CAPACITY_BUCKET, moto_client, moto_store, s3_capacity_args
from delay_proxy import DelayProxy

from tests.servers import ADMIN_TOKEN, Gateway

KiB, MiB, GiB = 1024, 1024**2, 1024**3
DATA_BUCKET = "data"  # in the gateway: the benchmark's objects
READ_BLOCK = 8 * MiB  # client reads of a large body


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the gateway ----------------------------------------------------------------


@contextlib.contextmanager
def gateway(data_dir: Path, extra_args: list[str]) -> Iterator[Gateway]:
    """A gateway subprocess on ``data_dir``, stopped (by its PID) afterwards."""
    gw = Gateway(data_dir, extra_args=extra_args)
    try:
        yield gw.start()
    finally:
        gw.stop()


def admin(gw: Gateway, method: str, path: str, **params: str) -> dict:
    response = httpx.request(
        method, f"{gw.admin_url}{path}", timeout=1800, params=params,
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    response.raise_for_status()
    return response.json()


def flush(gw: Gateway) -> float:
    """A flush job, waited for; its wall time."""
    t0 = time.perf_counter()
    admin(gw, "POST", "/jobs/flush", wait="true")
    status = admin(gw, "GET", "/tiers")
    if status.get("flush_queue") or status.get("last_flush_error"):
        raise RuntimeError(f"flush left work behind: {status}")
    return time.perf_counter() - t0


def make_cold(gw: Gateway) -> None:
    """Stop the gateway, empty its hot-tier cache (the files under
    ``hot/cache/??/``), start it again on the same data directory: every
    flushed object is then in the capacity store only."""
    gw.stop()
    for sub in (gw.data_dir / "hot" / "cache").iterdir():
        for entry in sub.iterdir():
            entry.unlink()
    gw.start()


def put_all(endpoint: str, count: int, body: Callable[[int], bytes], threads: int = 16) -> float:
    """PUT objects 0..count-1 (``body(i)``) into ``DATA_BUCKET`` from
    ``threads`` threads, one boto3 client each; the wall time."""
    local = threading.local()

    def put(i: int) -> None:
        if not hasattr(local, "s3"):
            local.s3 = client(endpoint, max_pool=2)
        local.s3.put_object(Bucket=DATA_BUCKET, Key=f"obj/{i:08d}", Body=body(i))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(put, range(count)):
            pass
    return time.perf_counter() - t0


def segment_sizes(moto_endpoint: str) -> dict[str, int]:
    """Every segment object in moto (read directly, not through the proxy)."""
    pages = moto_client(moto_endpoint).get_paginator("list_objects_v2").paginate(
        Bucket=CAPACITY_BUCKET, Prefix="segments/")
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", ())}


# -- 1. capacity PUTs per object ------------------------------------------------


def bench_puts(args: argparse.Namespace) -> dict:
    """Small objects through the gateway, flushed: the capacity store's
    write requests, counted by a proxy without delay in front of moto."""
    extra = ["--flush-delay", str(args.flush_delay)] if args.flush_delay is not None else []
    with (moto_store() as (moto_port, moto_pid), DelayProxy(moto_port) as proxy,
          temp_dir("capacity-puts") as tmp,
          gateway(tmp / "data", s3_capacity_args(proxy.endpoint) + extra) as gw):
        startup = proxy.snapshot()
        proxy.reset()
        config = admin(gw, "GET", "/config")
        s3 = client(gw.endpoint)
        s3.create_bucket(Bucket=DATA_BUCKET)
        log(f"[puts] {args.objects:,} objects of {args.size:,} bytes ...")
        put_s = put_all(gw.endpoint, args.objects,
                        lambda i: random.Random(i).randbytes(args.size))
        during_puts = proxy.snapshot()
        flush_s = flush(gw)
        seen = proxy.snapshot()
        tiers = admin(gw, "GET", "/tiers")
        sizes = segment_sizes(f"http://127.0.0.1:{moto_port}")
    methods = seen["methods"]
    writes = methods.get("PUT", 0) + methods.get("POST", 0)
    return {
        "objects": args.objects, "size": args.size, "put_s": put_s, "flush_s": flush_s,
        "flush_delay": config["flush_delay"], "segment_size": config["segment_size"],
        "writes": writes, "writes_per_object": writes / args.objects,
        "writes_during_puts": during_puts["methods"].get("PUT", 0)
        + during_puts["methods"].get("POST", 0),
        "methods": methods, "operations": seen["operations"],
        "bytes_to_store": seen["bytes"]["up"],
        "segments_written": tiers["segments_written"], "segments": tiers["segments"],
        "segment_sizes": sizes,
        "capacity_bytes": tiers["capacity_bytes"],
        "startup_requests": startup["operations"],
    }


# -- 2. stored bytes against raw bytes --------------------------------------------

_SPLITS = ("train", "valid", "test")
_LABELS = ("cat", "dog", "car", "tree", "person", "boat", "bird")
_NOTES = ("crop", "resize", "flip", "ok", "retry", "none")
_SIDES = (224, 256, 384, 480, 512, 640)


def text_object(rng: random.Random, size: int, csv: bool) -> bytes:
    """``size`` bytes of JSON lines or CSV rows shaped like training metadata
    (ids, paths, labels, scores, sizes, timestamps), drawn from ``rng``."""
    lines = ["id,split,path,label,score,width,height,ts"] if csv else []
    length = sum(len(line) + 1 for line in lines)
    while length < size:
        n = rng.randrange(10**8)
        split, label = rng.choice(_SPLITS), rng.choice(_LABELS)
        path = f"s3://datasets/{split}/shard-{n % 1000:05d}/{n:09d}.jpg"
        score, width, height = rng.random(), rng.choice(_SIDES), rng.choice(_SIDES)
        ts = (f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
              f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z")
        if csv:
            line = f"{n},{split},{path},{label},{score:.6f},{width},{height},{ts}"
        else:
            line = json.dumps({"id": n, "split": split, "path": path, "label": label,
                               "score": round(score, 6), "width": width, "height": height,
                               "ts": ts, "note": rng.choice(_NOTES)})
        lines.append(line)
        length += len(line) + 1
    return ("\n".join(lines) + "\n").encode()[:size]


def object_sizes(total: int, seed: int = 7) -> list[int]:
    """Sizes between 64 KiB and 1 MiB adding up to ``total`` (the last one
    may be smaller)."""
    rng, sizes = random.Random(seed), []
    while sum(sizes) < total:
        sizes.append(min(rng.randint(64 * KiB, MiB), total - sum(sizes)))
    return sizes


def dataset(kind: str, total: int) -> list[bytes]:
    """The objects of dataset ``kind``: "text" (JSON lines and CSV, in
    turns) or "random" bytes; the same every run."""
    rng = random.Random(kind)
    sizes = object_sizes(total)
    if kind == "text":
        return [text_object(rng, size, csv=i % 2 == 1) for i, size in enumerate(sizes)]
    return [rng.randbytes(size) for size in sizes]


def segment_bytes(capacity_dir: Path) -> tuple[int, int]:
    """(files, bytes) under the local capacity store's ``segments/``."""
    files = [p for p in (capacity_dir / "segments").rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def bench_compression(args: argparse.Namespace) -> dict:
    """Each dataset through a fresh gateway into a fresh local-directory
    capacity store: segment bytes on disk against bytes written."""
    out = {}
    for kind in ("text", "random"):
        objects = dataset(kind, args.dataset_size)
        raw = sum(len(o) for o in objects)
        zstd = zstandard.ZstdCompressor(level=3)
        alone = sum(min(len(zstd.compress(o)), len(o)) for o in objects)
        with temp_dir(f"capacity-{kind}") as tmp:
            store = tmp / "capacity"
            with gateway(tmp / "data", ["--capacity", store.as_uri()]) as gw:
                client(gw.endpoint).create_bucket(Bucket=DATA_BUCKET)
                log(f"[compression] {kind}: {len(objects)} objects, {raw / MiB:.0f} MiB ...")
                put_s = put_all(gw.endpoint, len(objects), objects.__getitem__)
                flush_s = flush(gw)
                tiers = admin(gw, "GET", "/tiers")
            files, stored = segment_bytes(store)
        out[kind] = {
            "objects": len(objects), "raw_bytes": raw, "stored_bytes": stored,
            "ratio": stored / raw, "segments": files, "zstd3_per_object_bytes": alone,
            "capacity_bytes_index": tiers["capacity_bytes"], "put_s": put_s, "flush_s": flush_s,
        }
    return out


# -- 3. cold read of a large object ---------------------------------------------------


def timed_read(s3, bucket: str, key: str) -> dict:  # type: ignore[no-untyped-def]
    """GET the whole object, reading the body ``READ_BLOCK`` at a time and
    hashing it: seconds, bytes, md5."""
    t0 = time.perf_counter()
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    digest, size = hashlib.md5(), 0
    while block := body.read(READ_BLOCK):
        digest.update(block)
        size += len(block)
    return {"s": time.perf_counter() - t0, "bytes": size, "md5": digest.hexdigest()}


class CpuMeter:
    """CPU seconds used by the gateway, moto and this process over a block."""

    def __init__(self, pids: dict[str, Callable[[], int]]) -> None:
        self._pids = pids

    @contextlib.contextmanager
    def measure(self, into: dict) -> Iterator[None]:
        before = {name: process_cpu(pid()) for name, pid in self._pids.items()}
        client0 = time.process_time()
        yield
        for name, pid in self._pids.items():
            into[f"{name}_cpu_s"] = process_cpu(pid()) - before[name]
        into["client_cpu_s"] = time.process_time() - client0


def upload_large(gw: Gateway, size: int) -> tuple[str, float, float]:
    """PUT ``size`` random bytes as one object and flush it: (md5, PUT s,
    flush s). A single PUT, so the object is one segment of its own."""
    body = os.urandom(size)
    md5 = hashlib.md5(body).hexdigest()
    t0 = time.perf_counter()
    client(gw.endpoint).put_object(Bucket=DATA_BUCKET, Key="large.bin", Body=body)
    put_s = time.perf_counter() - t0
    del body
    return md5, put_s, flush(gw)


def largest_segment(moto_endpoint: str) -> tuple[str, int]:
    """(name, size) of the largest segment object in moto."""
    sizes = segment_sizes(moto_endpoint)
    name = max(sizes, key=sizes.__getitem__)
    return name, sizes[name]


def bench_cold(args: argparse.Namespace) -> dict:
    """The large object cold through the gateway, warm through the gateway,
    and its segment in one GET from moto, all through the delaying proxy."""
    window = int(args.window_kib * KiB) or None
    with (moto_store() as (moto_port, moto_pid), DelayProxy(moto_port, window=window) as proxy,
          temp_dir("capacity-cold") as tmp,
          gateway(tmp / "data", s3_capacity_args(proxy.endpoint)) as gw):
        client(gw.endpoint).create_bucket(Bucket=DATA_BUCKET)
        log(f"[cold] PUT and flush of {args.large_size / MiB:,.0f} MiB ...")
        md5, put_s, flush_s = upload_large(gw, args.large_size)
        segment, segment_size = largest_segment(f"http://127.0.0.1:{moto_port}")
        proxy.delay_s = args.delay_ms / 1000
        direct = moto_client(proxy.endpoint)
        meter = CpuMeter({"gateway": lambda: gw.proc.pid, "moto": lambda: moto_pid})
        runs: dict[str, list[dict]] = {"cold": [], "warm": [], "direct": []}

        def gateway_reads() -> None:
            make_cold(gw)
            s3 = client(gw.endpoint)
            for kind in ("cold", "warm"):
                proxy.reset()
                run: dict = {}
                with meter.measure(run):
                    run.update(timed_read(s3, DATA_BUCKET, "large.bin"))
                run["store_gets"] = proxy.snapshot()["operations"].get("GetObject", 0)
                if run["bytes"] != args.large_size or run["md5"] != md5:
                    raise AssertionError(f"{kind} read returned other bytes: {run}")
                runs[kind].append(run)

        def direct_read() -> None:
            proxy.reset()
            run: dict = {}
            with meter.measure(run):
                run.update(timed_read(direct, CAPACITY_BUCKET, segment))
            run["store_gets"] = proxy.snapshot()["operations"].get("GetObject", 0)
            if run["bytes"] != segment_size:
                raise AssertionError(f"segment read: {run['bytes']} of {segment_size} bytes")
            runs["direct"].append(run)

        for round_ in range(args.rounds):
            steps = (gateway_reads, direct_read)
            for step in steps if round_ % 2 == 0 else reversed(steps):
                step()
            log(f"[cold] round {round_ + 1}: " + ", ".join(
                f"{kind} {r[-1]['s']:.2f} s" for kind, r in runs.items()))
        tiers = admin(gw, "GET", "/tiers")
    if len({r["md5"] for r in runs["direct"]}) != 1:
        raise AssertionError("the segment read back differently between rounds")
    return {
        "size": args.large_size, "segment_bytes": segment_size, "delay_ms": args.delay_ms,
        "window_kib": args.window_kib, "put_s": put_s, "flush_s": flush_s, "runs": runs,
        "median_s": {kind: statistics.median(r["s"] for r in rs) for kind, rs in runs.items()},
        "cache_misses": tiers["cache_misses"],
    }


# -- report --------------------------------------------------------------------------


def report_puts(r: dict) -> str:
    sizes = sorted(r["segment_sizes"].values())
    settings = f"flush delay {r['flush_delay']:g} s, segment size {r['segment_size'] / MiB:g} MiB"
    per_10k = r["writes"] * 10_000 / r["objects"]
    rows = [
        ["objects PUT through the gateway (16 threads)",
         f"{r['objects']:,} x {r['size'] // KiB} KiB in {r['put_s']:.1f} s "
         f"({r['objects'] / r['put_s']:.0f}/s)"],
        ["final `POST /flush`", f"{r['flush_s']:.2f} s"],
        ["**capacity write requests (PUT + POST)**", f"**{r['writes']:,}**"],
        ["... of them sent while the PUTs ran", f"{r['writes_during_puts']:,}"],
        ["... by S3 operation",
         ", ".join(f"{k} {v:,}" for k, v in sorted(r["operations"].items()))],
        ["write requests per object", f"{r['writes_per_object']:.4f}"],
        ["write requests per 10,000 objects (target: at most 20)", f"{per_10k:,.0f}"],
        ["segments written / in the store", f"{r['segments_written']} / {len(sizes)}"],
        ["segment size: min / median / max",
         " / ".join(f"{x / MiB:.1f} MiB" for x in (sizes[0], statistics.median(sizes), sizes[-1]))
         if sizes else "-"],
        ["bytes sent to the store / bytes PUT",
         f"{r['bytes_to_store'] / (r['objects'] * r['size']):.3f}"],
        ["requests at gateway start-up (before the PUTs)",
         ", ".join(f"{k} {v}" for k, v in sorted(r["startup_requests"].items()))],
    ]
    return "\n".join([
        f"### 1. Capacity write requests for {r['objects']:,} small objects ({settings})",
        "",
        table(["", ""], rows),
        "",
    ])


def report_compression(r: dict) -> str:
    rows = []
    for kind, d in r.items():
        name = "text (JSON lines, CSV)" if kind == "text" else "random bytes"
        rows.append([name, f"{d['objects']}", f"{d['raw_bytes'] / MiB:.1f}",
                     f"{d['stored_bytes'] / MiB:.1f}", f"{d['ratio']:.4f}",
                     f"{d['zstd3_per_object_bytes'] / d['raw_bytes']:.4f}", f"{d['segments']}"])
    return "\n".join([
        "### 2. Bytes stored in the capacity tier against bytes written",
        "",
        table(["dataset", "objects", "written MiB", "in segment files MiB", "stored / written",
               "zstd -3 per object, for reference", "segments"], rows),
        "",
    ])


def report_cold(r: dict) -> str:
    size_mib = r["size"] / MiB
    med = r["median_s"]
    rows = []
    labels = {"cold": "gateway, cold (extents fetched from the store)",
              "warm": "gateway, warm (second GET, from the hot tier)",
              "direct": "store, one GET of the segment (single stream)"}
    for kind in ("cold", "warm", "direct"):
        runs = r["runs"][kind]
        mib = (r["segment_bytes"] if kind == "direct" else r["size"]) / MiB
        rows.append([labels[kind], " / ".join(f"{x['s']:.2f}" for x in runs),
                     f"**{med[kind]:.2f}**",
                     f"{mib / med[kind]:.0f}",
                     f"{statistics.median(x.get('gateway_cpu_s', 0) for x in runs):.1f}",
                     f"{statistics.median(x['moto_cpu_s'] for x in runs):.1f}",
                     f"{statistics.median(x['client_cpu_s'] for x in runs):.1f}",
                     str(runs[-1]["store_gets"])])
    ratio = med["direct"] / med["cold"]
    window = f", {r['window_kib']:g} KiB window per connection" if r["window_kib"] else ""
    return "\n".join([
        f"### 3. Reading a {size_mib:,.0f} MiB object, +{r['delay_ms']:g} ms each way"
        f" to the capacity store{window}",
        "",
        table(["read", "runs s", "median s", "MiB/s", "gateway CPU s", "moto CPU s",
               "client CPU s", "store GETs"], rows),
        "",
        f"Cold through the gateway / single stream from the store: **{ratio:.2f}x** the "
        f"throughput (target {'3x with a window' if r['window_kib'] else '1x'}); warm / cold: {med['cold'] / med['warm']:.1f}x. "
        f"Upload: PUT {r['put_s']:.1f} s, flush {r['flush_s']:.1f} s. "
        "Client CPU includes the proxy thread.",
        "",
    ])


PARTS = {"puts": (bench_puts, report_puts),
         "compression": (bench_compression, report_compression),
         "cold": (bench_cold, report_cold)}


def parse_size(text: str) -> int:
    """Bytes from ``123``, ``64K``, ``16M``, ``1G``."""
    units = {"K": KiB, "M": MiB, "G": GiB}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=[*PARTS, "all"], default="all")
    ap.add_argument("--quick", action="store_true",
                    help="1000 objects, 16 MiB datasets, a 256 MiB large object")
    ap.add_argument("--objects", type=int, help="objects for the PUT count (default 10000)")
    ap.add_argument("--size", type=parse_size, default=64 * KiB,
                    help="their size (default 64K)")
    ap.add_argument("--flush-delay", type=float, default=None,
                    help="gateway --flush-delay for the PUT count (default: the gateway's)")
    ap.add_argument("--dataset-size", type=parse_size,
                    help="bytes per compression dataset (default 64M)")
    ap.add_argument("--large-size", type=parse_size, help="the cold-read object (default 1G)")
    ap.add_argument("--delay-ms", type=float, default=10.0,
                    help="delay added each way in front of the store for reads (default 10)")
    ap.add_argument("--window-kib", type=float, default=0,
                    help="cap each proxied connection at this many KiB in flight per "
                         "direction, like a TCP window (default: no cap)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of timed reads (default 3)")
    ap.add_argument("--json", type=Path, help="also write every number as JSON here")
    args = ap.parse_args(argv)
    quick = args.quick
    args.objects = args.objects or (1000 if quick else 10_000)
    args.dataset_size = args.dataset_size or (16 * MiB if quick else 64 * MiB)
    args.large_size = args.large_size or (256 * MiB if quick else GiB)
    _common.begin()

    results, sections = {}, [f"Machine: {machine()}", ""]
    for name, (bench, report) in PARTS.items():
        if args.part in (name, "all"):
            results[name] = bench(args)
            sections.append(report(results[name]))
    print("\n".join(sections))
    write_results(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
