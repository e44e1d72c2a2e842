"""One large object read whole, cold and hot: two checkouts of tierstore,
the store's own stream and nginx, in alternating rounds.

Servers, each a subprocess on a free 127.0.0.1 port: the capacity store
(``--store rclone``: ``rclone serve s3`` of a local directory, the default;
``--store moto``), the delay proxy in front of it (benchmarks/delay_proxy.py
in a process of its own, ``--latency-ms`` added to a round trip, half each
way), nginx serving the object from a file (``sendfile on``, one worker),
and one gateway per checkout (``--new``, this one by default; ``--old``,
e.g. a ``git worktree`` of the commit before a change), each over its own
prefix of one store bucket, through the proxy.

The same ``--size-mib`` of random bytes is PUT through each gateway and
flushed (extents of 8 MiB in the store), and written into the store as one
object. Then, after one round that is not counted (the store meets its
files: rclone's first ranged reads of a new file are several times slower
than the next ones), ``--rounds`` rounds, the order of the servers
reversed every round. In a round, for each gateway: every cached extent
evicted, one whole GET (cold), then, once the cold GET's cache fills are
written, ``--hot-gets`` whole GETs one after the other (hot); one whole GET
of the store's object through the proxy (direct); the same ``--hot-gets``
GETs from nginx. Hot GETs are timed in threes by default: one of 256 MiB
from the page cache takes about 0.1 s, short enough for one scheduling
hiccup on a shared machine to move it by half. Dirty pages are written
back (``sync``) before each GET, outside its time: no GET pays for the
writeback of files another wrote, and the hot GETs find their cache files
as a later epoch would, written back (nginx's file was written at the
start).

Every GET is one keep-alive HTTP/1.1 request read into one preallocated
buffer (the client's cost is a copy per byte, the same for every server),
checked against the object's CRC after the clock stops. Per GET: MiB/s and
the CPU (user + system, from /proc) of the server's processes: the gateway
and its children, nginx's master and worker, the store and the proxy.

With ``--mounted``, the gateways do not PUT the object: each mounts the
store's bucket (through the proxy) and reads the object there, as a data
set already in S3 is read. Cold is then a first touch: the mount made
anew before the GET (nothing cached, nothing described), hot the GETs
after it. ``--objects N`` (1) reads N objects of ``--size-mib`` at once,
one thread each, cold and hot: each GET's MiB/s is set against one direct
stream of one object alone, the peer a user would otherwise have.

Reported per gateway: cold against the direct stream of the same round,
hot against nginx of the same round (each round's ratio, and the median),
and the gateway's CPU per GET; with ``--old``, new over old.

``--ceiling`` adds to each round the objects read straight from the
store the way a gateway's cold read fetches them (``--ceiling-mib`` ranges,
8 by default, every one at once, a connection each, through the proxy)
with no gateway in between, against the direct stream of the same round:
what the store, the proxy and a reader make of this machine's cores when
nothing else runs, the most any gateway could deliver cold here.

Run:  .venv/bin/python benchmarks/large_object.py [--old ../old-checkout] [--rounds 5]
      .venv/bin/python benchmarks/large_object.py --mounted --size-mib 64 --objects 2 [--ceiling [--ceiling-mib 8]]
      .venv/bin/python benchmarks/large_object.py --mounted --size-mib 1024 --pin   (hot GETs, servers on their own core)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path

import _common  # first: puts the repo root on sys.path
from _common import REGION, gateway, machine, pin_apart, process_cpu, table, temp_dir
from _compare_peers import NginxLocal, RcloneStore, wait_port
from _moto import MOTO_KEY, moto_client
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.servers import ACCESS_KEY, SECRET_KEY, Gateway, free_port, stop_process

MiB = 1024 * 1024
BUCKET = "bench"  # in the store: each gateway's segments under its prefix, and the direct object
KEY = "large.bin"
MOUNT = "mnt"  # the gateway bucket that mounts the store's BUCKET, with --mounted
HERE = Path(__file__).resolve().parent
PIECE_MIB = 8  # a mounted object's piece (the gateway's default): --ceiling's ranges unless told


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Reader:
    """Whole GETs over one keep-alive connection into one buffer; SigV4
    (botocore's signer, a millisecond a request) unless ``signed`` is False."""

    def __init__(self, port: int, size: int, signed: bool = True, keys: tuple[str, str] = (ACCESS_KEY, SECRET_KEY),
                 buffer: bytearray | None = None):
        self.port = port
        self.buffer = bytearray(size) if buffer is None else buffer
        self._signer = S3SigV4Auth(Credentials(*keys), "s3", REGION) if signed else None
        self._conn: HTTPConnection | None = None
        self.first_s = 0.0

    def get(self, bucket: str, key: str, part: tuple[int, int] | None = None) -> tuple[float, int]:
        """(seconds, CRC-32 of the body) of one GET of the whole object, or
        with ``part`` (start, end exclusive) of that range, read into the
        same place of the buffer; ``first_s``: seconds to its head (sent
        with the first body bytes)."""
        path = f"/{bucket}/{key}"
        start, end = part or (0, len(self.buffer))
        headers = {"Range": f"bytes={start}-{end - 1}"} if part else {}
        if self._signer is not None:
            request = AWSRequest(method="GET", url=f"http://127.0.0.1:{self.port}{path}", headers=headers)
            self._signer.add_auth(request)
            headers = dict(request.headers.items())
        view, size = memoryview(self.buffer)[start:end], end - start
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = HTTPConnection("127.0.0.1", self.port, timeout=600)
            try:
                t0 = time.perf_counter()
                self._conn.request("GET", path, headers=headers)
                response = self._conn.getresponse()
                self.first_s = time.perf_counter() - t0
                break
            except (ConnectionError, OSError):  # a kept connection the server closed
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise
        if response.status not in ((200, 206) if part else (200,)):  # rclone answers a range with 200
            raise RuntimeError(f"GET {path} on :{self.port}: {response.status} {response.read()[:300]!r}")
        got = 0
        while got < size and (n := response.readinto(view[got:])):
            got += n
        seconds = time.perf_counter() - t0
        if got != size or response.read(1):
            raise RuntimeError(f"GET {path} on :{self.port}: {got:,} bytes, expected {size:,}")
        return seconds, zlib.crc32(view)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


@contextlib.contextmanager
def store(kind: str, tmp: Path) -> Iterator[tuple[int, list[int], Path | None]]:
    """(port, pids, root) of the capacity store with BUCKET in it; root is
    rclone's directory (None for moto)."""
    if kind == "rclone":
        root = tmp / "store-root"
        (root / BUCKET).mkdir(parents=True)
        with RcloneStore(tmp / "rclone-store", root) as rclone:
            assert rclone.proc is not None
            yield rclone.port, [rclone.proc.pid], root
        return
    from _moto import moto_store  # noqa: PLC0415  moto only when asked for

    with moto_store() as (port, pid):
        yield port, [pid], None


@contextlib.contextmanager
def delay_proxy(target: int, latency_ms: float) -> Iterator[tuple[int, int]]:
    """(port, pid) of benchmarks/delay_proxy.py forwarding to ``target``,
    in a process of its own (not sharing the client's interpreter)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "delay_proxy.py"), "--target", str(target), "--port", str(port),
         "--delay-ms", str(latency_ms / 2)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
        yield port, proc.pid
    finally:
        stop_process(proc, timeout=15)


def cpu_of(pids: Callable[[], list[int]]) -> float:
    return sum(process_cpu(pid) for pid in pids())


def at_once(calls: list[Callable[[], object]]) -> None:
    """Run ``calls`` each on a thread of its own, all at once; the first
    error raised by one of them is raised here once all have ended."""
    with ThreadPoolExecutor(len(calls)) as threads:
        for running in [threads.submit(call) for call in calls]:
            running.result()


def timed(readers: list[Reader], bucket: str, keys: list[str], pids: Callable[[], list[int]], crc: int,
          size: int, gets: int = 1) -> dict:
    """``gets`` whole GETs one after the other by each reader, the readers
    at once (reader i reads ``keys[i]``): the median reader's MiB/s over
    its GETs, the server's CPU seconds and the time to the first head, per
    GET."""
    rates, firsts = [0.0] * len(readers), [0.0] * len(readers)

    def read(i: int) -> None:
        seconds = 0.0
        for _ in range(gets):
            took, got = readers[i].get(bucket, keys[i])
            if got != crc:
                raise RuntimeError(f"GET {bucket}/{keys[i]} on :{readers[i].port} returned other bytes")
            seconds += took
            firsts[i] = firsts[i] or readers[i].first_s
        rates[i] = gets * size / MiB / seconds if seconds else 0.0

    before = cpu_of(pids)
    at_once([functools.partial(read, i) for i in range(len(readers))])
    cpu = (cpu_of(pids) - before) / gets / len(readers)
    mib_s = statistics.median(rates)
    return {"s": size / MiB / mib_s, "mib_s": mib_s, "cpu_s": cpu, "first_s": statistics.median(firsts)}


def timed_pieces(readers: list[list[Reader]], keys: list[str], store_pids: list[int], proxy_pid: int, crc: int,
                 size: int, piece: int) -> dict:
    """Each object of ``keys`` read straight from the store in ``piece``-sized
    ranged GETs, every piece of every object at once (reader [i][p] reads
    piece p of ``keys[i]`` into object i's buffer), as a gateway's cold
    read fetches them: the median object's MiB/s (its last piece's end),
    the store's CPU, the proxy's and this process's (the readers'), per
    round."""
    done = [[0.0] * len(row) for row in readers]
    t0 = time.perf_counter()

    def read(i: int, p: int) -> None:
        readers[i][p].get(BUCKET, keys[i], (p * piece, min(size, (p + 1) * piece)))
        done[i][p] = time.perf_counter() - t0

    processes = {"store": lambda: store_pids, "proxy": lambda: [proxy_pid], "client": lambda: [os.getpid()]}
    before = {name: cpu_of(pids) for name, pids in processes.items()}
    at_once([functools.partial(read, i, p) for i, row in enumerate(readers) for p in range(len(row))])
    cpu = {f"{name}_cpu_s": cpu_of(pids) - before[name] for name, pids in processes.items()}
    for i, row in enumerate(readers):
        if zlib.crc32(row[0].buffer) != crc:
            raise RuntimeError(f"ranged GETs of {keys[i]} from the store returned other bytes")
    mib_s = statistics.median(size / MiB / max(row) for row in done)
    return {"s": size / MiB / mib_s, "mib_s": mib_s, "wall_s": max(map(max, done)), **cpu}


def settled(gw: Gateway, size: int, timeout: float = 10.0) -> None:
    """Until the cold GET's cache fills are written (a hot GET reads files)."""
    deadline = time.monotonic() + timeout
    while gw.admin("GET", "/tiers").json()["hot_cached"] < size and time.monotonic() < deadline:
        time.sleep(0.05)


