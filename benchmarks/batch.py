"""Batch GET (docs/batch.md) side by side with single GETs, in one run.

Started on 127.0.0.1, each stopped by its PID at the end (also on Ctrl-C
or SIGTERM), temp dirs removed: moto's S3 server (``_moto.serve_moto``)
behind ``delay_proxy.DelayProxy`` adding ``--latency-ms`` (20) to every
request, half each way, and counting them; the gateway, a managed bucket
whose capacity store is that delayed moto; nginx-local (nginx serving the
same files from disk, unsigned GETs) when nginx is installed or can be
installed with apt-get.

  1. hot: ``--objects`` (4,000) objects of ``--size`` (64 KiB), flushed and
     still cached. In a shuffled order: the gateway's single-GET epoch with
     ``--readers`` (16) lean readers (one keep-alive connection each, SigV4
     by a cached key), its batched epoch (``POST ?batch`` of ``--batch``
     (64) keys from ``--threads`` (4) threads, a lean client each: signed as
     the single-GET readers sign, http.client, and a 30-line tar reader
     whose members are views of the response), nginx-local's single-GET
     epoch with 16 readers. Objects/s and the server's CPU per object from
     /proc, in rounds (``--rounds``, 2) that alternate the three. With
     ``--old PATH`` (another checkout, e.g. a ``git worktree`` of the
     commit before a change), that checkout's gateway is started beside
     this one with the same objects (over the same delayed store, under
     another prefix), and its batched epochs join the hot rounds and the
     cold part: before and after, in the same run. With ``--bare``, a bare
     uvicorn app answering every GET with as many constant bytes as a
     batch's tar (``ab.bare_app``) joins the hot rounds: what the stack
     alone costs per object's bytes; and so does the floor of a hot batch
     (``_bare_app.py --files``): the same bytes as files of the same size,
     read and sent as the gateway does it (the same listener and loop), with
     nothing else done. The CPU of the benchmark process (the lean clients)
     per object is reported too.
  2. cold: flushed and evicted before each epoch. The batched epoch with
     batches of consecutive keys (a virtual shard: neighbours in the
     segments) in a shuffled batch order, the batched epoch in the shuffled
     key order, and the store itself read by 16 single-GET lean readers in
     the shuffled order; store GETs counted by the proxy.
  3. a data set of ``--samples`` (1,000) samples of 110 KiB, hot, read as a
     training job would: one GET per sample (16 lean readers),
     ``BatchDataset.__getitems__`` (the package's client)
     with batches of ``--batch`` from 4 threads, WebDataset over
     ``virtual_shards`` URLs (``--shard-samples`` (64) a shard), and
     WebDataset over real tar shards of the same samples served by the
     gateway (presigned URLs, read by curl).

The machine is shared: compare the ratios of one run, not runs.
``--parts hot`` (or ``cold``, ``dataset``, comma-separated) runs only those.

Run:  .venv/bin/python benchmarks/batch.py [--quick] [--objects 4000] [--rounds 2] [--old ../before]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import statistics
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import boto3
from _common import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    gateway,
    machine,
    run_and_report,
    table,
    temp_dir,
)
from _compare_client import PlainClient, SignedClient
from _compare_peers import NginxLocal
from _compare_workloads import cpu_meter, epoch
from _epoch_workload import Admin, body_of, checker, key_of
from _moto import moto_store, s3_capacity_args
from ab import bare_app
from botocore.config import Config as BotoConfig
from delay_proxy import DelayProxy

from gateway.client.batch import BatchClient, BatchDataset
from gateway.client.order import shuffled

KiB, MiB = 1024, 1024**2
BUCKET = "data"
SEED = 11
SAMPLE_SIZE = 110 * KiB
Pids = dict[str, Callable[[], list[int]]]
T = TypeVar("T")
ZERO_BLOCK = bytes(512)  # a tar's end blocks are two of them


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- a lean batch client ---------------------------------------------------------------


class LeanBatch:
    """``POST /{bucket}?batch`` over one keep-alive connection, signed as
    the single-GET readers sign (``SignedClient``: a few lines of SigV4, a
    cached key), the tar cut into members with no copy of their bytes: the
    response read whole is the one copy, as a single GET's body is."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._client = SignedClient(port)

    def batch(self, bucket: str, keys: Sequence[str]) -> list[tuple[str, memoryview]]:
        body = json.dumps({"keys": list(keys), "on_error": "fail"}).encode()
        status, data = self._client.post(bucket, "batch", body)
        if status != 200:
            raise RuntimeError(f"batch on :{self.port}: {status} {data[:300]!r}")
        return list(read_tar(data))


