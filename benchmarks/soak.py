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

Each thread owns its keys (``t007/...``), so it knows what every read must
return; a mismatch counts as an error like a failed request, and a single
error fails the run (exit status 1). Clients do not retry (one attempt).

Every second the gateway's VmRSS (``/proc/<pid>/status``), threads and open
descriptors are sampled, every two seconds its capacity-store request
counters (admin ``/stats``). Reported: operations by kind with p50/p99
latency, throughput, capacity requests, RSS at 25/50/75/100% of the timed
run, VmHWM, and the slope of RSS over the second half of the run (least
squares, MiB/min) twice: of every sample, and of the floor (the lowest
sample of each 10 s), which is what is judged: memory is "flat" when the
floor's slope is below ``--max-rss-slope`` (10 MiB/min, see ``MAX_RSS_SLOPE``),
otherwise the run fails too. After the run one listing of the whole bucket
is checked against every thread's keys, the gateway is stopped and its data
directory checked with ``tiering.fsck``, and its log is read: an error or a
traceback there fails the run as well (``--keep-log`` keeps a copy).

Run:  .venv/bin/python benchmarks/soak.py [--quick] [--seconds 300] [--threads 32]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import os
import random
import re
import shutil
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common  # first: puts the repo root on sys.path
from _common import client, gateway, machine, percentile, process_cpu, table, temp_dir
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from capacity import KiB, MiB, admin, log, moto_store, parse_size, s3_capacity_args

from tests.servers import Gateway
from tiering import fsck

BUCKET = "soak"
# Multipart through the transfer manager: parts of 8 MiB, 4 in flight per thread.
TRANSFER = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB,
                          max_concurrency=4)
READ_CHUNK = MiB
RANGE_MAX = 256 * KiB  # longest range GET of a small object; 16x that of a large one
MAX_ERRORS_KEPT = 20  # per thread, with their messages; all are counted
# A level in the gateway's log: its own format (date, time, level, logger) or
# uvicorn's ("ERROR:    Exception in ASGI application"); access lines start "time=".
LOG_LEVEL = re.compile(r"(?:\d{4}-\d\d-\d\d [\d:,.]+ )?(WARNING|ERROR|CRITICAL):? ")

# Operation weights of a thread. The large kinds only for a thread that owns
# a large key (the others draw again).
WEIGHTS = {"get": 30, "get_range": 15, "head": 10, "write": 22, "delete": 6, "list": 5,
           "get_large": 2, "put_large": 1}
KINDS = ("get", "get_large", "get_range", "head", "put", "overwrite", "put_large", "delete", "list")

# The verdict is on the RSS floor: the lowest sample of each FLOOR_WINDOW
# seconds. Between those lows the gateway holds the buffers of the requests in
# flight (a multipart body being streamed, 64 MiB of segment being built, 8
# MiB extents being fetched): spikes of 100 MiB and more that come and go
# within seconds, and that tilt a least-squares fit over every sample by tens
# of MiB/min when one lands near the end of the run. A leak raises the floor.
FLOOR_WINDOW = 10.0
# 10 MiB/min over the second half: 600 MiB an hour, fatal for a daemon meant
# to run for weeks. Not less, because the floor of a healthy gateway moves in
# steps too (the allocator takes a few more MiB and keeps them; the index's
# memtable grows ~1 MiB/min here): one step of 7 MiB in the middle of the 150
# s judged reads as +4 MiB/min, and was seen in a run whose floor otherwise
# stayed within 251..258 MiB for 5 minutes. A slower leak needs a longer
# --seconds to stand out. At ~50 requests/s, 10 MiB/min is ~3.4 KiB kept per
# request.
MAX_RSS_SLOPE = 10.0  # MiB per minute, of the floor, over the second half of the timed run


class Mismatch(AssertionError):
    """A response that is not what the thread's model of its keys says."""


@dataclass(frozen=True, slots=True)
class Body:
    """What a key holds: ``size`` bytes of the payload pool from ``offset``."""

    offset: int
    size: int
    md5: str
    etag: str  # as S3 answers it, quotes included


UNKNOWN = object()  # a key whose last write or delete failed: its state is not known


