"""Epochs of a mounted data set that outlast the mount's freshness window,
side by side with nginx serving the same files from local disk.

A mounted bucket (docs/architecture.md, "Mounted buckets"): a data set already in S3 is mounted
(``POST /mounts``, the defaults but for ``--freshness``), and epochs read
it in a shuffled order. Once an epoch takes longer than the freshness
window, every object it reads was validated longer ago than that: unless
revalidation stays out of the way, a "warm" epoch pays a store round trip
per object. This measures that: each warm epoch's objects/s, its ratio to
nginx-local's epoch in the same round, and the store requests it caused,
by operation (counted by the delay proxy), against the epoch's length and
the window.

Started on 127.0.0.1, each stopped by its PID at the end, temp dirs
removed: moto (or with ``--store rclone``, ``rclone serve s3`` of a
directory: a faster S3 server, with keep-alive) behind
``delay_proxy.DelayProxy`` (``--latency-ms``, 20),
the gateway on its defaults, nginx-local (when nginx is installed or can
be installed with apt-get). ``--objects`` (20,000; ``--quick`` 2,000)
objects of ``--size`` (64 KiB) are put straight into moto and written as
files for nginx. Then a cold epoch, and ``--warm`` (3) rounds of a warm
epoch and an nginx-local epoch (the order alternating), each epoch a new
shuffled order read by ``--readers`` (16) lean readers; first of all, the store read
directly by the same readers (one keep-alive
connection each, SigV4 by a cached key, nginx's too: the issue's readers
sign every GET, whichever server they read).

Each warm round also reads the epoch from ``bare``: an ASGI app on uvicorn
answering every GET with ``--size`` constant bytes (benchmarks/_bare_app.py,
as in ab.py), through the same signed readers. It does nothing an S3 app
must do, so its ratio to nginx-local in the same round is the most any
app on this stack can reach in this epoch on this machine.

``--floor`` reads the cold epoch a second time, right after the gateway's,
through ``floor``: an ASGI app on uvicorn that verifies each reader's
SigV4, fetches the object with one signed ranged GET over the gateway's
own lean getter (through the same proxy), hands its bytes to a writer
thread that appends them to a file, and answers
(benchmarks/_cold_floor.py). It keeps no index, no record, no hot tier,
no log and no metrics: its CPU per GET is the least a gateway written on
this stack spends on a cold miss, on this machine, in this run.

``--hot-fs ext4`` puts the gateway's data dir on an ext4 made for the
run (``_common.data_filesystem``: creating a file on this machine's root
filesystem costs 20 to 40 times what it costs on a new one).

``--uri-keys`` names every object ``s3://mounted/<key>`` (DLIO's way):
with ``--hinted`` it shows hints taken literally for such keys.

``--pin`` gives the servers under test a core of their own (the last),
the readers and the store the others: the gateway's CPU per request
without being preempted by the load (docs/benchmarks/cold-path.md).

Beside each server's CPU per 1,000 GETs, the table gives the store's: its
own GETs when the readers read it directly, the GETs the gateway sent it
in the cold (and hinted) epochs. A miss's CPU is best read against it:
on a small machine every process's CPU per request moves with the load
(``--readers``), the store's as much as the gateway's
(docs/benchmarks/cold-miss-whole-process.md).

Run:  .venv/bin/python benchmarks/mounted_epoch.py [--quick] [--freshness 5] [--hot-fs ext4] [--hinted --uri-keys] [--pin] [--floor] [--old ../other-checkout --pairs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _common  # first: puts the repo root on sys.path
from _cold_floor import cold_floor
from _common import (
    data_filesystem,
    gateway,
    machine,
    pin_apart,
    process_cpu,
    table,
    temp_dir,
    write_results,
)
from _compare_client import SignedClient
from _compare_peers import NginxLocal, RcloneStore, ensure_nginx
from _compare_workloads import epoch
from _epoch_workload import Admin, body_of, checker, key_of
from _moto import MOTO_KEY, DelayedMoto, delayed_moto, moto_client
from ab import bare_app
from delay_proxy import DelayProxy

from tests.servers import children

SOURCE = "source"  # the bucket in moto
PREFIX = "set"  # the data set's prefix in it
MOUNTED = "mounted"  # the gateway's bucket
KiB = 1024


def put_source(endpoint: str | None, keys: list[str], size: int, www: Path, files: Path | None,
               checksum: str | None = None) -> None:
    """The data set into the S3 store at ``endpoint`` (moto with no delay,
    or rclone; with ``checksum``, each PUT carries one, which the store
    keeps), or as files under ``files`` (rclone's root); for nginx, into
    ``www/mounted``."""
    s3 = moto_client(endpoint) if endpoint else None
    if s3 is not None:
        s3.create_bucket(Bucket=SOURCE)
    extra = {"ChecksumAlgorithm": checksum} if checksum else {}

    def put(i: int) -> None:
        body = body_of(i, size)
        if s3 is not None:
            s3.put_object(Bucket=SOURCE, Key=f"{PREFIX}/{keys[i]}", Body=body, **extra)
        for path in [www / MOUNTED / keys[i]] + ([files / SOURCE / PREFIX / keys[i]] if files else []):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(len(keys))))


def store_requests(before: dict, after: dict) -> dict[str, int]:
    """Requests by S3 operation, and connections opened, between two proxy snapshots."""
    ops = after["operations"]
    counts = {op: n - before["operations"].get(op, 0) for op, n in ops.items() if n - before["operations"].get(op, 0)}
    if after["connections"] > before["connections"]:
        counts["connections"] = after["connections"] - before["connections"]
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2,000 objects")
    ap.add_argument("--objects", type=int, help="objects in the data set (20,000; --quick 2,000)")
    ap.add_argument("--size", type=int, default=64 * KiB)
    ap.add_argument("--readers", type=int, default=16)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--freshness", type=int, default=60, help="the mount's freshness, seconds (60, its default)")
    ap.add_argument("--warm", type=int, default=3, help="rounds of a warm epoch and nginx-local's (3)")
    ap.add_argument("--store", choices=("moto", "rclone"), default="moto",
                    help="the S3 server holding the data set: moto (default) or rclone serve s3 of a directory")
    ap.add_argument("--hot-fs", choices=("root", "ext4"), default="root",
                    help="the gateway's data dir on the temp dir's filesystem (root, default) or on a new "
                         "ext4 made for the run (a loop image: root only), as a node's own NVMe would be")
    ap.add_argument("--checksum", choices=("none", "CRC32", "CRC64NVME"), default="none",
                    help="objects PUT with this checksum, which the gateway checks instead of the MD5 ETag "
                         "(none: rclone's files written into its directory, moto's PUT with boto3's defaults)")
    ap.add_argument("--hinted", action="store_true",
                    help="also a cold epoch registered with POST /epochs just before, read from a shared queue "
                         "and then with interleaved readers (each on a new mount of the same source)")
    ap.add_argument("--uri-keys", action="store_true",
                    help="name every object by its whole URI, s3://mounted/<key>, as MLPerf Storage's DLIO does: "
                         "keys the gateway must take literally (hints included)")
    ap.add_argument("--pin", action="store_true",
                    help="the servers under test (the gateway, nginx-local, bare) on the last core, the readers "
                         "and the store on the others: each server's CPU per request without the preemptions "
                         "by the load that shares its core (the cold epochs' ratios to the store read "
                         "directly are then left out: that epoch had a core fewer)")
    ap.add_argument("--floor", action="store_true",
                    help="read the cold epoch again through the floor of a cold miss (benchmarks/_cold_floor.py)")
    ap.add_argument("--old", type=Path,
                    help="another checkout: its gateway beside this one's, and --pairs rounds of a cold epoch "
                         "on each (a new mount of the same source each time, the order alternating), so two "
                         "versions' cold misses are compared in the same run by the same harness")
    ap.add_argument("--pairs", type=int, default=3, help="rounds of cold epochs with --old (3)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    _common.begin()
    objects = args.objects or (2000 if args.quick else 20000)
    keys = [(f"s3://{MOUNTED}/" if args.uri_keys else "") + key_of(i) for i in range(objects)]
    check = checker(args.size)

    def same_size(key: str, body: bytes) -> None:  # the bare app's bytes are its own
        if len(body) != args.size:
            raise AssertionError(f"{key}: {len(body)} bytes, expected {args.size}")

    results: dict[str, dict] = {}
    nginx = ensure_nginx()
    with temp_dir("mounted-epoch") as tmp, contextlib.ExitStack() as stack:
        print(f"putting {objects:,} objects into the store ({args.store}) ...", flush=True)
        if args.store == "moto":
            moto = stack.enter_context(delayed_moto(args.latency_ms))
            put_source(moto.endpoint, keys, args.size, tmp / "www", None,
                       None if args.checksum == "none" else args.checksum)
        elif args.checksum == "none":  # the files first: rclone serves the directory as it finds it
            put_source(None, keys, args.size, tmp / "www", tmp / "store")
            rclone = stack.enter_context(RcloneStore(tmp / "rclone", tmp / "store"))  # started by entering
        else:  # PUT through rclone's S3 API, each object with its checksum
            (tmp / "store").mkdir()
            rclone = stack.enter_context(RcloneStore(tmp / "rclone", tmp / "store"))  # started by entering
            put_source(rclone.endpoint, keys, args.size, tmp / "www", None, args.checksum)
        if args.store == "rclone":
            proxy = stack.enter_context(DelayProxy(rclone.port))
            proxy.delay_s = args.latency_ms / 2000
            moto = DelayedMoto(rclone.endpoint, rclone.proc.pid, proxy)  # type: ignore[union-attr]
        hot_fs = stack.enter_context(data_filesystem(args.hot_fs, tmp))
        gw = stack.enter_context(gateway(hot_fs / "data"))
        admin = Admin(gw.admin_url)
        stack.callback(admin.close)

        def mount(admin: Admin, name: str) -> None:
            admin("POST", "/mounts", json={
                "name": name, "source": f"s3://{SOURCE}/{PREFIX}", "endpoint": moto.proxy.endpoint,
                "access_key": MOTO_KEY, "secret_key": MOTO_KEY, "freshness": args.freshness,
            })

        mount(admin, MOUNTED)
        old = stack.enter_context(gateway(hot_fs / "data-old", root=args.old.resolve())) if args.old else None
        local = stack.enter_context(NginxLocal(tmp / "nginx-local", tmp / "www")) if nginx else None
        bare = stack.enter_context(bare_app(args.size))
        floor_stack = stack.enter_context(contextlib.ExitStack())  # closed after its epoch: its file's pages go
        floor = floor_stack.enter_context(cold_floor(moto.proxy.endpoint, SOURCE, PREFIX, tmp / "floor")) if args.floor else None
        gw_pids = {"server": gw.pids, "moto": lambda: [moto.pid]}
        lean = SignedClient(gw.port)
        if args.pin:  # the others: the readers and the delay proxy (threads of this process), the store
            pin_apart([*gw.pids(), bare.proc.pid, *(local.pids() if local else []),
                       *([floor.proc.pid] if floor else []),
                       *(old.pids() if old else [])],
                      [os.getpid(), moto.pid])

        def run(name: str, client, pids, seed: int, bucket: str = MOUNTED, prefix: str = "",  # type: ignore[no-untyped-def]
                check=check, shared: bool = False, hinted: bool = False) -> dict:
            order = [prefix + key for key in keys]
            random.Random(seed).shuffle(order)
            before = moto.proxy.snapshot()
            pids = {**pids, "client": lambda: [os.getpid()]}  # the readers: this process
            if hinted:  # registered just before, as a trainer's sampler would
                epoch_id = admin("POST", "/epochs", json={"bucket": bucket, "keys": order,
                                                          "readers": args.readers})["id"]
            figures = epoch(client, bucket, order, args.readers, args.size, check, pids, shared=shared)
            if hinted:
                status = admin("GET", f"/epochs/{epoch_id}")
                figures["hints"] = {k: status[k] for k in ("hits", "late", "misses", "prefetched_objects")}
            figures["store"] = store_requests(before, moto.proxy.snapshot())
            results[name] = figures
            print(f"{name}: {figures['objects_per_s']:,.0f} objects/s in {figures['wall_s']:.1f} s, "
                  f"store {figures['store']}", flush=True)
            return figures

        run("the store directly", SignedClient(moto.proxy.port), {"server": lambda: [moto.pid, *children(moto.pid)]}, seed=0,
            bucket=SOURCE, prefix=f"{PREFIX}/")
        run("tierstore cold", lean, gw_pids, seed=0)
        if old is not None:
            old_admin = Admin(old.admin_url)
            stack.callback(old_admin.close)
            old_client = SignedClient(old.port)
            old_pids = {"server": old.pids, "moto": lambda: [moto.pid]}
            sides = [("new", admin, lean, gw_pids), ("old", old_admin, old_client, old_pids)]
            # The old gateway reads the first cold epoch too: both hold as much
            # (hot tier, index, caches) when the pairs begin.
            mount(old_admin, MOUNTED)
            run("old cold 0", old_client, old_pids, seed=0)
            for r in range(1, args.pairs + 1):
                for side, side_admin, client, pids in sides if r % 2 else sides[::-1]:
                    mount(side_admin, f"{MOUNTED}-c{r}")  # a new mount: every object cold again
                    run(f"{side} cold {r}", client, pids, seed=100 + r, bucket=f"{MOUNTED}-c{r}")
        if floor is not None:  # the same order: the store's side as warm as it was for the gateway's, or warmer
            run("floor cold", SignedClient(floor.port), {"server": lambda: [floor.proc.pid], "moto": lambda: [moto.pid]},
                seed=0)
            floor_stack.close()
        for r in range(1, args.warm + 1):
            pair = [("tierstore", lean, gw_pids, check)]
            if local is not None:
                pair.append(("nginx-local", SignedClient(local.port), {"server": local.pids}, check))
            pair.append(("bare", SignedClient(bare.port), {"server": lambda: [bare.proc.pid]}, same_size))
            for name, client, pids, checks in pair if r % 2 else pair[::-1]:
                run(f"{name} warm {r}", client, pids, seed=r, check=checks)
        # Last: each on a mount of its own over the same source (cold too),
        # whose fills may evict the first mount's pieces.
        if args.hinted:
            for name, shared in (("tierstore cold hinted, shared queue", True),
                                 ("tierstore cold hinted, interleaved", False)):
                bucket = MOUNTED + ("-hq" if shared else "-hi")
                mount(admin, bucket)
                run(name, lean, gw_pids, seed=0, bucket=bucket, shared=shared, hinted=True)
        cpu = process_cpu(gw.proc.pid)

    rows = []
    for name, f in results.items():
        r = name.rsplit(" ", 1)[-1]
        peer = results.get(f"nginx-local warm {r}")
        if name.startswith(("tierstore cold", "floor cold", "new cold", "old cold")):  # against the store read directly, which had a core fewer when pinned
            peer = None if args.pin else results["the store directly"]
        ratio = (f"{f['objects_per_s'] / peer['objects_per_s']:.2f}x"
                 if peer and name.startswith(("tierstore", "bare", "floor", "new", "old")) else "-")
        # The store's CPU for the same epoch: its own GETs' cost beside the gateway's (per 1k objects read).
        store_cpu = f.get("moto_cpu_per_1k", f["server_cpu_per_1k"] if name == "the store directly" else None)
        rows.append([name, f"{f['objects_per_s']:,.0f}", f"{f['wall_s']:.1f}", f"{f['p50_ms']:.1f}",
                     f"{f['p99_ms']:.1f}", ratio, f"{f['server_cpu_per_1k']:.3f}",
                     "-" if store_cpu is None else f"{store_cpu:.3f}", f"{f['client_cpu_per_1k']:.3f}",
                     ", ".join(f"{op} {n}" for op, n in sorted(f["store"].items())) or "0"])
        if "hints" in f:
            print(f"{name}: GET /epochs/{{id}} after it: {f['hints']}")
    print(machine())
    print(f"mounted data set of {objects:,} x {args.size:,} B, store {args.store} +{args.latency_ms:g} ms, "
          f"freshness {args.freshness} s, {args.readers} lean readers, a new shuffled order each epoch, "
          f"hot tier on the {args.hot_fs} filesystem"
          + (", servers pinned to a core of their own (cold ratios left out)" if args.pin else ""))
    print(table(["epoch", "objects/s", "seconds", "p50 ms", "p99 ms", "x nginx-local (same round); cold: x the store",
                 "server CPU s / 1k GETs", "store CPU s / 1k GETs", "client CPU s / 1k GETs", "store requests"],
                rows))
    print(f"(gateway CPU over the run: {cpu:.1f} s)")
    if args.old:
        for side in ("new", "old"):
            ms = [results[f"{side} cold {r}"]["server_cpu_per_1k"] for r in range(1, args.pairs + 1)]
            print(f"{side} ({'this checkout' if side == 'new' else args.old}): gateway ms per cold miss, round by round: "
                  + ", ".join(f"{m:.3f}" for m in ms) + f"; mean {sum(ms) / len(ms):.3f}")
    write_results(args, {"objects": objects, "freshness": args.freshness, "pinned": args.pin, "epochs": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