def read_tar(body: bytes) -> Iterator[tuple[str, memoryview]]:
    """(name, bytes) per regular member of a tar (ustar, with pax ``path``
    records), up to the end blocks; the bytes are views of ``body``."""
    name = None
    view = memoryview(body)
    at = 0
    while True:
        if len(body) < at + 512:
            raise RuntimeError("the tar stream was cut")
        if body[at:at + 512] == ZERO_BLOCK:
            return
        size = int(body[at + 124:at + 136].strip(b"\0 ") or b"0", 8)
        data = view[at + 512:at + 512 + size]
        typeflag = body[at + 156]
        head_name = body[at:at + 100]
        at += 512 + size + (-size % 512)
        if typeflag == ord("x"):
            for record in bytes(data).decode().splitlines():
                keyword, _, value = record.partition(" ")[2].partition("=")
                if keyword == "path":
                    name = value
            continue
        yield name or head_name.rstrip(b"\0").decode(), data
        name = None


def batched_epoch(port: int, bucket: str, batches: list[list[str]], threads: int,
                  check: Callable[[str, bytes], None], pids: Pids) -> dict:
    """Every batch read once, ``threads`` lean clients taking the next one
    in turn: objects/s, MiB/s, batch latencies, server CPU per object."""
    latencies: list[float] = []
    nbytes = [0]

    def read(lean: LeanBatch, batch: list[str]) -> None:
        t0 = time.perf_counter()
        members = lean.batch(bucket, batch)
        latencies.append(time.perf_counter() - t0)
        if [name for name, _ in members] != batch:
            raise AssertionError("a batch's members out of order or missing")
        for name, data in members:
            check(name, data)
            nbytes[0] += len(data)

    figures: dict = {}
    with cpu_meter(pids, figures):
        t0 = time.perf_counter()
        take_turns(batches, threads, lambda: LeanBatch(port), read)
        wall = time.perf_counter() - t0
    objects = sum(len(b) for b in batches)
    latencies.sort()
    figures |= {
        "objects": objects, "wall_s": wall, "objects_per_s": objects / wall, "mib_per_s": nbytes[0] / MiB / wall,
        "batch_p50_ms": 1000 * latencies[len(latencies) // 2], "batch_p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
    }
    for name in pids:
        figures[f"{name}_cpu_per_1k"] = figures.pop(f"{name}_cpu_s") * 1000 / objects
    return figures


def bare_epoch(port: int, batches: int, size: int, threads: int, objects: int, pids: Pids) -> dict:
    """``batches`` GETs of a bare uvicorn app answering ``size`` constant
    bytes (a hot batch's tar, ``ab.bare_app``), ``threads`` at a time: the
    stack's own cost of sending a batch's bytes, no app at all."""
    def read(conn: HTTPConnection, _: list[str]) -> None:
        conn.request("GET", "/")
        response = conn.getresponse()
        if len(response.read()) != size:
            raise AssertionError("the bare app's answer was cut")

    figures: dict = {}
    with cpu_meter(pids, figures):
        t0 = time.perf_counter()
        take_turns([[]] * batches, threads, lambda: HTTPConnection("127.0.0.1", port, timeout=300), read)
        wall = time.perf_counter() - t0
    figures |= {"objects": objects, "wall_s": wall, "objects_per_s": objects / wall,
                "mib_per_s": size * batches / MiB / wall}
    for name in pids:
        figures[f"{name}_cpu_per_1k"] = figures.pop(f"{name}_cpu_s") * 1000 / objects
    return figures


def take_turns(batches: list[list[str]], threads: int, make: Callable[[], T],
               read: Callable[[T, list[str]], None]) -> None:
    """``read(client, batch)`` for every batch, ``threads`` threads each with
    a client of its own (``make()``) taking the next batch in turn."""
    lock, turn = threading.Lock(), iter(batches)

    def worker() -> None:
        client = make()
        while True:
            with lock:
                batch = next(turn, None)
            if batch is None:
                return
            read(client, batch)

    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(worker) for _ in range(threads)]:
            future.result()