class Pool:
    """Random bytes objects are cut from (so no body is generated per PUT)."""

    def __init__(self, size: int, seed: int) -> None:
        self.data = random.Random(seed).randbytes(size)
        self.view = memoryview(self.data)

    def body(self, rng: random.Random, size: int, multipart: bool) -> tuple[Body, memoryview]:
        offset = rng.randrange(len(self.data) - size + 1)
        data = self.view[offset:offset + size]
        md5 = hashlib.md5(data).hexdigest()
        etag = multipart_etag(data, TRANSFER.multipart_chunksize) if multipart else md5
        return Body(offset, size, md5, f'"{etag}"'), data


def multipart_etag(data: memoryview, part: int) -> str:
    """S3's ETag of a multipart upload in parts of ``part`` bytes: the MD5 of
    the parts' MD5s, a dash, the number of parts."""
    digests = [hashlib.md5(data[i:i + part]).digest() for i in range(0, len(data), part)]
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


def log_uniform(rng: random.Random, low: int, high: int) -> int:
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def log_uniform_mean(low: int, high: int) -> float:
    return (high - low) / math.log(high / low) if high > low else float(low)


@dataclass
class Plan:
    """The data set and the workload, from the arguments."""

    threads: int
    small_keys: int  # per thread
    large_keys: int  # in all, key j owned by thread j % threads
    small: tuple[int, int]
    large: tuple[int, int]

    @classmethod
    def of(cls, args: argparse.Namespace) -> Plan:
        large_bytes = args.large_objects * log_uniform_mean(args.large_min, args.large_max)
        small_bytes = args.dataset_size - large_bytes
        if small_bytes <= 0:
            raise SystemExit("the large objects alone exceed --dataset-size")
        per_thread = small_bytes / args.threads / log_uniform_mean(args.small_min, args.small_max)
        return cls(args.threads, max(1, round(per_thread)), args.large_objects,
                   (args.small_min, args.small_max), (args.large_min, args.large_max))

    def keys_of(self, slot: int) -> tuple[list[str], list[str]]:
        small = [f"t{slot:03d}/small/{i:05d}.bin" for i in range(self.small_keys)]
        owned = range(slot, self.large_keys, self.threads)
        large = [f"t{slot:03d}/large/{j:03d}.bin" for j in owned]
        return small, large


