"""Shared pieces of the benchmarks: servers, clients, statistics, tables.

Every server started here binds 127.0.0.1 on a free port and is stopped by
the handle that started it (its PID for subprocesses).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import boto3
import botocore.session
from botocore.config import Config as BotoConfig
from botocore.utils import parse_timestamp

from tests.servers import (
    ACCESS_KEY,
    SECRET_KEY,
    Gateway,
    free_port,
    free_ports,
    stop_process,
    wait_http,
)

REGION = "us-east-1"


def begin() -> None:
    """A benchmark's start: SIGTERM becomes SystemExit, so the context
    managers below still stop their servers and remove their temp dirs when
    the benchmark is killed; and with TIERSTORE_BENCH_TOUCH=1 the machine's
    memory is touched first (:func:`touch_memory`)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    touch_memory()


# -- memory the host has taken back -------------------------------------------

# This kind of machine is a virtual machine whose balloon device reports
# free guest memory to the host (virtio free page reporting), which then
# drops it: the next write to such a page faults on the host as well. A
# page freed minutes ago costs several times one freed just now: 2 GiB
# written to a new file took 0.81-2.09 ms of system time a MiB, the same
# again right after deleting it 0.21-0.25. Cold reads write new pages (the
# hot tier's fills, the pieces' buffers); the store's direct stream, reading
# files it has cached, writes none. A node that has run a while has a full
# page cache, and takes its new pages from it, not from memory the host
# took back. With TIERSTORE_BENCH_TOUCH=1 a benchmark first writes the
# machine's available memory but TOUCH_MARGIN, in a process of its own that
# then ends: for the next few minutes (the host takes free memory back a
# little at a time) its pages cost what they cost on such a node. Off by
# default: it takes about a minute, and its effect fades during a long run.
TOUCH_MARGIN = 3 * 1024**3
_TOUCH_CHUNK = 64 * 1024**2
_touched_at: float | None = None


