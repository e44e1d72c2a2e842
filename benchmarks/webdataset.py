"""WebDataset shards read epoch by epoch: moto directly, and the gateway
cold, cold with an epoch hint, and warm, with the capacity store
``--latency-ms`` away.

One moto S3 server (``_moto.serve_moto``) sits behind ``delay_proxy.py``,
which adds ``--latency-ms`` (20) to every request, half each way. The data
set is ``--shards`` (48) WebDataset tar files of at most ``--shard-mib`` (8)
MiB, written with ``webdataset.TarWriter``: samples of a ``.bin`` (random
bytes, ``--sample-kib`` (100) KiB on average) and a ``.cls`` (a label). The
shards go straight into moto (``s3://source/shards/``) and through the
gateway into a managed bucket whose capacity store is moto behind the proxy,
which is then flushed and evicted.

An epoch reads every shard once in the gateway's documented shuffle
(``gateway.client.order.shuffled``, which ``gateway.client.hints.shard_epoch`` uses) with
the epoch's seed. ``--readers`` (4) threads each stream their share of the
order, positions r, r + N, ... (what ``split_by_worker`` gives DataLoader
worker r), through ``webdataset.WebDataset``, counting samples and bytes
and checking them against what was written. Every configuration opens its
shards the same way: presigned SigV4 ``http://`` URLs, which WebDataset
hands to ``curl`` (its built-in handler for http and https); only the
endpoint and the keys signing them differ.

  direct          moto through the proxy, no gateway
  cold, no hints  the gateway, hot tier evicted, no epoch registered
  cold, hinted    evicted, the order registered with ``shard_epoch``
                  (readers=N) just before the epoch
  warm            after ``POST /jobs/warm`` of the shard prefix (its time and
                  GETs to moto are reported too)

``--rounds`` (3) rounds of the four, each epoch in a new order; the tables
show medians. GETs to moto are counted by the proxy; hit ratios come from
the gateway's ``/stats`` (shards and bytes served from the hot tier).

Run:  .venv/bin/python benchmarks/webdataset.py [--quick] [--shards 48] [--readers 4]
"""

from __future__ import annotations

import argparse
import importlib
import io
import random
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import _common  # first: puts the repo root on sys.path
import boto3
import httpx
from _common import (
    client,
    gateway,
    machine,
    percentile,
    table,
    temp_dir,
    write_results,
)
from _epoch_workload import Admin, Meter
from _moto import MOTO_KEY, delayed_moto, s3_capacity_args
from botocore.config import Config as BotoConfig

from gateway.client.hints import Hints, shard_epoch
from gateway.client.order import expand, shuffled
from tests.servers import ACCESS_KEY, ADMIN_TOKEN, SECRET_KEY, Gateway


def _import_webdataset() -> ModuleType:
    """The webdataset package, not this script: run as a script, this file's
    directory comes first on sys.path and its name is the package's."""
    here = Path(__file__).resolve().parent
    saved = sys.path[:]
    sys.path[:] = [p for p in saved if Path(p or ".").resolve() != here]
    try:
        return importlib.import_module("webdataset")
    finally:
        sys.path[:] = saved


wds = _import_webdataset()

KiB, MiB = 1024, 1024**2
BUCKET = "train"  # the managed bucket, in the gateway
SOURCE = "source"  # the same shards straight in moto, for `direct`
PREFIX = "shards/"
WRITERS = 8
URL_TTL_S = 3600
CHECK_EVERY = 16  # every 16th sample's bytes are compared, not only their size
TAR_BLOCK, TAR_RECORD = 512, 20 * 512
EPOCH_STATUS = ("state", "consumed", "hits", "misses", "hit_ratio", "prefetched_objects",
                "prefetched_bytes", "lookahead_objects", "lookahead_bytes")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def shard_pattern(shards: int) -> str:
    return f"{PREFIX}train-{{0000..{shards - 1:04d}}}.tar"


# -- the data set -------------------------------------------------------------------