@dataclass
class Tally:
    """One thread's results (merged at the end; no locks while it runs)."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    errors: Counter[str] = field(default_factory=Counter)
    first_errors: list[dict] = field(default_factory=list)
    bytes_up: int = 0
    bytes_down: int = 0
    verified_bytes: int = 0

    def error(self, kind: str, key: str, exc: BaseException) -> None:
        self.errors[kind] += 1
        # At the wall clock's time, to find it in the gateway's log.
        if len(self.first_errors) < MAX_ERRORS_KEPT:
            self.first_errors.append({"at": time.strftime("%H:%M:%S"), "kind": kind, "key": key,
                                      "error": repr(exc)[:500]})

    @property
    def ops(self) -> int:
        return sum(len(v) for v in self.latencies.values())


class Worker:
    """One client thread: its keys, what they hold, and the operations on them."""

    def __init__(self, slot: int, s3: Any, plan: Plan, pool: Pool, seed: int) -> None:
        self.s3 = s3
        self.plan, self.pool = plan, pool
        self.rng = random.Random(f"{seed}/{slot}")
        self.prefix = f"t{slot:03d}/"
        self.small, self.large = plan.keys_of(slot)
        self.keys = self.small + self.large
        self.model: dict[str, object] = dict.fromkeys(self.keys)
        self.ops: dict[str, Callable[[str], None]] = {
            "put": self.write, "overwrite": self.write, "put_large": self.write,
            "delete": self.delete, "get": self.get, "get_large": self.get,
            "head": self.head, "get_range": self.get_range,
        }
        self.tally = Tally()
        self.kinds = [k for k in WEIGHTS if self.large or not k.endswith("_large")]
        self.weights = [WEIGHTS[k] for k in self.kinds]

    # -- the loop -------------------------------------------------------------

    def fill(self, stop: threading.Event) -> None:
        """Write every key once (not counted as timed operations)."""
        for key in self.keys:
            if stop.is_set():
                return
            self.timed("fill", key, self.write)

    def run(self, deadline: float, stop: threading.Event) -> None:
        while time.perf_counter() < deadline and not stop.is_set():
            self.step()

    def step(self) -> None:
        kind = self.rng.choices(self.kinds, self.weights)[0]
        if kind == "list":
            self.timed("list", self.prefix, lambda _: self.list())
            return
        if kind == "get_range":
            key = self.rng.choice(self.keys)
        else:
            key = self.rng.choice(self.large if kind.endswith("_large") else self.small)
        state = self.model[key]
        if (kind in ("write", "put_large") or state is UNKNOWN
                or (state is None and kind in ("delete", "get_range", "get_large"))):
            kind = ("put_large" if key in self.large
                    else "overwrite" if isinstance(state, Body) else "put")
        self.timed(kind, key, self.ops[kind])

    def timed(self, kind: str, key: str, op: Callable[[str], None]) -> None:
        t0 = time.perf_counter()
        try:
            op(key)
        except Exception as exc:  # noqa: BLE001  (every failure is counted; the run goes on)
            self.tally.error(kind, key, exc)
            return
        if kind != "fill":
            self.tally.latencies[kind].append(time.perf_counter() - t0)

    # -- operations -------------------------------------------------------------

    def write(self, key: str) -> None:
        large = key in self.large
        low, high = self.plan.large if large else self.plan.small
        body, data = self.pool.body(self.rng, log_uniform(self.rng, low, high), multipart=large)
        self.model[key] = UNKNOWN  # until acknowledged
        if large:
            self.s3.upload_fileobj(io.BytesIO(data), BUCKET, key, Config=TRANSFER)
        else:
            self.s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(data))
        self.model[key] = body
        self.tally.bytes_up += body.size

    def delete(self, key: str) -> None:
        self.model[key] = UNKNOWN
        self.s3.delete_object(Bucket=BUCKET, Key=key)
        self.model[key] = None

    def get(self, key: str) -> None:
        expected = self.model[key]
        if expected is None:
            self.expect_missing(key, lambda: self.s3.get_object(Bucket=BUCKET, Key=key),
                                "NoSuchKey")
            return
        digest, size = hashlib.md5(), 0
        stream = self.s3.get_object(Bucket=BUCKET, Key=key)["Body"]
        for chunk in stream.iter_chunks(READ_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        self.tally.bytes_down += size
        if (size, digest.hexdigest()) != (expected.size, expected.md5):
            raise Mismatch(f"{key}: GET answered {size} bytes, MD5 {digest.hexdigest()}; "
                           f"expected {expected.size}, {expected.md5}")
        self.tally.verified_bytes += size

    def get_range(self, key: str) -> None:
        expected = self.model[key]
        longest = RANGE_MAX * (16 if key in self.large else 1)
        start = self.rng.randrange(expected.size)
        end = min(expected.size, start + self.rng.randint(1, longest))  # exclusive
        answer = self.s3.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={start}-{end - 1}")
        got = answer["Body"].read()
        self.tally.bytes_down += len(got)
        if got != self.pool.view[expected.offset + start:expected.offset + end]:
            raise Mismatch(f"{key}: bytes {start}-{end - 1} differ ({len(got)} bytes answered)")
        self.tally.verified_bytes += len(got)

    def head(self, key: str) -> None:
        expected = self.model[key]
        if expected is None:
            self.expect_missing(key, lambda: self.s3.head_object(Bucket=BUCKET, Key=key), "404")
            return
        got = self.s3.head_object(Bucket=BUCKET, Key=key)
        if (got["ContentLength"], got["ETag"]) != (expected.size, expected.etag):
            raise Mismatch(f"{key}: HEAD answered {got['ContentLength']} bytes, "
                           f"ETag {got['ETag']}; "
                           f"expected {expected.size}, {expected.etag}")

    def list(self) -> None:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=self.prefix)
        check_listing(((o["Key"], o["Size"], o["ETag"]) for page in pages
                       for o in page.get("Contents", ())), [self.model], self.prefix)

    @staticmethod
    def expect_missing(key: str, request: Callable[[], object], code: str) -> None:
        try:
            request()
        except ClientError as exc:
            if exc.response["Error"]["Code"] == code:
                return
            raise
        raise Mismatch(f"{key}: deleted, yet found")


def check_listing(listed: Iterable[tuple[str, int, str]], models: list[dict[str, object]],
                  where: str) -> int:
    """Compare listed (key, size, ETag) with the models; keys of unknown
    state are left out. The number of keys listed."""
    expected = {k: (b.size, b.etag) for m in models for k, b in m.items() if isinstance(b, Body)}
    unknown = {k for m in models for k, b in m.items() if b is UNKNOWN}
    got = {key: (size, etag) for key, size, etag in listed if key not in unknown}
    if got != expected:
        missing = sorted(expected.keys() - got.keys())[:5]
        extra = sorted(got.keys() - expected.keys())[:5]
        changed = sorted(k for k in expected.keys() & got.keys() if expected[k] != got[k])[:5]
        raise Mismatch(f"listing of {where!r}: missing {missing}, unexpected {extra}, "
                       f"other size or ETag {changed}")
    return len(got)


# -- sampling the gateway ----------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (KiB) and Threads of a process, and its open descriptors."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM", "Threads"):
            out[name] = int(value.split()[0])
    out["fds"] = sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
    return out


def capacity_counters(gw: Gateway) -> dict[str, int]:
    """The capacity store's request and byte counters (admin ``/stats``)."""
    capacity = admin(gw, "GET", "/stats")["capacity"]
    return capacity["requests"] | {"bytes_read": capacity["bytes_read"],
                                   "bytes_written": capacity["bytes_written"]}


