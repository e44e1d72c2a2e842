"""The workloads of benchmarks/compare.py, each against any server through
a lean client (``_compare_client``): an epoch of small-object GETs in a
shuffled order, a large object read whole and by random ranges, PUTs of
small objects, and a listing. Each returns its figures as a dict.
"""

from __future__ import annotations

import contextlib
import io
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from _common import percentile, process_cpu  # first: puts the repo root on sys.path
from _compare_client import list_keys
from _epoch_workload import read_epoch

MiB = 1024**2


class BotoShaped:
    """A lean client seen as the one call ``epoch.read_epoch`` makes of a
    boto3 client (``get_object(...)["Body"].read()``)."""

    def __init__(self, lean) -> None:  # type: ignore[no-untyped-def]
        self.lean = lean

    def get_object(self, Bucket: str, Key: str) -> dict:  # noqa: N803  boto3's names
        status, body = self.lean.get(Bucket, Key)
        if status != 200:
            raise RuntimeError(f"GET {Bucket}/{Key} on :{self.lean.port}: {status} {body[:200]!r}")
        return {"Body": io.BytesIO(body)}


def cpu_of(pids: dict[str, Callable[[], list[int]]]) -> dict[str, float]:
    """CPU seconds used so far by each named group of processes."""
    out = {}
    for name, group in pids.items():
        total = 0.0
        for pid in group():
            with contextlib.suppress(OSError):
                total += process_cpu(pid)
        out[name] = total
    return out


@contextlib.contextmanager
def cpu_meter(pids: dict[str, Callable[[], list[int]]], into: dict) -> Iterator[None]:
    """``into[name + "_cpu_s"]``: CPU seconds of each group over the block."""
    before = cpu_of(pids)
    yield
    after = cpu_of(pids)
    for name in pids:
        into[f"{name}_cpu_s"] = after[name] - before[name]


def epoch(
    lean, bucket: str, order: Sequence[str], readers: int, size: int,  # type: ignore[no-untyped-def]
    check: Callable[[str, bytes], None], pids: dict[str, Callable[[], list[int]]], shared: bool = False,
) -> dict:
    """Every key of ``order`` read once by ``readers`` threads (reader r:
    positions r, r + readers, ...; ``shared``: each the next of one shared
    queue): objects/s, MiB/s, latencies, and CPU seconds per 1,000 GETs of
    each process group."""
    figures: dict = {}
    with cpu_meter(pids, figures):
        figures |= read_epoch([BotoShaped(lean)] * readers, bucket, list(order), check, shared=shared)
    figures.pop("hook", None)
    figures.pop("samples", None)
    figures["mib_per_s"] = figures["objects"] * size / MiB / figures["wall_s"]
    for name in pids:
        figures[f"{name}_cpu_per_1k"] = figures.pop(f"{name}_cpu_s") * 1000 / figures["objects"]
    return figures


def whole_get(lean, bucket: str, key: str, size: int) -> dict:  # type: ignore[no-untyped-def]
    """One GET of the whole object: MiB/s."""
    t0 = time.perf_counter()
    status, body = lean.get(bucket, key)
    wall = time.perf_counter() - t0
    if status != 200 or len(body) != size:
        raise RuntimeError(f"GET {bucket}/{key} on :{lean.port}: {status}, {len(body):,} bytes")
    return {"wall_s": wall, "mib_per_s": size / MiB / wall}


def random_ranges(size: int, count: int, length: int, seed: int = 1) -> list[tuple[int, int]]:
    """``count`` (start, end inclusive) ranges of ``length`` bytes at
    random offsets aligned to ``length`` (as a reader of fixed-size
    records would ask for)."""
    rng = random.Random(seed)
    slots = size // length
    return [(s * length, s * length + length - 1) for s in (rng.randrange(slots) for _ in range(count))]


def ranged_gets(
    lean, bucket: str, key: str, ranges: Sequence[tuple[int, int]], threads: int,  # type: ignore[no-untyped-def]
    expect: Callable[[int, int], bytes] | None = None,
) -> dict:
    """The ranges GET from ``threads`` threads: MiB/s, p50/p99 latency.
    ``expect(start, end)``: the bytes a range must hold (checked)."""

    def one(span: tuple[int, int]) -> tuple[float, int, int]:
        start, end = span
        t0 = time.perf_counter()
        status, body = lean.get(bucket, key, headers={"Range": f"bytes={start}-{end}"})
        took = time.perf_counter() - t0
        # 206, or 200 with just the range (rclone serve s3 answers so): counted.
        if status not in (200, 206) or len(body) != end - start + 1:
            raise RuntimeError(f"GET {bucket}/{key} bytes={start}-{end} on :{lean.port}: "
                               f"{status}, {len(body):,} bytes")
        if expect is not None and body != expect(start, end):
            raise RuntimeError(f"GET {bucket}/{key} bytes={start}-{end}: other bytes")
        return took, len(body), status

    with ThreadPoolExecutor(threads, thread_name_prefix="range") as pool:
        t0 = time.perf_counter()
        results = list(pool.map(one, ranges))
        wall = time.perf_counter() - t0
    latencies = [r[0] for r in results]
    total = sum(r[1] for r in results)
    return {"wall_s": wall, "mib_per_s": total / MiB / wall,
            "answered_200": sum(r[2] == 200 for r in results),
            "p50_ms": statistics.median(latencies) * 1000, "p99_ms": percentile(latencies, 99) * 1000}


def ingest(
    lean, bucket: str, keys: Sequence[str], body: Callable[[int], bytes], threads: int,  # type: ignore[no-untyped-def]
    pids: dict[str, Callable[[], list[int]]],
) -> dict:
    """PUT keys[i] with ``body(i)`` from ``threads`` threads: objects/s."""

    def put(i: int) -> None:
        status = lean.put(bucket, keys[i], body(i))
        if status != 200:
            raise RuntimeError(f"PUT {bucket}/{keys[i]} on :{lean.port}: {status}")

    figures: dict = {}
    pool = ThreadPoolExecutor(threads, thread_name_prefix="put")
    try:
        with cpu_meter(pids, figures):
            t0 = time.perf_counter()
            for _ in pool.map(put, range(len(keys))):
                pass
            wall = time.perf_counter() - t0
    finally:  # on Ctrl-C, not the queued PUTs too
        pool.shutdown(wait=True, cancel_futures=True)
    return figures | {"wall_s": wall, "objects": len(keys), "objects_per_s": len(keys) / wall}


def listing(port: int, bucket: str, prefix: str, expected: int) -> dict:
    """Every key under ``prefix`` in ListObjectsV2 pages of 1,000: keys/s."""
    t0 = time.perf_counter()
    keys, pages = list_keys(port, bucket, prefix)
    wall = time.perf_counter() - t0
    if keys != expected:
        raise RuntimeError(f"listed {keys:,} keys under {bucket}/{prefix} on :{port}, "
                           f"expected {expected:,}")
    return {"wall_s": wall, "keys": keys, "pages": pages, "keys_per_s": keys / wall}