def mount(gw: Gateway, proxy: str) -> None:
    """(Re)mount the store's BUCKET as MOUNT: nothing cached or described."""
    if any(m["name"] == MOUNT for m in gw.admin("GET", "/mounts").json()["mounts"]):
        gw.admin("DELETE", f"/mounts/{MOUNT}")
    gw.admin("POST", "/mounts", json={"name": MOUNT, "source": f"s3://{BUCKET}", "endpoint": proxy,
                                      "access_key": MOTO_KEY, "secret_key": MOTO_KEY})


def put_through(gw: Gateway, data: bytes, key: str) -> None:
    s3 = _common.client(gw.endpoint)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    gw.run_job("flush")


def run(args: argparse.Namespace) -> dict:
    size = args.size_mib * MiB
    data = os.urandom(size)
    crc = zlib.crc32(data)
    checkouts = [("new", Path(args.new).resolve())] + ([("old", Path(args.old).resolve())] if args.old else [])
    results: dict = {"rounds": [], "size": size, "store": args.store, "latency_ms": args.latency_ms,
                     "objects": args.objects, "mounted": args.mounted, "ceiling_mib": args.ceiling_mib}
    with temp_dir("large") as tmp, contextlib.ExitStack() as stack:
        store_port, store_pids, root = stack.enter_context(store(args.store, tmp))
        proxy_port, proxy_pid = stack.enter_context(delay_proxy(store_port, args.latency_ms))
        proxy = f"http://127.0.0.1:{proxy_port}"
        keys = [KEY] if args.objects == 1 else [f"large-{i}.bin" for i in range(args.objects)]
        for key in keys:  # the same bytes under each key: one CRC checks every GET
            if root is not None:
                (root / BUCKET / key).write_bytes(data)
            else:
                moto_client(f"http://127.0.0.1:{store_port}").put_object(Bucket=BUCKET, Key=key, Body=data)
        www = tmp / "www"
        (www / BUCKET).mkdir(parents=True)
        for key in keys:
            (www / BUCKET / key).write_bytes(data)
        nginx = stack.enter_context(NginxLocal(tmp / "nginx", www))
        gateways: dict[str, Gateway] = {}
        for name, checkout in checkouts:
            (tmp / name).mkdir()
            gw = stack.enter_context(gateway(
                tmp / name / "data", root=checkout, extra_args=(
                    "--capacity", f"s3://{BUCKET}/{name}", "--capacity-endpoint", proxy,
                    "--capacity-access-key", MOTO_KEY, "--capacity-secret-key", MOTO_KEY)))
            if args.mounted:
                mount(gw, proxy)
            else:
                for key in keys:
                    put_through(gw, data, key)
            gateways[name] = gw
        del data
        bucket = MOUNT if args.mounted else BUCKET
        readers = {name: [Reader(gw.port, size) for _ in keys] for name, gw in gateways.items()}
        readers["direct"] = [Reader(proxy_port, size, keys=(MOTO_KEY, MOTO_KEY))]
        readers["nginx"] = [Reader(nginx.port, size, signed=False) for _ in keys]
        pieces: list[list[Reader]] = []
        if args.ceiling:  # per object, one buffer and a reader (a connection) per piece
            for _ in keys:
                buffer = bytearray(size)
                pieces.append([Reader(proxy_port, size, keys=(MOTO_KEY, MOTO_KEY), buffer=buffer)
                               for _ in range(-(-size // (args.ceiling_mib * MiB)))])
        pids: dict[str, Callable[[], list[int]]] = {
            name: gw.pids for name, gw in gateways.items()}
        pids["direct"] = lambda: store_pids
        pids["nginx"] = nginx.pids
        store_and_proxy = lambda: [*store_pids, proxy_pid]  # noqa: E731
        if args.pin:  # the servers on a core of their own, the readers, the store and the proxy on the rest
            pin_apart([pid for name in gateways for pid in pids[name]()] + nginx.pids(), [os.getpid(), *store_and_proxy()])

        def one_round() -> dict:
            figures: dict = {}
            order = [*gateways, "direct", "nginx", *(["ceiling"] if args.ceiling else [])]
            if len(results["rounds"]) % 2:
                order.reverse()
            for name in order:
                reader = readers.get(name, [])
                os.sync()  # no GET pays for the writeback of another's files
                if name in gateways:
                    if args.mounted:
                        mount(gateways[name], proxy)  # a first touch: nothing cached or described
                    gateways[name].run_job("evict")
                    os.sync()
                    before = cpu_of(store_and_proxy)
                    figures[f"{name} cold"] = timed(reader, bucket, keys, pids[name], crc, size)
                    figures[f"{name} cold"]["store_cpu_s"] = cpu_of(store_and_proxy) - before
                    settled(gateways[name], size * len(keys))
                    os.sync()  # as a later epoch finds them: cached files written back, clean
                    figures[f"{name} hot"] = timed(reader, bucket, keys, pids[name], crc, size, args.hot_gets)
                elif name == "ceiling":
                    figures[name] = timed_pieces(pieces, keys, store_pids, proxy_pid, crc, size, args.ceiling_mib * MiB)
                elif name == "direct":
                    before = cpu_of(store_and_proxy)
                    figures[name] = timed(reader, BUCKET, keys[:1], pids[name], crc, size)
                    figures[name]["store_cpu_s"] = cpu_of(store_and_proxy) - before
                else:
                    figures[name] = timed(reader, BUCKET, keys, pids[name], crc, size, args.hot_gets)
            return figures

        log("[large] warm-up round (not counted): the store meets its files")
        one_round()
        for n in range(args.rounds):
            figures = one_round()
            results["rounds"].append(figures)
            log(f"[large] round {n + 1}: " + ", ".join(f"{k} {v['mib_s']:,.0f} MiB/s" for k, v in figures.items()))
        for group in [*readers.values(), *pieces]:
            for reader in group:
                reader.close()
    results["gateways"] = list(gateways)
    return results


def report(args: argparse.Namespace, r: dict) -> str:
    rounds = r["rounds"]
    lines = [machine(), "",
             f"{r['objects']} x {r['size'] // MiB} MiB object{'s read at once' if r['objects'] > 1 else ''}, "
             f"{'mounted' if r['mounted'] else 'managed (PUT through the gateway)'}, "
             f"store {r['store']} +{r['latency_ms']:g} ms, "
             f"{len(rounds)} rounds (after one not counted), hot and nginx {args.hot_gets} GETs a round; "
             "ratios within each round"
             + ("; servers pinned to a core of their own (cold ratios left out)" if args.pin else ""), ""]
    rows = []
    for name in r["gateways"]:
        cold = [x[f"{name} cold"]["mib_s"] / x["direct"]["mib_s"] for x in rounds]
        hot = [x[f"{name} hot"]["mib_s"] / x["nginx"]["mib_s"] for x in rounds]
        rows.append([
            name,
            f"{statistics.median(x[f'{name} cold']['mib_s'] for x in rounds):,.0f}",
            *(("-", "-") if args.pin else (" / ".join(f"{c:.2f}x" for c in cold), f"**{statistics.median(cold):.2f}x**")),
            f"{statistics.median(x[f'{name} cold']['cpu_s'] for x in rounds):.2f}",
            f"{statistics.median(x[f'{name} hot']['mib_s'] for x in rounds):,.0f}",
            " / ".join(f"{h:.2f}x" for h in hot), f"**{statistics.median(hot):.2f}x**",
            f"{statistics.median(x[f'{name} hot']['cpu_s'] for x in rounds):.3f}",
        ])
    lines.append(table(["gateway", "cold MiB/s", "cold x direct, each round", "median",
                        "cold CPU s / GET", "hot MiB/s", "hot x nginx, each round", "median",
                        "hot CPU s / GET"], rows))
    lines += ["", "Time to the head (sent with the first body bytes), median: " + ", ".join(
        f"{name} {statistics.median(x[name]['first_s'] for x in rounds) * 1000:,.0f} ms"
        for name in [*(f"{g} cold" for g in r["gateways"]), "direct"])]
    lines += ["", table(["baseline", "MiB/s (median)", "server CPU s / GET"], [
        ["store direct, one stream", f"{statistics.median(x['direct']['mib_s'] for x in rounds):,.0f}",
         f"{statistics.median(x['direct']['cpu_s'] for x in rounds):.2f}"],
        ["nginx, sendfile", f"{statistics.median(x['nginx']['mib_s'] for x in rounds):,.0f}",
         f"{statistics.median(x['nginx']['cpu_s'] for x in rounds):.3f}"],
    ])]
    if "ceiling" in rounds[0]:
        ceiling = [x["ceiling"]["mib_s"] / x["direct"]["mib_s"] for x in rounds]
        lines += ["", f"Ceiling: the {r['objects']} object(s) read straight from the store in {r['ceiling_mib']} MiB "
                      "ranges, every piece at once, no gateway: x one direct stream, each round "
                      + " / ".join(f"{c:.2f}x" for c in ceiling) + f" (median **{statistics.median(ceiling):.2f}x**); "
                      "CPU a round (medians): " + ", ".join(
                          f"{who} {statistics.median(x['ceiling'][f'{who}_cpu_s'] for x in rounds):.3f} s"
                          for who in ("store", "proxy", "client"))
                      + f" in {statistics.median(x['ceiling']['wall_s'] for x in rounds):.3f} s"]
    if "old" in r["gateways"]:
        def med(key: str, field: str) -> float:
            return statistics.median(x[key][field] for x in rounds)
        lines += ["", f"new / old: cold {med('new cold', 'mib_s') / med('old cold', 'mib_s'):.2f}x MiB/s at "
                      f"{med('new cold', 'cpu_s') / med('old cold', 'cpu_s'):.2f}x CPU; hot "
                      f"{med('new hot', 'mib_s') / med('old hot', 'mib_s'):.2f}x MiB/s at "
                      f"{med('new hot', 'cpu_s') / med('old hot', 'cpu_s'):.2f}x CPU"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", help="the checkout to compare against (none: this one only)")
    ap.add_argument("--new", default=str(_common.ROOT), help="the checkout measured (default: this one)")
    ap.add_argument("--store", choices=("rclone", "moto"), default="rclone")
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--latency-ms", type=float, default=20.0, help="added to a store round trip (20)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hot-gets", type=int, default=3,
                    help="hot GETs (and nginx's) one after the other per round, timed together (3)")
    ap.add_argument("--mounted", action="store_true", help="read the store's object through a mount")
    ap.add_argument("--objects", type=int, default=1, help="objects read at once, one thread each (1)")
    ap.add_argument("--pin", action="store_true",
                    help="the gateways and nginx on the last core, the readers, the store and the proxy on the "
                         "others: each server's hot GETs without the readers' preemptions (cold ratios are then "
                         "left out: the direct stream had a core fewer)")
    ap.add_argument("--ceiling", action="store_true",
                    help="each round also reads the objects straight from the store as a gateway's cold read "
                         "fetches them (8 MiB ranges, all at once) with no gateway in the way: the most any "
                         "gateway could deliver on this machine, against the direct stream")
    ap.add_argument("--ceiling-mib", type=int, default=PIECE_MIB,
                    help=f"the ranges of --ceiling, MiB ({PIECE_MIB}, the gateway's pieces; the object's size: "
                         "one stream an object)")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args(argv)
    return _common.run_and_report(args, run, report)


if __name__ == "__main__":
    sys.exit(main())