class Sampler(threading.Thread):
    """Calls ``probe`` every ``every`` seconds (on a fixed schedule, however
    long a call takes) until ``finish``, keeping each answer with its time
    since ``t0``. A failing probe sets ``stop``: the run ends."""

    def __init__(self, probe: Callable[[], dict], every: float, t0: float,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True, name="soak sampler")
        self.probe, self.every, self.t0, self.stop = probe, every, t0, stop
        self.samples: list[dict] = []
        self.failure: str | None = None
        self._done = threading.Event()

    def run(self) -> None:
        tick = self.t0
        while True:
            tick += self.every
            if self._done.wait(max(0.0, tick - time.perf_counter())):
                return
            t = time.perf_counter() - self.t0
            try:
                self.samples.append({"t": round(t, 2)} | self.probe())
            except Exception as exc:  # noqa: BLE001  (the gateway is gone or broken: end the run)
                self.failure = repr(exc)
                log(f"sampling failed, ending the run: {exc!r}")
                self.stop.set()
                return

    def finish(self) -> None:
        self._done.set()
        self.join(timeout=60)


def memory_probe(gw: Gateway, workers: list[Worker]) -> Callable[[], dict]:
    """The gateway's RSS, threads and descriptors, and the operations done."""

    def probe() -> dict:
        if gw.proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with status {gw.proc.returncode}")
        status = proc_status(gw.proc.pid)
        return {"rss_kib": status["VmRSS"], "threads": status["Threads"], "fds": status["fds"],
                "ops": sum(w.tally.ops for w in workers),
                "errors": sum(w.tally.errors.total() for w in workers)}

    return probe


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


def run(args: argparse.Namespace) -> dict:
    plan = Plan.of(args)
    pool = Pool(2 * max(args.large_max, args.small_max), args.seed)
    stop = threading.Event()
    out: dict = {"plan": vars(plan)}
    with moto_store() as (moto_port, _), temp_dir("soak") as tmp:
        extra = (*s3_capacity_args(f"http://127.0.0.1:{moto_port}"),
                 "--hot-size", str(args.hot_size))
        os.environ.update(args.gateway_env)  # the gateway's environment is this one's
        with gateway(tmp / "data", extra_args=extra) as gw:
            workers = [Worker(slot, client(gw.endpoint, max_pool=TRANSFER.max_concurrency),
                              plan, pool, args.seed) for slot in range(args.threads)]
            out |= fill_run(gw, workers, plan, stop)
            fill_errors = sum(w.tally.errors.total() for w in workers)
            log(f"[fill] {out['fill_bytes'] / MiB:.0f} MiB in {out['fill_s']:.1f} s; "
                f"timed run of {args.seconds:g} s ...")
            out |= timed_run(gw, workers, args.seconds, stop)
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


