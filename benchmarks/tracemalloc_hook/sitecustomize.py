"""Snapshots of the gateway's Python allocations, for ``soak.py --tracemalloc``.

Put this directory on the gateway's PYTHONPATH (soak.py does) and set
TIERSTORE_TRACEMALLOC_DIR: Python imports ``sitecustomize`` at start-up,
which starts ``tracemalloc`` (TIERSTORE_TRACEMALLOC_FRAMES frames a trace,
default 10) and a thread that writes ``tracemalloc.take_snapshot()`` to
``<dir>/snapshot-<seconds>.pickle`` every TIERSTORE_TRACEMALLOC_EVERY
seconds (default 30), from TIERSTORE_TRACEMALLOC_START seconds on (default 0). No product code knows about it. Compare two with
``soak.py --compare-snapshots A B``.

With TIERSTORE_TRACEMALLOC_FRAMES=0 nothing is traced; either way, every
5 s a line goes to ``<dir>/heap.jsonl``: glibc's ``mallinfo2`` (bytes in
use, free in the arenas, mmapped) and, for each open index database, its
memtables and block cache (RocksDB's properties): what RssAnon holds
that Python's allocations do not.
"""

import ctypes
import gc
import json
import os
import threading
import time
import tracemalloc


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _heap() -> dict:
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _Mallinfo2
    info = mallinfo2()
    out = {"t": round(time.monotonic() - _T0, 1), "malloc_in_use": info.uordblks,
           "malloc_free": info.fordblks, "malloc_mmapped": info.hblkhd, "arena": info.arena,
           "traced": tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None}
    for obj in gc.get_objects():
        # tiering.index.db.Index, by name: this module imports nothing of the gateway.
        db = getattr(obj, "_db", None) if type(obj).__name__ == "Index" else None
        if type(db).__name__ == "Rdict":
            for prop in ("cur-size-all-mem-tables", "block-cache-usage", "estimate-table-readers-mem"):
                try:
                    out[f"{id(obj) % 997}:{prop}"] = db.property_int_value(f"rocksdb.{prop}")
                except Exception:  # noqa: BLE001  (closed meanwhile)
                    pass
    return out


_DIR = os.environ.get("TIERSTORE_TRACEMALLOC_DIR")
if _DIR:
    _FRAMES = int(os.environ.get("TIERSTORE_TRACEMALLOC_FRAMES", "10"))
    # Tracing may start late (TIERSTORE_TRACEMALLOC_START seconds): then
    # every trace in a snapshot is of memory allocated after the warm-up
    # and still held, and the load before it runs at full speed.
    _START = float(os.environ.get("TIERSTORE_TRACEMALLOC_START", "0"))
    if _FRAMES and not _START:
        tracemalloc.start(_FRAMES)
    _EVERY = float(os.environ.get("TIERSTORE_TRACEMALLOC_EVERY", "30"))
    _T0 = time.monotonic()

    def _free_connections() -> None:
        """TIERSTORE_EXPERIMENT_FREE_CONNECTIONS=1: a store connection's
        parser and read buffer dropped when it is lost, which breaks the
        reference cycle (connection <-> httptools parser) that otherwise
        keeps its 256 KiB buffer until a full collection. An experiment
        (does the growth stop?), not the fix."""
        import sys  # noqa: PLC0415
        while (module := sys.modules.get("tiering.capacity.http_get")) is None:
            time.sleep(0.2)
        lost = module._Connection.connection_lost

        def connection_lost(self, exc):  # noqa: ANN001, ANN202
            lost(self, exc)
            self._parser = None
            self._read = memoryview(b"")

        module._Connection.connection_lost = connection_lost

    def _trim_every(seconds: float) -> None:
        """TIERSTORE_EXPERIMENT_TRIM_EVERY=<s>: ``malloc_trim(0)`` that
        often besides the gateway's own trims: does a shorter cadence keep
        RSS down? An experiment, not the fix."""
        trim = ctypes.CDLL(None).malloc_trim
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        while True:
            time.sleep(seconds)
            trim(0)

    if os.environ.get("TIERSTORE_EXPERIMENT_TRIM_EVERY"):
        threading.Thread(target=_trim_every, args=(float(os.environ["TIERSTORE_EXPERIMENT_TRIM_EVERY"]),),
                         daemon=True).start()

    if os.environ.get("TIERSTORE_EXPERIMENT_FREE_CONNECTIONS"):
        threading.Thread(target=_free_connections, daemon=True).start()

    def _heap_lines() -> None:
        while True:
            time.sleep(5)
            try:
                line = json.dumps(_heap())
            except Exception as exc:  # noqa: BLE001
                line = json.dumps({"error": repr(exc)})
            with open(os.path.join(_DIR, "heap.jsonl"), "a") as f:
                f.write(line + "\n")

    threading.Thread(target=_heap_lines, daemon=True, name="heap lines").start()

    def _dump() -> None:
        if _FRAMES and _START:
            time.sleep(_START)
            tracemalloc.start(_FRAMES)
        while _FRAMES:
            time.sleep(_EVERY)
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)])
            path = os.path.join(_DIR, f"snapshot-{time.monotonic() - _T0:05.0f}.pickle")
            snapshot.dump(path + ".tmp")
            os.replace(path + ".tmp", path)

    threading.Thread(target=_dump, daemon=True, name="tracemalloc dumps").start()

    # TIERSTORE_TRACEMALLOC_SPIKE=<MiB>: also a snapshot whenever RSS is
    # at least that (polled every 0.1 s, at most one every 5 s), of the
    # blocks of 256 KiB or more only: what a spike is made of
    # (``soak.py --spikes DIR`` adds them up by allocation site).
    _SPIKE = int(os.environ.get("TIERSTORE_TRACEMALLOC_SPIKE", "0")) << 20

    def _spikes() -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        last = 0.0
        while True:
            time.sleep(0.1)
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * page
            if rss < _SPIKE or time.monotonic() - last < 5 or not tracemalloc.is_tracing():
                continue
            last = time.monotonic()
            snapshot = tracemalloc.take_snapshot()
            snapshot.traces._traces = [t for t in snapshot.traces._traces if t[1] >= 256 << 10]
            path = os.path.join(_DIR, f"spike-{time.monotonic() - _T0:05.0f}-{rss >> 20}.pickle")
            snapshot.dump(path)

    if _FRAMES and _SPIKE:
        threading.Thread(target=_spikes, daemon=True, name="tracemalloc spikes").start()
