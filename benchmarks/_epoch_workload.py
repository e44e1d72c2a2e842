"""The epoch benchmarks' data set and how an epoch of it is read and measured.

The data set: object ``i`` is ``key_of(i)``, its bytes ``body_of(i, size)``
(seeded random, so a reader can check them without keeping them), written
through the gateway and straight into moto by ``write_data``. An epoch:
``read_epoch`` reads every key of an order once from one thread per client,
``Meter`` takes the gateway's, the proxy's and the processes' counters around
it, ``progress`` samples it while it runs. ``Admin`` is the gateway's admin
API with the benchmarks' token.

Used by ``epoch.py`` (which runs the configurations and reports them) and by
``batch.py``, ``compare.py``, ``mounted_epoch.py``, ``webdataset.py`` and
``_compare_workloads.py``.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
from _common import client, percentile, process_cpu  # first: puts the repo root on sys.path
from delay_proxy import DelayProxy

from tests.servers import ADMIN_TOKEN

KiB, MiB = 1024, 1024**2
BUCKET = "train"  # the managed bucket, in the gateway
SOURCE = "source"  # the same objects straight in moto, for `direct`
PREFIX = "train/"
WRITERS = 16
POLL_S = 1.0  # how often an epoch's progress is sampled
SAMPLE_EVERY = 97  # every 97th object's bytes are compared, not only its length
STATUS = ("state", "consumed", "hits", "misses", "hit_ratio", "prefetched_objects",
          "prefetched_bytes", "lookahead_objects", "lookahead_bytes", "missing_objects")


# -- the data set -------------------------------------------------------------------


def body_of(i: int, size: int) -> bytes:
    return random.Random(i).randbytes(size)


def key_of(i: int) -> str:
    return f"{PREFIX}{i:07d}.jpg"


def checker(size: int) -> Callable[[str, bytes], None]:
    def check(key: str, body: bytes) -> None:
        if len(body) != size:
            raise AssertionError(f"{key}: {len(body)} bytes, expected {size}")
        i = int(key.rsplit("/", 1)[1].split(".")[0])
        if i % SAMPLE_EVERY == 0 and body != body_of(i, size):
            raise AssertionError(f"{key}: other bytes than were written")
    return check


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