def touch_memory() -> None:
    """With TIERSTORE_BENCH_TOUCH=1: write every page of the machine's
    available memory but TOUCH_MARGIN once (see above); says so on stderr."""
    global _touched_at
    if os.environ.get("TIERSTORE_BENCH_TOUCH") != "1":
        return
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        available = int(meminfo["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return
    size = (available - TOUCH_MARGIN) // _TOUCH_CHUNK * _TOUCH_CHUNK
    if size <= 0:
        return
    started = time.monotonic()
    # A process of its own: whatever happens, its memory is given back when it ends.
    subprocess.run([sys.executable, "-c", f"from benchmarks._common import _touch; _touch({size})"],
                   cwd=ROOT, check=True)
    _touched_at = time.monotonic()
    print(f"[bench] touched {size / 1024**3:.1f} GiB of memory in {_touched_at - started:.0f} s "
          "(TIERSTORE_BENCH_TOUCH=1)", file=sys.stderr)


def _touch(size: int) -> None:
    """Write ``size`` bytes of fresh anonymous memory, then let it go."""
    chunk = b"\1" * _TOUCH_CHUNK
    with mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) as memory:
        for offset in range(0, size, _TOUCH_CHUNK):
            memory[offset:offset + _TOUCH_CHUNK] = chunk


# -- temp dirs ---------------------------------------------------------------


@contextlib.contextmanager
def temp_dir(tag: str) -> Iterator[Path]:
    """A private temp dir, removed afterwards whatever happens."""
    path = Path(tempfile.mkdtemp(prefix=f"tierstore-bench-{tag}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def data_filesystem(kind: str, parent: Path, size_gib: int = 8) -> Iterator[Path]:
    """A directory for servers' data (a gateway's hot tier, a cache's
    files): ``root``, a directory under ``parent`` on whatever filesystem
    holds it; ``ext4``, a new ext4 of ``size_gib`` (a sparse image under
    ``parent``, loop mounted: root only), unmounted and removed afterwards.

    A node keeps its hot tier on a local NVMe filesystem of its own. This
    machine's root ext4 has seen millions of files created and deleted by
    test runs, and creating a file there costs 0.35 to 0.65 ms of CPU
    (ext4's inode allocator skips recently deleted inodes, reading their
    inode table blocks: ``recently_deleted`` in ``perf``), against 15 to
    19 us on a new ext4 (docs/benchmarks.md). A cold read creates one hot
    file per object it fetches (a cache like nginx's or rclone's does too),
    so the root filesystem charges every miss for that churn."""
    if kind == "root":
        path = parent / "data-fs"
        path.mkdir()
        yield path
        return
    if kind != "ext4":
        raise ValueError(f"data filesystem {kind!r}: root or ext4")
    if os.geteuid() != 0:
        raise SystemExit("an ext4 data filesystem is a loop mount: run as root, or keep the root filesystem")
    image, mount = parent / "data-fs.img", parent / "data-fs"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(size_gib << 30)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        image.unlink(missing_ok=True)


# -- servers -----------------------------------------------------------------


@contextlib.contextmanager
def gateway(
    data_dir: Path, startup_timeout: float = 300.0, extra_args: tuple[str, ...] = (), root: Path = ROOT,
    ports: tuple[int, int] | None = None,
) -> Iterator[Gateway]:
    """A `tierstore serve` subprocess on free loopback ports.

    Like tests.servers.Gateway.start(), but waits longer for /health: with a
    million keys in the index, start-up (the hot-tier sweep reads every
    object record) takes a while, and that time is reported separately.
    ``ports`` (S3, admin): free ones unless given.
    """
    gw = Gateway(data_dir)
    gw.port, gw.admin_port = ports or free_ports(2)
    gw.log_path = data_dir.parent / f"{data_dir.name}-gateway.log"
    with open(gw.log_path, "ab") as log:
        gw.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1",
             "--port", str(gw.port), "--admin-port", str(gw.admin_port),
             "--data-dir", str(data_dir), *extra_args],
            env=gw.env(), stdout=log, stderr=subprocess.STDOUT, cwd=root,  # `-m gateway` of that checkout
        )
    try:
        wait_http(f"{gw.admin_url}/health", timeout=startup_timeout, proc=gw.proc)
        yield gw
    finally:
        gw.stop()  # SIGTERM to its PID, then SIGKILL after 30 s


@contextlib.contextmanager
def moto_server() -> Iterator[tuple[str, int]]:
    """(endpoint, pid) of moto's S3 server as its own process (so it does not
    share the GIL with the benchmark's client threads, as the gateway does not)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{endpoint}/moto-api/", timeout=60, proc=proc)
        yield endpoint, proc.pid
    finally:
        stop_process(proc, timeout=15)


def fast_timestamp(value: object) -> datetime:
    """A botocore timestamp parser: datetime.fromisoformat for the ISO 8601
    timestamps of XML bodies (LastModified in listings), botocore's own
    parser (dateutil) for anything else, such as RFC 1123 headers."""
    try:
        return datetime.fromisoformat(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return parse_timestamp(value)


def client(endpoint: str, max_pool: int = 10, fast_timestamps: bool = False, retries: int = 1):
    """A boto3 S3 client of its own session. ``fast_timestamps`` installs
    :func:`fast_timestamp` in that session's response parsers; ``retries``:
    how many times botocore retries a failed request (503 SlowDown among them)."""
    core = botocore.session.get_session()
    if fast_timestamps:
        core.get_component("response_parser_factory").set_parser_defaults(
            timestamp_parser=fast_timestamp
        )
    return boto3.session.Session(botocore_session=core).client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=BotoConfig(
            s3={"addressing_style": "path"},
            retries={"max_attempts": retries},
            max_pool_connections=max_pool,
        ),
    )


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- cores ----------------------------------------------------------------------


def pin_apart(servers: Iterable[int], others: Iterable[int]) -> None:
    """``--pin``: the processes of ``servers`` (the servers under test) on
    the last core this process may use, ``others`` (this process's readers,
    the store, the proxy) on the rest. On a machine of two cores, a gateway
    that shares its core with the benchmark's readers and the store is
    preempted by them more than once a request, which costs it CPU a node
    whose loader runs on other cores does not pay
    (docs/benchmarks/cold-path.md, "Who takes the loop's core")."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin needs at least two cores")
    _pin(servers, {cores[-1]})
    _pin(others, set(cores[:-1]))


def _pin(pids: Iterable[int], cores: set[int]) -> None:
    """Every thread of each process in ``pids`` on ``cores``; threads they
    start later inherit it from the thread that starts them."""
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                    os.sched_setaffinity(int(tid), cores)


# -- the capacity store's names ----------------------------------------------

# What the cluster keeps in the capacity store, by name prefix (most specific first).
_TOUCHES = (("leases/_nodes/", "node registry"), ("leases/_terms/", "terms"), ("leases/_seals/", "seals"),
            ("leases/_head", "follow head"), ("leases/", "leases"), ("segments/", "segments"),
            ("identity/", "identity"))


def touches(name: str) -> str:
    """What a capacity object name (or a listing's prefix) touches: the
    node registry, the follow head, a lease, ..."""
    for prefix, what in _TOUCHES:
        if name.startswith(prefix):
            return what
    return "other"


# -- statistics and output ---------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 1024**2:.0f} GiB RAM"
    load = ""
    with contextlib.suppress(OSError):
        load = ", load avg " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    if _touched_at is not None:
        mem += f", memory touched {time.monotonic() - _touched_at:.0f} s before this line"
    return (
        f"{os.cpu_count()} CPUs ({cpu}){mem}; Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}{load}; "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    )


def run_and_report(args: argparse.Namespace, run: Callable[[argparse.Namespace], dict],
                   report: Callable[[argparse.Namespace, dict], str]) -> int:
    """A benchmark's end: killable, run, its report on stdout, the JSON written."""
    begin()
    results = run(args)
    print(report(args, results))
    write_results(args, results)
    return 0


def write_results(args: argparse.Namespace, results: object) -> None:
    """With ``--json PATH``: the run's arguments, machine and results there."""
    if args.json:
        args.json.write_text(json.dumps(
            {"args": vars(args) | {"json": str(args.json)}, "machine": machine(), "results": results},
            indent=2,
        ))