def timed_run(gw: Gateway, workers: list[Worker], seconds: float, stop: threading.Event) -> dict:
    """The workers' loops for ``seconds``, sampled; the figures of the gateway
    over that time."""
    pid = gw.proc.pid
    capacity0, cpu0 = capacity_counters(gw), process_cpu(pid)
    t0 = time.perf_counter()
    samplers = [Sampler(memory_probe(gw, workers), 1.0, t0, stop),
                Sampler(lambda: capacity_counters(gw), 2.0, t0, stop)]
    for sampler in samplers:
        sampler.start()
    wall = in_threads(workers, lambda w: w.run(t0 + seconds, stop))
    for sampler in samplers:
        sampler.finish()
    failures = [s.failure for s in samplers if s.failure]
    if failures:
        raise RuntimeError(f"the run ended early: {failures[0]}")
    cpu, capacity1 = process_cpu(pid) - cpu0, capacity_counters(gw)
    return {"wall_s": wall, "gateway_cpu_s": cpu,
            "capacity": {k: capacity1[k] - capacity0[k] for k in capacity1},
            "end": proc_status(pid) | {"tiers": tiers_view(gw)},
            "samples": samplers[0].samples, "capacity_samples": samplers[1].samples}


def log_problems(path: Path) -> dict:
    """Warnings, errors and tracebacks in the gateway's log, with the first
    few error lines and the exception each traceback ended with."""
    counts: Counter[str] = Counter()
    first: list[str] = []
    in_traceback = False
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("Traceback"):
            counts["traceback"] += 1
            in_traceback = True
        elif in_traceback and line and not line[0].isspace():
            if not line.startswith(("During handling", "The above exception")):
                in_traceback = False
                first.append(f"raised {line}"[:300])
        elif level := LOG_LEVEL.match(line):
            counts[level[1].lower()] += 1
            if level[1] != "WARNING":
                first.append(line[:300])
    return {"warnings": counts["warning"], "errors": counts["error"] + counts["critical"],
            "tracebacks": counts["traceback"], "first_errors": first[:10]}


def final_listing(workers: list[Worker]) -> dict:
    """One listing of the whole bucket, checked against every thread's keys."""
    pages = workers[0].s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    try:
        keys = check_listing(((o["Key"], o["Size"], o["ETag"]) for page in pages
                              for o in page.get("Contents", ())), [w.model for w in workers], "")
    except Exception as exc:  # noqa: BLE001  (reported as an error of the run)
        return {"ok": False, "error": repr(exc)[:1000]}
    return {"ok": True, "keys": keys}


def merge(tallies: list[Tally], fill_errors: int) -> dict:
    latencies = {k: [x for t in tallies for x in t.latencies[k]] for k in KINDS}
    errors = sum((t.errors for t in tallies), Counter())
    first = sorted((e for t in tallies for e in t.first_errors), key=lambda e: e["at"])
    return {"latencies": latencies, "errors_by_kind": dict(errors),
            "errors": errors.total(), "fill_errors": fill_errors,
            "first_errors": first[:MAX_ERRORS_KEPT],
            "bytes_up": sum(t.bytes_up for t in tallies),
            "bytes_down": sum(t.bytes_down for t in tallies),
            "verified_bytes": sum(t.verified_bytes for t in tallies)}


# -- figures and verdict ------------------------------------------------------------