def sample_of(shard: int, index: int, mean_size: int) -> tuple[bytes, bytes]:
    """The ``.bin`` and ``.cls`` of one sample, the same every time."""
    rng = random.Random(f"{shard}/{index}")
    size = rng.randint(mean_size * 3 // 4, mean_size * 5 // 4)
    return rng.randbytes(size), str(rng.randrange(1000)).encode()


def tar_size(sizes: list[int]) -> int:
    """The size of a tar of members of ``sizes``: a header block each, data
    padded to blocks, two zero blocks, the whole padded to a record."""
    members = sum(TAR_BLOCK + -(-size // TAR_BLOCK) * TAR_BLOCK for size in sizes)
    return -(-(members + 2 * TAR_BLOCK) // TAR_RECORD) * TAR_RECORD


def build_shard(shard: int, shard_size: int, mean_size: int) -> tuple[bytes, int, int]:
    """Shard ``shard``: as many samples as fit in ``shard_size`` bytes of
    tar. Returns the tar, its samples and the bytes of their files."""
    samples: list[tuple[bytes, bytes]] = []
    sizes: list[int] = []
    while True:
        data, label = sample_of(shard, len(samples), mean_size)
        if samples and tar_size([*sizes, len(data), len(label)]) > shard_size:
            break
        samples.append((data, label))
        sizes += [len(data), len(label)]
    buffer = io.BytesIO()
    with wds.TarWriter(buffer, encoder=False, mtime=0) as sink:
        for index, (data, label) in enumerate(samples):
            sink.write({"__key__": f"s{shard:04d}_{index:06d}", "bin": data, "cls": label})
    return buffer.getvalue(), len(samples), sum(sizes)


def write_shards(gw_endpoint: str, moto_endpoint: str, keys: list[str],
                 args: argparse.Namespace) -> tuple[float, dict[str, dict]]:
    """Every shard PUT through the gateway (boto3) and straight into moto (an
    unsigned PUT), from ``WRITERS`` threads. Returns the wall time and, per
    key, the shard's bytes, samples and sample bytes."""
    local = threading.local()

    def put(shard: int) -> tuple[str, dict]:
        if not hasattr(local, "s3"):
            local.s3 = client(gw_endpoint, max_pool=2)
            local.http = httpx.Client(base_url=moto_endpoint, timeout=120)
        body, samples, payload = build_shard(shard, int(args.shard_mib * MiB),
                                             args.sample_kib * KiB)
        local.s3.put_object(Bucket=BUCKET, Key=keys[shard], Body=body)
        local.http.put(f"/{SOURCE}/{keys[shard]}", content=body).raise_for_status()
        return keys[shard], {"bytes": len(body), "samples": samples, "payload": payload}

    pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="writer")
    try:
        t0 = time.perf_counter()
        written = dict(pool.map(put, range(len(keys))))
        return time.perf_counter() - t0, written
    finally:  # on Ctrl-C, do not go on with the queued PUTs
        pool.shutdown(wait=True, cancel_futures=True)


# -- one epoch ----------------------------------------------------------------------


def presigner(endpoint: str, access_key: str, secret_key: str) -> Callable[[str, str], str]:
    """(bucket, key) -> a presigned SigV4 GET URL at ``endpoint``."""
    s3 = boto3.client(
        "s3", endpoint_url=endpoint, region_name=_common.REGION,
        aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        config=BotoConfig(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    return lambda bucket, key: s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=URL_TTL_S)


class Tally:
    """What one reader saw, per shard: samples, their bytes, and its time
    (from the last sample of the shard before, so its GET's wait is in it)."""

    def __init__(self, key_of_url: dict[str, str], mean_size: int) -> None:
        self.key_of_url, self.mean_size = key_of_url, mean_size
        self.shards: dict[str, dict] = {}
        self.last = time.perf_counter()

    def count(self, sample: dict) -> None:
        key = self.key_of_url[sample["__url__"]]
        shard = self.shards.get(key)
        if shard is None:
            shard = self.shards[key] = {"samples": 0, "payload": 0, "began": self.last}
        self.last = shard["ended"] = time.perf_counter()
        fields = set(sample) - {"__key__", "__url__", "__local_path__"}
        if fields != {"bin", "cls"}:
            raise AssertionError(f"{key}: sample {sample['__key__']} has {sorted(fields)}")
        shard["samples"] += 1
        shard["payload"] += len(sample["bin"]) + len(sample["cls"])
        number, index = (int(part) for part in sample["__key__"][1:].split("_"))
        if index % CHECK_EVERY == 0:
            if (sample["bin"], sample["cls"]) != sample_of(number, index, self.mean_size):
                raise AssertionError(f"{key}: sample {sample['__key__']}: other bytes than written")


def read_epoch(urls: list[str], key_of_url: dict[str, str], readers: int, mean_size: int) -> dict:
    """Stream ``urls`` once: reader r takes positions r, r + N, ... through
    its own ``webdataset.WebDataset``. Any failure stops every reader and is
    raised."""
    stop = threading.Event()
    tallies = [Tally(key_of_url, mean_size) for _ in range(readers)]

    def reader(r: int) -> None:
        tallies[r].last = time.perf_counter()
        for sample in wds.WebDataset(urls[r::readers], shardshuffle=False):
            if stop.is_set():
                return
            tallies[r].count(sample)

    pool = ThreadPoolExecutor(readers, thread_name_prefix="wds")
    try:
        t0 = time.perf_counter()
        for future in [pool.submit(reader, r) for r in range(readers)]:
            future.result()
        wall = time.perf_counter() - t0
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
    shards = {key: shard for tally in tallies for key, shard in tally.shards.items()}
    times = [shard["ended"] - shard["began"] for shard in shards.values()]
    return {"wall_s": wall, "shards": shards, "shard_p50_s": statistics.median(times),
            "shard_p99_s": percentile(times, 99)}


def check_complete(seen: dict[str, dict], written: dict[str, dict]) -> None:
    """Every shard read, whole, once."""
    if seen.keys() != written.keys():
        raise AssertionError(f"shards read {len(seen)}, written {len(written)}; missing: "
                             f"{sorted(written.keys() - seen.keys())[:5]}")
    for key, shard in seen.items():
        got = shard["samples"], shard["payload"]
        want = written[key]["samples"], written[key]["payload"]
        if got != want:
            raise AssertionError(f"{key}: {got} samples and bytes read, {want} written")


def children_cpu() -> float:
    """CPU seconds of this process's finished children: the curl processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class ShardAdmin(Admin):
    """``epoch.Admin`` with the bytes served from each tier as well."""

    def counters(self) -> dict[str, int]:
        stats = self("GET", "/stats")
        served, gets = stats["served"], stats["requests"].get("GetObject", {})
        return super().counters() | {"hot_bytes": served["hot"]["bytes"],
                                     "capacity_bytes": served["capacity"]["bytes"],
                                     "get_errors": gets.get("errors", 0)}

    def evict(self) -> None:
        self.job("evict")
        tiers = self("GET", "/tiers")
        if tiers["flush_queue"] or tiers["hot_staged"] or tiers["hot_cached"]:
            raise RuntimeError(f"not flushed and evicted: {tiers}")

    def latest_epoch(self, bucket: str) -> str:
        return next(e["id"] for e in self("GET", "/epochs")["epochs"] if e["bucket"] == bucket)


def run_epoch(name: str, order: Callable[[], list[str]], url: Callable[[str], str],
              written: dict[str, dict], meter: Meter, args: argparse.Namespace) -> dict:
    """One epoch: ``order()`` (which may register it) and every key opened at
    ``url(key)``, both on the clock, as in a training loop; its figures."""
    curl_cpu = children_cpu()
    with meter:
        t0 = time.perf_counter()
        keys = order()
        urls = [url(key) for key in keys]
        prepare_s = time.perf_counter() - t0
        figures = read_epoch(urls, dict(zip(urls, keys, strict=True)), args.readers,
                             args.sample_kib * KiB)
        figures["wall_s"] = time.perf_counter() - t0
    check_complete(figures.pop("shards"), written)
    if meter.delta.get("get_errors"):  # curl retries them: they would only show as time
        raise AssertionError(f"{name}: the gateway failed {meter.delta['get_errors']} GETs")
    figures |= meter.delta | {"prepare_s": prepare_s, "curl_cpu_s": children_cpu() - curl_cpu}
    figures["all_cpu_s"] = sum(v for k, v in figures.items() if k.endswith("_cpu_s"))
    served = figures.get("hot_bytes", 0) + figures.get("capacity_bytes", 0)
    figures["byte_hit_ratio"] = figures["hot_bytes"] / served if served else None
    log(f"[{name}] {figures['wall_s']:.2f} s, {figures['proxied_gets']} GETs to moto, "
        f"hit ratio {_pct(figures['hit_ratio'])}")
    return figures


# -- the run ------------------------------------------------------------------------


def one_round(admin: ShardAdmin, hints: Hints, keys: list[str], seeds: list[int],
              urls: dict[str, Callable[[str], str]], written: dict[str, dict],
              meters: dict[str, Meter], args: argparse.Namespace) -> dict[str, dict]:
    """direct, cold unhinted, cold hinted, warm (evicted, then a warm job):
    one epoch each, in new orders."""
    def order(seed: int) -> Callable[[], list[str]]:
        return lambda: shuffled(keys, seed)

    def hinted_order() -> list[str]:
        return shard_epoch(BUCKET, shard_pattern(len(keys)), seed=seeds[2], hints=hints,
                           readers=args.readers)

    out: dict[str, dict] = {}
    out["direct"] = run_epoch("direct", order(seeds[0]), urls["direct"], written,
                              meters["direct"], args)
    admin.evict()
    out["cold, no hints"] = run_epoch("cold, no hints", order(seeds[1]), urls["gateway"],
                                      written, meters["gateway"], args)
    admin.evict()
    hinted = run_epoch("cold, hinted", hinted_order, urls["gateway"], written,
                       meters["gateway"], args)
    status = admin("GET", f"/epochs/{admin.latest_epoch(BUCKET)}")
    out["cold, hinted"] = hinted | {"epoch": {k: status[k] for k in EPOCH_STATUS}}
    admin.evict()  # the warm job starts from cold too, so its time and GETs are the whole set's
    with meters["gateway"] as meter:
        t0 = time.perf_counter()
        job = admin.job("warm", {"bucket": BUCKET, "prefix": PREFIX})
        warm_s = time.perf_counter() - t0
    out["warm job"] = meter.delta | {"wall_s": warm_s, "job": job}
    log(f"[warm job] {warm_s:.2f} s, {meter.delta['proxied_gets']} GETs to moto")
    out["warm"] = run_epoch("warm", order(seeds[3]), urls["gateway"], written,
                            meters["gateway"], args)
    return out


def set_up(gw: Gateway, admin: ShardAdmin, moto: str, keys: list[str],
           args: argparse.Namespace) -> dict:
    """The shards written both ways, flushed and evicted."""
    client(gw.endpoint).create_bucket(Bucket=BUCKET)
    log(f"[setup] writing {args.shards} shards of up to {args.shard_mib:g} MiB, "
        "through the gateway and straight into moto ...")
    write_s, written = write_shards(gw.endpoint, moto, keys, args)
    t0 = time.perf_counter()
    admin.job("flush")
    flush_s = time.perf_counter() - t0
    admin.evict()
    segments = admin("GET", "/tiers")["segments"]
    log(f"[setup] {write_s:.0f} s writing, {flush_s:.1f} s flush, {segments} segments")
    return {"write_s": write_s, "flush_s": flush_s, "segments": segments, "shards": written}


def run(args: argparse.Namespace) -> dict:
    keys = expand(shard_pattern(args.shards))
    with (delayed_moto(args.latency_ms, buckets=[SOURCE]) as moto, temp_dir("webdataset") as tmp,
          gateway(tmp / "data", extra_args=tuple(s3_capacity_args(moto.proxy.endpoint))) as gw):
        admin = ShardAdmin(gw.admin_url)
        hints = Hints(gw.admin_url, ADMIN_TOKEN, strict=True)
        try:
            results = set_up(gw, admin, moto.endpoint, keys, args)
            direct = presigner(moto.proxy.endpoint, MOTO_KEY, MOTO_KEY)
            via_gw = presigner(gw.endpoint, ACCESS_KEY, SECRET_KEY)
            urls = {"direct": lambda key: direct(SOURCE, key),
                    "gateway": lambda key: via_gw(BUCKET, key)}
            pids = {"gateway": gw.proc.pid, "moto": moto.pid}
            meters = {"direct": Meter(None, moto.proxy, {"moto": moto.pid}),
                      "gateway": Meter(admin, moto.proxy, pids)}
            results["rounds"] = []
            for n in range(args.rounds):
                log(f"[round {n + 1} of {args.rounds}]")
                seeds = [4 * n + i + 1 for i in range(4)]
                results["rounds"].append(
                    one_round(admin, hints, keys, seeds, urls, results["shards"], meters, args))
            return results
        finally:
            hints.close()
            admin.close()


# -- report -------------------------------------------------------------------------


CONFIGS = ("direct", "cold, no hints", "cold, hinted", "warm")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _median(rounds: list[dict], config: str, field: str) -> float | None:
    values = [r[config][field] for r in rounds if r[config].get(field) is not None]
    return statistics.median(values) if values else None


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _joined(items: list[str]) -> str:
    return "; ".join(items)


def report(args: argparse.Namespace, r: dict) -> str:
    rounds, shards = r["rounds"], r["shards"].values()
    total = sum(s["bytes"] for s in shards)
    samples = sum(s["samples"] for s in shards)
    sizes = sorted(s["bytes"] for s in shards)
    wall = {c: _median(rounds, c, "wall_s") for c in CONFIGS}
    rows = []
    for c in CONFIGS:
        hit, byte_hit = _median(rounds, c, "hit_ratio"), _median(rounds, c, "byte_hit_ratio")
        cpu = _median(rounds, c, "all_cpu_s")
        rows.append([
            c, f"{wall[c]:.2f}", f"{total / MiB / wall[c]:.0f}", f"{samples / wall[c]:,.0f}",
            f"{wall[c] / wall['warm']:.2f}x", f"{wall[c] / wall['direct']:.2f}x",
            f"{_median(rounds, c, 'proxied_gets'):.0f}",
            "-" if hit is None else f"{_pct(hit)} / {_pct(byte_hit)}",
            f"{_median(rounds, c, 'shard_p50_s'):.2f} / {_median(rounds, c, 'shard_p99_s'):.2f}",
            _cpu(_median(rounds, c, "gateway_cpu_s")), _cpu(_median(rounds, c, "moto_cpu_s")),
            f"{_median(rounds, c, 'client_cpu_s'):.1f} + {_median(rounds, c, 'curl_cpu_s'):.1f}",
            f"{cpu:.1f} ({cpu / wall[c]:.2f})",
        ])
    by_round = [[c, *(f"{rd[c]['wall_s']:.2f}" for rd in rounds)] for c in CONFIGS]
    jobs = [rd["warm job"] for rd in rounds]
    hinted = [rd["cold, hinted"] for rd in rounds]
    return "\n".join([
        f"### {args.shards} WebDataset shards of up to {args.shard_mib:g} MiB, {args.readers} "
        f"readers, +{args.latency_ms:g} ms per request to moto",
        "",
        f"Machine: {machine()}",
        "",
        f"Data: {total / MiB:.0f} MiB in {len(sizes)} shards ({sizes[0] / MiB:.2f} to "
        f"{sizes[-1] / MiB:.2f} MiB), {samples:,} samples of .bin (about {args.sample_kib} KiB) "
        f"and .cls; written in {r['write_s']:.0f} s (through the gateway and straight into "
        f"moto), flushed in {r['flush_s']:.1f} s into {r['segments']} segments. Every shard "
        "opened as a presigned URL by WebDataset's curl handler; the epoch time includes "
        f"drawing the order (registering it, hinted) and presigning. Medians of {len(rounds)} "
        "rounds, each epoch in a new order.",
        "",
        table(["configuration", "epoch s", "MiB/s", "samples/s", "time / warm", "time / direct",
               "GETs to moto", "hit ratio (shards / bytes)", "shard p50 / p99 s",
               "gateway CPU s", "moto CPU s", "client CPU s (Python + curl)",
               "all CPU s (cores busy)"], rows),
        "",
        table(["epoch s", *(f"round {n + 1}" for n in range(len(rounds)))], by_round),
        "",
        "Warm job (`POST /jobs/warm` of the prefix from an evicted tier, before each warm "
        "epoch): " + _joined([f"{j['wall_s']:.2f} s, {j['proxied_gets']} GETs, "
                             f"{j['store_bytes_read'] / MiB:.0f} MiB from moto" for j in jobs])
        + ".",
        "",
        "Cold, hinted: " + _joined([
            f"{h['prepare_s'] * 1000:.0f} ms to register, {h['epoch']['prefetched_objects']} "
            f"shards prefetched, {h['epoch']['hits']} hits and {h['epoch']['misses']} misses, "
            f"{h['store_bytes_read'] / MiB:.0f} MiB from moto" for h in hinted])
        + " (a hit: a shard wholly hot when its GET began).",
        "",
        "Client CPU: the benchmark process (reader threads and the delay proxy's thread) and "
        "its curl children. All CPU: gateway, moto and client; cores busy = all CPU / epoch s.",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 shards of 4 MiB instead of 48 of 8")
    ap.add_argument("--shards", type=int, help="shards in the data set (default 48; --quick 16)")
    ap.add_argument("--shard-mib", type=float,
                    help="largest shard size in MiB (default 8; --quick 4)")
    ap.add_argument("--sample-kib", type=int, default=100,
                    help="mean .bin size in KiB, 75%% to 125%% of it (default 100)")
    ap.add_argument("--readers", type=int, default=4,
                    help="reader threads, one WebDataset each (default 4)")
    ap.add_argument("--latency-ms", type=float, default=20.0,
                    help="added to each request to moto, half each way (default 20)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of the four configurations (default 3)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    if args.shards is None:
        args.shards = 16 if args.quick else 48
    if args.shard_mib is None:
        args.shard_mib = 4.0 if args.quick else 8.0
    _common.begin()
    results = run(args)
    print(report(args, results))
    write_results(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