def _webdataset() -> ModuleType:
    """The webdataset package: benchmarks/webdataset.py (loaded here under
    another name) finds it past its own name on sys.path."""
    spec = importlib.util.spec_from_file_location("webdataset_benchmark", Path(__file__).with_name("webdataset.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.wds


def cut(keys: Sequence[str], size: int) -> list[list[str]]:
    return [list(keys[i:i + size]) for i in range(0, len(keys), size)]


# -- the run ---------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
        self.args, self.stack = args, stack
        self.results: dict = {"hot": [], "cold": [], "dataset": [], "skipped": {}}
        self.keys = [key_of(i) for i in range(args.objects)]
        self.check = checker(args.size)
        self.tmp = tmp = stack.enter_context(temp_dir("batch"))
        moto_port, self.moto_pid = stack.enter_context(moto_store())
        self.moto_port = moto_port
        self.proxy = stack.enter_context(DelayProxy(moto_port))
        self.proxy.delay_s = args.latency_ms / 2000
        (tmp / "tierstore").mkdir()
        workers = ("--workers", str(args.workers))
        self.gw = stack.enter_context(gateway(tmp / "tierstore" / "data",
                                              extra_args=(*s3_capacity_args(self.proxy.endpoint), *workers)))
        self.admin = Admin(self.gw.admin_url)
        stack.callback(self.admin.close)
        # The checkout before a change (--old), over the same delayed store (its own prefix).
        self.old = None
        if args.old:
            (tmp / "old").mkdir()
            old_args = s3_capacity_args(self.proxy.endpoint)
            old_args[1] += "/old"
            self.old = stack.enter_context(gateway(tmp / "old" / "data", root=Path(args.old).resolve(),
                                                   extra_args=(*old_args, *workers)))
        for gw in (self.gw, self.old):
            if gw is not None:
                boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=ACCESS_KEY,
                             aws_secret_access_key=SECRET_KEY, region_name=REGION,
                             config=BotoConfig(s3={"addressing_style": "path"})).create_bucket(Bucket=BUCKET)
        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_port}", aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name=REGION).create_bucket(Bucket=BUCKET)

    def gw_pids(self) -> list[int]:
        return self.gw.pids()

    def old_pids(self) -> list[int]:
        assert self.old is not None
        return self.old.pids()

    def put_all(self, port: int, items: Sequence[tuple[str, bytes]]) -> None:
        lean = SignedClient(port)

        def put(item: tuple[str, bytes]) -> None:
            if lean.put(BUCKET, item[0], item[1]) != 200:
                raise RuntimeError(f"PUT {item[0]} on :{port} failed")

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, items))

    def write(self) -> Path:
        """The objects into the gateway (flushed), moto and nginx's root."""
        args = self.args
        log(f"[write] {args.objects:,} objects of {args.size // KiB} KiB: gateway, moto, files ...")
        items = [(key, body_of(i, args.size)) for i, key in enumerate(self.keys)]
        self.put_all(self.gw.port, items)
        self.admin.job("flush")
        if self.old is not None:
            self.put_all(self.old.port, items)
            with contextlib.closing(Admin(self.old.admin_url)) as old_admin:
                old_admin.job("flush")
        self.put_all(self.moto_port, items)
        root = self.tmp / "www"
        for key, data in items:
            path = root / BUCKET / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return root

    def evict(self, old: bool = False) -> None:
        admin = Admin(self.old.admin_url) if old and self.old is not None else self.admin
        admin.job("evict")
        tiers = admin("GET", "/tiers")
        if admin is not self.admin:
            admin.close()
        if tiers["hot_staged"] or tiers["hot_cached"]:
            raise RuntimeError(f"not flushed and evicted: {tiers}")

    def hot(self, nginx: NginxLocal | None) -> None:
        args = self.args
        tar_size = args.batch * (512 + args.size + -args.size % 512) + 1024  # a batch's tar, as the gateway sends it
        bare = self.stack.enter_context(bare_app(tar_size)) if args.bare else None
        floor = None
        if args.bare:  # the same bytes from files of the same size, read as a hot batch reads them
            files = self.tmp / "floor"
            files.mkdir()
            for i, key in enumerate(self.keys):
                (files / key.replace("/", "_")).write_bytes(body_of(i, args.size))
            floor = self.stack.enter_context(bare_app(tar_size, files, args.batch))
        order = shuffled(self.keys, SEED)
        def me() -> list[int]:  # the lean clients' threads
            return [os.getpid()]

        pids = {"server": self.gw_pids, "client": me}
        # Warm-ups, not recorded: each gateway's single GETs and batches once
        # (a first batched epoch pays what later ones find made: kept
        # descriptors, headers, the allocator's room).
        for gw in (self.gw, self.old):
            if gw is not None:
                epoch(SignedClient(gw.port), BUCKET, order, args.readers, args.size, self.check, pids)
                batched_epoch(gw.port, BUCKET, cut(order, args.batch), args.threads, self.check, pids)
        for round_ in range(args.rounds):
            runs: list[tuple[str, Callable[[], dict]]] = [
                ("tierstore, single GETs", lambda: epoch(SignedClient(self.gw.port), BUCKET, order, args.readers,
                                                         args.size, self.check, pids)),
                ("tierstore, batched", lambda: batched_epoch(self.gw.port, BUCKET, cut(order, args.batch),
                                                             args.threads, self.check, pids)),
            ]
            if self.old is not None:
                old = self.old
                runs.append(("tierstore before (--old), batched", lambda: batched_epoch(
                    old.port, BUCKET, cut(order, args.batch), args.threads, self.check,
                    {"server": self.old_pids, "client": me})))
            if bare is not None:
                runs.append(("bare uvicorn app, the same bytes", lambda: bare_epoch(
                    bare.port, -(-len(order) // args.batch), tar_size, args.threads, len(order),
                    {"server": lambda: [bare.proc.pid], "client": me})))
            if floor is not None:
                runs.append((FLOOR, lambda: bare_epoch(
                    floor.port, -(-len(order) // args.batch), tar_size, args.threads, len(order),
                    {"server": lambda: [floor.proc.pid], "client": me})))
            if nginx is not None:
                runs.append(("nginx-local, single GETs", lambda: epoch(
                    PlainClient(nginx.port), BUCKET, order, args.readers, args.size, self.check,
                    {"server": nginx.pids, "client": me})))
            if round_ % 2:  # alternate the order too: no configuration always follows the same one
                runs.reverse()
            for name, measure in runs:
                figures = measure()
                self.results["hot"].append({"config": name, "round": round_} | figures)
                log(f"[hot] round {round_}: {name}: {figures['objects_per_s']:,.0f} objects/s, "
                    f"server {figures['server_cpu_per_1k']:.3f} CPU s per 1,000 objects, "
                    f"client {figures['client_cpu_per_1k']:.3f}")

    def cold(self) -> None:
        args = self.args
        order = shuffled(self.keys, SEED)
        shards = [b for _, b in sorted(zip(shuffled([str(i) for i in range(len(self.keys))], SEED),
                                               cut(self.keys, args.batch)))]  # a shuffled batch order
        pids = {"server": self.gw_pids}
        runs: list[tuple[str, Callable[[], dict]]] = [
            ("tierstore batched, consecutive keys", lambda: batched_epoch(
                self.gw.port, BUCKET, shards, args.threads, self.check, pids)),
            ("tierstore batched, shuffled keys", lambda: batched_epoch(
                self.gw.port, BUCKET, cut(order, args.batch), args.threads, self.check, pids)),
            ("store direct, single GETs", lambda: epoch(
                SignedClient(self.proxy.port), BUCKET, order, args.readers, args.size, self.check,
                {"server": lambda: [self.moto_pid]})),
        ]
        if self.old is not None:
            old = self.old
            runs.insert(1, ("tierstore before (--old) batched, consecutive keys", lambda: batched_epoch(
                old.port, BUCKET, shards, args.threads, self.check, {"server": self.old_pids})))
        for name, measure in runs:
            if name.startswith("tierstore"):
                self.evict(old="(--old)" in name)
            self.proxy.reset()
            figures = measure()
            figures["store_gets"] = self.proxy.snapshot()["operations"].get("GetObject", 0)
            figures["objects_per_store_get"] = figures["objects"] / max(1, figures["store_gets"])
            self.results["cold"].append({"config": name} | figures)
            log(f"[cold] {name}: {figures['objects_per_s']:,.0f} objects/s, {figures['store_gets']:,} store GETs")

    def dataset(self) -> None:
        """110 KiB samples read four ways (all hot)."""
        wds = _webdataset()

        args = self.args
        names = [f"ds/{i:06d}" for i in range(args.samples)]
        data = {f"{n}.jpg": body_of(10_000_000 + i, SAMPLE_SIZE) for i, n in enumerate(names)}
        keys = list(data)
        per = args.shard_samples
        shard_keys = []
        items = list(data.items())
        for number, start in enumerate(range(0, len(keys), per)):
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
                for key in keys[start:start + per]:
                    info = tarfile.TarInfo(key)
                    info.size = len(data[key])
                    archive.addfile(info, io.BytesIO(data[key]))
            shard_keys.append(f"shards/{number:04d}.tar")
            items.append((shard_keys[-1], buffer.getvalue()))
        log(f"[dataset] {args.samples:,} samples of 110 KiB and {len(shard_keys)} tar shards ...")
        self.put_all(self.gw.port, items)
        self.admin.job("flush")
        order = shuffled(keys, SEED)

        def check(key: str, body: bytes) -> None:
            if body != data[key]:
                raise AssertionError(f"{key}: other bytes than were written")

        client = BatchClient(self.gw.endpoint, ACCESS_KEY, SECRET_KEY, REGION)
        virtual = client.virtual_shards(BUCKET, keys, per_shard=per)
        client.close()
        signer = boto3.client("s3", endpoint_url=self.gw.endpoint, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name=REGION,
                              config=BotoConfig(s3={"addressing_style": "path"}))
        real = [signer.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": k}, ExpiresIn=3600)
                for k in shard_keys]

        def dataset_epoch() -> dict:
            index = {k: i for i, k in enumerate(keys)}

            def read(ds: BatchDataset, batch: list[str]) -> None:
                for key, body in ds.__getitems__([index[k] for k in batch]):
                    check(key, body)

            t0 = time.perf_counter()
            take_turns(cut(order, args.batch), args.threads, lambda: BatchDataset(
                BUCKET, keys, endpoint_url=self.gw.endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                transform=lambda k, d: (k, d)), read)
            return {"objects": len(keys), "wall_s": time.perf_counter() - t0}

        def webdataset_epoch(urls: list[str]) -> dict:
            t0 = time.perf_counter()
            count = 0
            for sample in wds.WebDataset(urls, shardshuffle=False):
                check(f"{sample['__key__']}.jpg", sample["jpg"])
                count += 1
            if count != len(keys):
                raise AssertionError(f"WebDataset read {count} samples of {len(keys)}")
            return {"objects": count, "wall_s": time.perf_counter() - t0}

        pids = {"server": self.gw_pids}
        runs: list[tuple[str, Callable[[], dict]]] = [
            ("one GET per sample, 16 lean readers", lambda: epoch(
                SignedClient(self.gw.port), BUCKET, order, args.readers, SAMPLE_SIZE, check, pids)),
            (f"BatchDataset.__getitems__, batches of {args.batch}, {args.threads} threads", dataset_epoch),
            (f"WebDataset, virtual shards of {per}", lambda: webdataset_epoch(virtual)),
            (f"WebDataset, real tar shards of {per}", lambda: webdataset_epoch(real)),
        ]
        for name, measure in runs:
            figures: dict = {}
            with cpu_meter(pids, figures):
                figures |= measure()
            figures["samples_per_s"] = figures["objects"] / figures["wall_s"]
            figures["server_cpu_per_1k"] = figures["server_cpu_s"] * 1000 / figures["objects"]
            self.results["dataset"].append({"config": name} | figures)
            log(f"[dataset] {name}: {figures['samples_per_s']:,.0f} samples/s")


def run(args: argparse.Namespace) -> dict:
    with contextlib.ExitStack() as stack:
        r = Run(args, stack)
        root = r.write()
        nginx = None
        try:
            nginx = stack.enter_context(NginxLocal(r.tmp / "nginx", root))
        except Exception as exc:  # noqa: BLE001  reported: the run goes on without it
            r.results["skipped"]["nginx-local"] = str(exc)
            log(f"[nginx-local] skipped: {exc}")
        if "hot" in args.parts:
            r.hot(nginx)
        if "cold" in args.parts:
            r.cold()
        if "dataset" in args.parts:
            r.dataset()
        return r.results


# -- report ---------------------------------------------------------------------------


FLOOR = "floor: the files read and sent, nothing else"


def _best(rows: list[dict], config: str) -> dict | None:
    mine = [r for r in rows if r["config"] == config]
    return max(mine, key=lambda r: r["objects_per_s"]) if mine else None


def _median(rows: list[dict], config: str, field: str = "objects_per_s") -> float:
    return float(statistics.median(r[field] for r in rows if r["config"] == config))


def report(args: argparse.Namespace, r: dict) -> str:
    out = [f"# Batch GET: {args.objects:,} objects of {args.size // KiB} KiB, store +{args.latency_ms:.0f} ms, "
           f"--workers {args.workers}",
           "", machine(), ""]
    single, batched = _best(r["hot"], "tierstore, single GETs"), _best(r["hot"], "tierstore, batched")
    nginx = _best(r["hot"], "nginx-local, single GETs")
    before = _best(r["hot"], "tierstore before (--old), batched")
    rows = []
    for row in r["hot"]:
        rows.append([row["config"], row["round"], f"{row['objects_per_s']:,.0f}", f"{row['mib_per_s']:,.0f}",
                     f"{row['server_cpu_per_1k']:.3f}", f"{row['client_cpu_per_1k']:.3f}"])
    if r["hot"]:
        out += [f"## Hot, shuffled order ({args.readers} single-GET readers; batches of {args.batch} from "
                f"{args.threads} threads), {args.rounds} rounds", "",
                table(["config", "round", "objects/s", "MiB/s", "server CPU ms/object", "client CPU ms/object"],
                      rows), ""]
    for name, other in (("single GETs", single), ("nginx-local single GETs", nginx), ("batched before", before)):
        if batched and other:
            out.append(f"- batched / {name} (best rounds): x{batched['objects_per_s'] / other['objects_per_s']:.1f}; "
                       f"median of rounds: x{_median(r['hot'], 'tierstore, batched') / _median(r['hot'], other['config']):.1f}")
    if batched and before:
        out.append("- server CPU per object, batched / batched before (medians): x"
                   f"{_median(r['hot'], 'tierstore, batched', 'server_cpu_per_1k') / _median(r['hot'], before['config'], 'server_cpu_per_1k'):.2f}")
    floor = _best(r["hot"], FLOOR)
    if floor and single and batched:
        out.append(f"- floor / single GETs (median of rounds): x{_median(r['hot'], FLOOR) / _median(r['hot'], single['config']):.1f}: "
                   "the most a batch on this stack reaches with these clients; server CPU per object, batched / floor "
                   f"(medians): x{_median(r['hot'], 'tierstore, batched', 'server_cpu_per_1k') / _median(r['hot'], FLOOR, 'server_cpu_per_1k'):.2f}")
    if "nginx-local" in r["skipped"]:
        out.append(f"- nginx-local skipped: {r['skipped']['nginx-local']}")
    rows = [[row["config"], f"{row['objects_per_s']:,.0f}", f"{row['store_gets']:,}",
             f"{row['objects_per_store_get']:.1f}", f"{row['server_cpu_per_1k']:.2f}"] for row in r["cold"]]
    if rows:
        out += ["", "## Cold (evicted), store +%.0f ms" % args.latency_ms, "",
                table(["config", "objects/s", "store GETs", "objects per store GET", "server CPU s / 1,000"], rows), ""]
    direct = next((x for x in r["cold"] if x["config"] == "store direct, single GETs"), None)
    for row in r["cold"]:
        if direct and row is not direct:
            out.append(f"- {row['config']} / store direct: x{row['objects_per_s'] / direct['objects_per_s']:.1f}")
    rows = [[row["config"], f"{row['samples_per_s']:,.0f}", f"{row['server_cpu_per_1k']:.2f}"] for row in r["dataset"]]
    if rows:
        out += ["", f"## A data set of {args.samples:,} samples of 110 KiB, hot", "",
                table(["read as", "samples/s", "gateway CPU s / 1,000 samples"], rows), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 objects, 500 samples, 1 round")
    ap.add_argument("--objects", type=int, help="64 KiB objects (default 4000; --quick 1000)")
    ap.add_argument("--size", type=int, default=64 * KiB, help="object bytes (65536)")
    ap.add_argument("--batch", type=int, default=64, help="keys per batch (64)")
    ap.add_argument("--threads", type=int, default=4, help="batched reader threads (4)")
    ap.add_argument("--readers", type=int, default=16, help="single-GET reader threads (16)")
    ap.add_argument("--rounds", type=int, help="hot rounds, alternating the configurations (2; --quick 1)")
    ap.add_argument("--samples", type=int, help="110 KiB samples of the data set part (1000; --quick 500)")
    ap.add_argument("--shard-samples", type=int, default=64, help="samples per shard (64)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="added to each store request (20)")
    ap.add_argument("--old", help="another checkout whose gateway's batched epoch joins the hot rounds")
    ap.add_argument("--bare", action="store_true",
                    help="add a bare uvicorn app answering a batch's bytes to the hot rounds (the stack's floor)")
    ap.add_argument("--parts", default="hot,cold,dataset", help="which parts to run (hot,cold,dataset)")
    ap.add_argument("--workers", default="1", help="the gateways' --workers (1)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    args.parts = args.parts.split(",")
    if set(args.parts) - {"hot", "cold", "dataset"}:
        ap.error(f"--parts: unknown {', '.join(sorted(set(args.parts) - {'hot', 'cold', 'dataset'}))}")
    args.objects = args.objects or (1000 if args.quick else 4000)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.samples = args.samples or (500 if args.quick else 1000)
    return run_and_report(args, run, report)


if __name__ == "__main__":
    sys.exit(main())