def floor(samples: list[dict], window: float) -> list[dict]:
    """The lowest RSS sample of each ``window`` seconds."""
    windows: dict[int, dict] = {}
    for s in samples:
        w = int(s["t"] // window)
        if w not in windows or s["rss_kib"] < windows[w]["rss_kib"]:
            windows[w] = s
    return [windows[w] for w in sorted(windows)]


def slope(samples: list[dict]) -> float | None:
    """Least-squares slope of RSS over time, MiB per minute."""
    if len(samples) < 3:
        return None
    fit = statistics.linear_regression([s["t"] for s in samples],
                                       [s["rss_kib"] / KiB for s in samples])
    return fit.slope * 60


def rss_figures(samples: list[dict], seconds: float, hwm_kib: int) -> dict:
    """RSS (MiB) at 25/50/75/100% of the run and at its peak, and the slopes
    over the second half: of the floor (the verdict) and of every sample."""
    if not samples:
        return {"at": {}, "peak_mib": hwm_kib / KiB, "slope_mib_per_min": None,
                "raw_slope_mib_per_min": None}
    at = {}
    for q in (25, 50, 75, 100):
        nearest = min(samples, key=lambda s: abs(s["t"] - seconds * q / 100))
        at[str(q)] = nearest["rss_kib"] / KiB
    half = [s for s in samples if s["t"] >= seconds / 2]
    low = floor(half, min(FLOOR_WINDOW, seconds / 20))  # 10 points or more to fit
    peak = max(hwm_kib, max(s["rss_kib"] for s in samples)) / KiB
    return {"at": at, "peak_mib": peak, "slope_mib_per_min": slope(low),
            "raw_slope_mib_per_min": slope(half), "second_half_samples": len(half),
            "floor_mib": [round(s["rss_kib"] / KiB, 1) for s in low]}


def summarise(r: dict, args: argparse.Namespace) -> dict:
    wall = r["wall_s"]
    ops = {}
    for kind, lat in r["latencies"].items():
        ops[kind] = {"count": len(lat), "errors": r["errors_by_kind"].get(kind, 0),
                     "per_s": len(lat) / wall,
                     "p50_ms": percentile(lat, 50) * 1000 if lat else None,
                     "p99_ms": percentile(lat, 99) * 1000 if lat else None}
    total = sum(o["count"] for o in ops.values())
    memory = rss_figures(r["samples"], wall, r["end"]["VmHWM"])
    failures = []
    if r["errors"]:
        failures.append(f"{r['errors']} error(s) ({r['fill_errors']} while filling)")
    if not r["final_listing"]["ok"]:
        failures.append("the final listing differs from what was written")
    if r["fsck_problems"]:
        failures.append(f"{len(r['fsck_problems'])} fsck problem(s)")
    glog = r["gateway_log"]
    if glog["errors"] or glog["tracebacks"]:
        failures.append(f"the gateway logged {glog['errors']} error(s) and "
                        f"{glog['tracebacks']} traceback(s)")
    slope = memory["slope_mib_per_min"]
    if not math.isfinite(args.max_rss_slope):
        pass  # memory not judged
    elif slope is None:
        failures.append("too few RSS samples for a slope")
    elif slope > args.max_rss_slope:
        failures.append(f"the RSS floor grows {slope:.1f} MiB/min over the second half "
                        f"(limit {args.max_rss_slope:g})")
    return {"ops": ops, "total_ops": total, "ops_per_s": total / wall,
            "mib_per_s_up": r["bytes_up"] / MiB / wall,
            "mib_per_s_down": r["bytes_down"] / MiB / wall,
            "memory": memory, "failures": failures, "passed": not failures}


def report(r: dict, s: dict, args: argparse.Namespace) -> str:
    rows = [[kind, f"{o['count']:,}", str(o["errors"]), f"{o['per_s']:.1f}",
             _ms(o["p50_ms"]), _ms(o["p99_ms"])] for kind, o in s["ops"].items()]
    rows.append(["**all**", f"**{s['total_ops']:,}**", f"**{r['errors']}**",
                 f"**{s['ops_per_s']:.1f}**", "", ""])
    m, samples = s["memory"], r["samples"]
    slope, raw = m["slope_mib_per_min"], m["raw_slope_mib_per_min"]
    mem_rows = [["at start (empty)", f"{r['rss_start_kib'] / KiB:.0f}"],
                ["after the fill", f"{r['after_fill']['VmRSS'] / KiB:.0f}"]]
    mem_rows += [[f"{q}% of the timed run", f"{v:.0f}"] for q, v in m["at"].items()]
    mem_rows += [["peak (VmHWM)", f"{m['peak_mib']:.0f}"],
                 ["**slope of the floor over the second half, MiB/min**",
                  f"**{slope:+.2f}** (limit {args.max_rss_slope:g})" if slope is not None else "-"],
                 ["slope of every sample over the second half, MiB/min",
                  f"{raw:+.2f}" if raw is not None else "-"],
                 ["threads, open fds: start / end",
                  f"{samples[0]['threads']}, {samples[0]['fds']} / {r['end']['Threads']}, "
                  f"{r['end']['fds']}" if samples else "-"]]
    cap, tiers, glog = r["capacity"], r["end"]["tiers"], r["gateway_log"]
    cap_rows = [[k, f"{v:,}"] for k, v in cap.items() if not k.startswith("bytes")]
    cap_rows += [["MiB read / written",
                  f"{cap['bytes_read'] / MiB:,.0f} / {cap['bytes_written'] / MiB:,.0f}"],
                 ["hot tier at the end: used / budget MiB",
                  f"{tiers['hot_used'] / MiB:.0f} / {tiers['hot_budget'] / MiB:.0f}"],
                 ["evicted MiB (whole run), cache hits / misses",
                  f"{tiers['evicted'] / MiB:,.0f}, "
                  f"{tiers['cache_hits']:,} / {tiers['cache_misses']:,}"],
                 ["segments, live ratio", f"{tiers['segments']}, {tiers['live_ratio']:.2f}"]]
    verdict = "**passed**" if s["passed"] else "**FAILED**: " + "; ".join(s["failures"])
    lines = [
        f"### Soak: {r['wall_s']:.0f} s, {args.threads} threads, data set "
        f"{args.dataset_size / MiB:.0f} MiB, hot tier {args.hot_size / MiB:.0f} MiB",
        "", f"Machine: {machine()}", "",
        f"Fill: {r['fill_bytes'] / MiB:.0f} MiB in {r['fill_s']:.1f} s. Timed run: "
        f"{s['mib_per_s_up']:.1f} MiB/s up, {s['mib_per_s_down']:.1f} MiB/s down, "
        f"{r['verified_bytes'] / MiB:,.0f} MiB of answers checked; gateway CPU "
        f"{r['gateway_cpu_s'] / r['wall_s']:.2f} cores.", "",
        table(["operation", "count", "errors", "per s", "p50 ms", "p99 ms"], rows), "",
        table(["gateway RSS", "MiB"], mem_rows), "",
        table(["capacity store, timed run", ""], cap_rows), "",
        f"Final listing: {r['final_listing']}. fsck: {len(r['fsck_problems'])} problem(s). "
        f"Gateway log: {glog['errors']} error(s), {glog['warnings']} warning(s), "
        f"{glog['tracebacks']} traceback(s).", "",
        f"Verdict: {verdict}", "",
    ]
    for e in r["first_errors"]:
        lines.append(f"- error at {e['at']}: {e['kind']} {e['key']}: {e['error']}")
    lines += [f"- gateway log: {line}" for line in glog["first_errors"]]
    return "\n".join(lines)


def env_setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _ms(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


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
    ap.add_argument("--max-rss-slope", type=float, default=MAX_RSS_SLOPE,
                    help="MiB/min of growth of the RSS floor over the second half that fails "
                         "the run (default 10; inf: not judged)")
    ap.add_argument("--gateway-env", type=env_setting, action="append", default=[],
                    metavar="NAME=VALUE",
                    help="set in the gateway's environment, e.g. MALLOC_ARENA_MAX=2 (repeatable)")
    ap.add_argument("--keep-log", type=Path, metavar="PATH",
                    help="copy the gateway's log (warnings, one line per request) here at the end")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write every number as JSON here")
    args = ap.parse_args(argv)
    quick = args.quick
    for name, full, short in (("seconds", 300.0, 180.0), ("threads", 32, 16),
                              ("dataset_size", 600 * MiB, 200 * MiB),
                              ("hot_size", 256 * MiB, 96 * MiB), ("large_objects", 6, 2)):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)
    _common.exit_cleanly_on_sigterm()

    results = run(args)
    summary = summarise(results, args)
    print(report(results, summary, args))
    args.keep_log = str(args.keep_log) if args.keep_log else None  # for the JSON
    raw = {k: v for k, v in results.items() if k != "latencies"}  # summarised instead
    _common.write_results(args, raw | {"summary": summary})
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
