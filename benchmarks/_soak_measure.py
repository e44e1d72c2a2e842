"""The soak's measurement: the gateway sampled while the load runs, and
what the run's figures add up to.

``Sampler`` threads read the gateway's VmRSS, threads and open descriptors
(``/proc/<pid>``) and its capacity-store counters (admin ``/stats``) on a
fixed schedule; ``log_problems`` reads its log for warnings, errors and
tracebacks. ``rss_figures`` turns the RSS samples into the memory figures and
the slope of the floor (the verdict on memory), ``summarise`` into the
verdict of the whole run, ``report`` into the Markdown printed at the end.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from _common import machine, percentile, table
from _soak_workload import Worker
from capacity import KiB, MiB, admin, log

from tests.servers import Gateway

# A level in the gateway's log: its own format (date, time, level, logger) or
# uvicorn's ("ERROR:    Exception in ASGI application"); access lines start "time=".
LOG_LEVEL = re.compile(r"(?:\d{4}-\d\d-\d\d [\d:,.]+ )?(WARNING|ERROR|CRITICAL):? ")

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


# -- sampling the gateway ----------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, VmHWM (KiB) and Threads of a process, and its open
    descriptors. RssAnon is the heap (Python's objects and glibc's arenas)
    without the page cache's mapped files."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "VmHWM", "Threads"):
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
        return {"rss_kib": status["VmRSS"], "anon_kib": status["RssAnon"],
                "threads": status["Threads"], "fds": status["fds"],
                "ops": sum(w.tally.ops for w in workers),
                "errors": sum(w.tally.errors.total() for w in workers)}

    return probe


# -- the gateway's log -------------------------------------------------------------


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


# -- figures and verdict ------------------------------------------------------------


def floor(samples: list[dict], window: float, field: str = "rss_kib") -> list[dict]:
    """The lowest sample of ``field`` (VmRSS) of each ``window`` seconds."""
    windows: dict[int, dict] = {}
    for s in samples:
        w = int(s["t"] // window)
        if w not in windows or s[field] < windows[w][field]:
            windows[w] = s
    return [windows[w] for w in sorted(windows)]


def slope(samples: list[dict], field: str = "rss_kib") -> float | None:
    """Least-squares slope of ``field`` (VmRSS) over time, MiB per minute."""
    if len(samples) < 3:
        return None
    fit = statistics.linear_regression([s["t"] for s in samples],
                                       [s[field] / KiB for s in samples])
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
    anon = [s for s in samples if "anon_kib" in s]
    anon_low = floor([s for s in anon if s["t"] >= seconds / 2],
                     min(FLOOR_WINDOW, seconds / 20), "anon_kib")
    return {"at": at, "peak_mib": peak, "slope_mib_per_min": slope(low),
            "raw_slope_mib_per_min": slope(half), "second_half_samples": len(half),
            "anon_first_last_mib": [anon[0]["anon_kib"] / KiB, anon[-1]["anon_kib"] / KiB]
            if anon else None,
            "anon_slope_mib_per_min": slope(anon, "anon_kib"),
            "anon_floor_slope_mib_per_min": slope(anon_low, "anon_kib"),
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
                 ["RssAnon first / last sample",
                  "{:.0f} / {:.0f}".format(*m["anon_first_last_mib"])
                  if m.get("anon_first_last_mib") else "-"],
                 ["RssAnon slope, whole run / floor over the second half, MiB/min",
                  f"{m['anon_slope_mib_per_min'] or 0:+.2f} / "
                  f"{m['anon_floor_slope_mib_per_min'] or 0:+.2f}"],
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
        f"Hostile requests and operator jobs: {r.get('hostile') or 'none'}.", "",
        f"Final listing: {r['final_listing']}. fsck: {len(r['fsck_problems'])} problem(s). "
        f"Gateway log: {glog['errors']} error(s), {glog['warnings']} warning(s), "
        f"{glog['tracebacks']} traceback(s).", "",
        f"Verdict: {verdict}", "",
    ]
    for e in r["first_errors"]:
        lines.append(f"- error at {e['at']}: {e['kind']} {e['key']}: {e['error']}")
    lines += [f"- gateway log: {line}" for line in glog["first_errors"]]
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"
