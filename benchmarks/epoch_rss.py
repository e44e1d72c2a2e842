"""The gateway's memory across a long loop of training epochs.

One moto S3 server behind ``delay_proxy.py`` (``--latency-ms``, 20) is the
capacity store. ``--objects`` (4,000) objects of 64 KiB are written through
the gateway, flushed and evicted; the gateway's hot tier (``--hot-size``,
half the data set by default) holds about half of them, so every epoch both
hits and misses: it fetches, fills the cache and evicts. Then, for
``--minutes`` (10), epoch after epoch reads every object once in a new
shuffled order (``gateway.client.order.shuffled`` with the epoch's number as seed)
from ``--readers`` (16) threads, each a lean signed client on one keep-alive
connection; every body is checked against the object's MD5.

The gateway's VmRSS is read from /proc every 2 s. The verdict is the soak's
(``_soak_measure``): the slope of the RSS floor (the lowest sample of each
10 s) over the second half of the loop must stay under 10 MiB/min; the
report also gives RSS at each quarter, the peak (VmHWM), and per epoch its
time, objects/s and hit ratio.

Run:  .venv/bin/python benchmarks/epoch_rss.py [--minutes 10] [--objects 4000]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _common  # first: puts the repo root on sys.path
from _common import client, gateway, machine, table, temp_dir, write_results
from _compare_client import SignedClient
from _moto import delayed_moto, s3_capacity_args
from _soak_measure import MAX_RSS_SLOPE, Sampler, proc_status, rss_figures
from capacity import KiB, MiB, admin, log

from gateway.client.order import shuffled

BUCKET = "epochs"
SAMPLE_EVERY = 2.0


def write_data_set(gw: _common.Gateway, objects: int, size: int, readers: int) -> dict[str, str]:
    """Every object PUT once, by ``readers`` threads; key -> MD5 of its bytes."""
    client(gw.endpoint).create_bucket(Bucket=BUCKET)
    signed = SignedClient(gw.port)
    rng = random.Random(7)
    blobs = {f"train/{i:06d}.bin": rng.randbytes(size) for i in range(objects)}

    def put(item: tuple[str, bytes]) -> None:
        status = signed.put(BUCKET, *item)
        if status != 200:
            raise RuntimeError(f"PUT {item[0]}: HTTP {status}")

    with ThreadPoolExecutor(readers) as pool:
        list(pool.map(put, blobs.items()))
    return {key: hashlib.md5(data).hexdigest() for key, data in blobs.items()}


def one_epoch(reader: SignedClient, order: list[str], digests: dict[str, str], readers: int) -> None:
    def read(slot: int) -> None:
        for key in order[slot::readers]:
            status, body = reader.get(BUCKET, key)
            if status != 200 or hashlib.md5(body).hexdigest() != digests[key]:
                raise RuntimeError(f"GET {key}: HTTP {status}, {len(body)} bytes, wrong or missing")

    with ThreadPoolExecutor(readers) as pool:
        list(pool.map(read, range(readers)))


def run(args: argparse.Namespace) -> dict:
    with delayed_moto(args.latency_ms) as store, temp_dir("epoch-rss") as tmp:
        extra = (*s3_capacity_args(store.proxy.endpoint), "--hot-size", str(args.hot_size))
        with gateway(tmp / "data", extra_args=extra) as gw:
            log(f"[fill] {args.objects:,} objects of {args.size // KiB} KiB ...")
            digests = write_data_set(gw, args.objects, args.size, args.readers)
            admin(gw, "POST", "/jobs/flush", wait="true")
            admin(gw, "POST", "/jobs/evict", wait="true")
            rss_start = proc_status(gw.proc.pid)["VmRSS"]
            stop = threading.Event()
            t0 = time.perf_counter()

            def probe() -> dict:
                if gw.proc.poll() is not None:
                    raise RuntimeError(f"the gateway exited with status {gw.proc.returncode}")
                return {"rss_kib": proc_status(gw.proc.pid)["VmRSS"]}

            sampler = Sampler(probe, SAMPLE_EVERY, t0, stop)
            sampler.start()
            reader = SignedClient(gw.port)
            epochs: list[dict] = []
            try:
                while time.perf_counter() - t0 < args.minutes * 60 and not stop.is_set():
                    before = admin(gw, "GET", "/tiers")
                    start = time.perf_counter()
                    one_epoch(reader, shuffled(digests, len(epochs)), digests, args.readers)
                    seconds = time.perf_counter() - start
                    after = admin(gw, "GET", "/tiers")
                    hits = after["cache_hits"] - before["cache_hits"]
                    misses = after["cache_misses"] - before["cache_misses"]
                    epochs.append({"seconds": seconds, "objects_per_s": args.objects / seconds,
                                   "hit_ratio": hits / max(1, hits + misses)})
                    log(f"[epoch {len(epochs)}] {seconds:.1f} s, {args.objects / seconds:,.0f} objects/s, "
                        f"hits {epochs[-1]['hit_ratio']:.2f}, RSS {probe()['rss_kib'] / KiB:.0f} MiB")
            finally:
                sampler.finish()
            loop_s = time.perf_counter() - t0
            hwm = proc_status(gw.proc.pid)["VmHWM"]
    if sampler.failure:
        raise RuntimeError(sampler.failure)
    return {"objects": args.objects, "size": args.size, "readers": args.readers, "hot_size": args.hot_size,
            "latency_ms": args.latency_ms, "loop_s": loop_s, "rss_start_mib": rss_start / KiB,
            "epochs": epochs, "rss": rss_figures(sampler.samples, loop_s, hwm), "samples": sampler.samples}


def report(r: dict) -> str:
    rss = r["rss"]
    slope = rss["slope_mib_per_min"]
    verdict = "flat" if slope is not None and slope < MAX_RSS_SLOPE else "NOT flat"
    quarters = " / ".join(f"{rss['at'][q]:.0f}" for q in ("25", "50", "75", "100"))
    per_epoch = [e["objects_per_s"] for e in r["epochs"]]
    lines = [
        "# Gateway memory across an epoch loop",
        "",
        machine(),
        "",
        f"{r['objects']:,} objects of {r['size'] // KiB} KiB, hot tier {r['hot_size'] / MiB:.0f} MiB, "
        f"{r['readers']} readers, store +{r['latency_ms']:g} ms; {len(r['epochs'])} epochs in "
        f"{r['loop_s'] / 60:.1f} min, {min(per_epoch):,.0f} to {max(per_epoch):,.0f} objects/s, "
        f"hit ratio {min(e['hit_ratio'] for e in r['epochs']):.2f} to "
        f"{max(e['hit_ratio'] for e in r['epochs']):.2f}",
        "",
        table(["RSS, MiB", "value"], [
            ["after the fill, evicted", f"{r['rss_start_mib']:.0f}"],
            ["25 / 50 / 75 / 100 % of the loop", quarters],
            ["peak (VmHWM)", f"{rss['peak_mib']:.0f}"],
            ["slope of the 10 s floor, second half", f"{slope:+.1f} MiB/min ({verdict}; limit {MAX_RSS_SLOPE:g})"
             if slope is not None else "too few samples"],
        ]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the epoch loop (10)")
    ap.add_argument("--objects", type=int, default=4000, help="objects in the data set (4000)")
    ap.add_argument("--size", type=int, default=64 * KiB, help="bytes per object (65536)")
    ap.add_argument("--hot-size", type=int, help="the gateway's --hot-size in bytes (default: half the data set)")
    ap.add_argument("--readers", type=int, default=16, help="reader threads (16)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="added to each capacity request (20)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    args.hot_size = args.hot_size or args.objects * args.size // 2
    _common.begin()
    results = run(args)
    print(report(results))
    write_results(args, results)
    rss_slope = results["rss"]["slope_mib_per_min"]
    return 0 if rss_slope is not None and rss_slope < MAX_RSS_SLOPE else 1


if __name__ == "__main__":
    sys.exit(main())
