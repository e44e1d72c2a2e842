"""The report of ``epoch.py``: its markdown tables and its targets, met or
missed, from the results ``epoch.run`` returns."""

from __future__ import annotations

import argparse
import math

from _common import machine, table
from _epoch_workload import WRITERS, KiB, MiB


def misses_by_part(figures: dict, parts: tuple[float, ...] = (0.1, 0.9)) -> list[int] | None:
    """A hinted epoch's misses in its first 10%, middle 80% and last 10% of
    reads, interpolated from its samples (consumed, misses)."""
    if "epoch" not in figures:
        return None
    points = [(0, 0)]
    points += [(s["consumed"], s["misses"]) for s in figures["samples"] if "consumed" in s]
    points.append((figures["epoch"]["consumed"], figures["epoch"]["misses"]))

    def at(consumed: float) -> float:
        for (c0, m0), (c1, m1) in zip(points, points[1:], strict=False):
            if c0 <= consumed <= c1:
                return m0 + (m1 - m0) * ((consumed - c0) / (c1 - c0) if c1 > c0 else 1)
        return points[-1][1]

    n = figures["objects"]
    marks = [0.0] + [at(f * n) for f in parts] + [float(points[-1][1])]
    return [round(b - a) for a, b in zip(marks, marks[1:], strict=False)]


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _parts(figures: dict) -> str:
    return " / ".join(map(str, misses_by_part(figures) or []))


def report_configs(args: argparse.Namespace, r: dict) -> list[str]:
    configs = r["configs"]
    hot_s = configs["all hot"]["wall_s"]
    rows = []
    for name, c in configs.items():
        if "epoch" in c:
            hit = f"{pct(c['epoch']['hit_ratio'])} (epoch), {pct(c['hit_ratio'])} (stats)"
        else:
            hit = pct(c.get("hit_ratio"))
        gateway_cpu = f"{c['gateway_cpu_s']:.0f}" if "gateway_cpu_s" in c else "-"
        rows.append([name, f"{c['wall_s']:.1f}", f"{c['objects_per_s']:.0f}", hit,
                     f"{c['wall_s'] / hot_s:.2f}x", f"{c['p50_ms']:.0f} / {c['p99_ms']:.0f}",
                     f"{c['proxied_gets']:,}", gateway_cpu, f"{c['moto_cpu_s']:.0f}",
                     f"{c['client_cpu_s']:.0f}"])
    hinted = configs["cold, hinted"]
    status = hinted["epoch"]
    return [
        f"### Epochs over {args.objects:,} objects of {args.size // KiB} KiB, "
        f"{args.readers} readers, +{args.latency_ms:g} ms per request to the capacity store",
        "",
        f"Machine: {machine()}",
        "",
        f"Setup: written in {r['write_s']:.0f} s (through the gateway and straight into moto, "
        f"{WRITERS} threads), flushed in {r['flush_s']:.1f} s into {r['segments']} segments; "
        f"the all-hot warm job took {r['warm_all']['s']:.1f} s.",
        "",
        table(["configuration", "epoch s", "objects/s", "hit ratio", "time / all hot",
               "p50 / p99 ms", "GETs to moto", "gateway CPU s", "moto CPU s", "client CPU s"],
              rows),
        "",
        f"Cold, hinted: registered in {hinted['register_s']:.1f} s (before the clock starts); "
        f"{status['prefetched_objects']:,} objects prefetched; lookahead window "
        f"{status['lookahead_objects']} objects at the end; misses in the first 10% / middle "
        f"80% / last 10% of the reads: {_parts(hinted)}. The readers are one Python process "
        "of boto3 threads (200 to 280 GETs/s on 2 cores): the all-hot time is theirs, not "
        "the gateway's. Client CPU includes the delay proxy's thread.",
        "",
    ]


def report_half(args: argparse.Namespace, h: dict) -> tuple[list[str], float, float]:
    """The half-size table; and the hinted and unhinted hit ratios over all
    its epochs."""
    rows = []
    for n, (u, k, b) in enumerate(zip(h["unhinted"], h["hinted"], h["belady"], strict=True)):
        rows.append([
            f"epoch {n + 1}", f"{u['wall_s']:.1f}", pct(u["hit_ratio"]), f"{k['wall_s']:.1f}",
            pct(k["epoch"]["hit_ratio"]), pct(k["hit_ratio"]), pct(b), _parts(k),
            f"{k['epoch']['prefetched_objects']:,}",
            f"{u['evicted_bytes'] / MiB:,.0f} / {k['evicted_bytes'] / MiB:,.0f}",
            f"{u['proxied_gets']:,} / {k['proxied_gets']:,}",
            f"{u['store_bytes_read'] / MiB:,.0f} / {k['store_bytes_read'] / MiB:,.0f}",
        ])
    unhinted = _mean([u["hit_ratio"] for u in h["unhinted"]])
    statuses = [k["epoch"] for k in h["hinted"]]
    hinted = sum(e["hits"] for e in statuses) / sum(e["hits"] + e["misses"] for e in statuses)
    rows.append(["all", f"{_mean([u['wall_s'] for u in h['unhinted']]):.1f}", pct(unhinted),
                 f"{_mean([k['wall_s'] for k in h['hinted']]):.1f}", pct(hinted),
                 pct(_mean([k["hit_ratio"] for k in h["hinted"]])), pct(h["belady_mean"]),
                 "", "", "", "", ""])
    ahead = (f"each next epoch registered at {args.register_ahead:.0%} of the current one"
             if args.register_ahead > 0 else "each epoch registered just before it")
    fit = h["fit_objects"]
    lines = [
        f"### Hot tier for about half the data set: {h['hot_size'] / MiB:,.0f} MiB "
        f"(high watermark {h['high_watermark'] / MiB:,.0f} MiB)",
        "",
        f"{fit:,} of {args.objects:,} objects fit ({h['fit_fraction']:.1%}: a warm job of the "
        f"whole set left {h['hot_cached'] / MiB:,.0f} MiB cached). {len(h['belady'])} epochs "
        f"from a cold hot tier in new random orders, the same orders unhinted, then hinted "
        f"({ahead}). Belady: the offline optimum with demand paging for the same reads and a "
        f"cache of {fit:,} objects. Time and hit ratio of the last row: the mean of the epochs.",
        "",
        table(["", "unhinted s", "unhinted hit ratio", "hinted s", "hinted hit ratio (epoch)",
               "hinted (stats)", "Belady", "hinted misses: first 10% / middle / last 10%",
               "prefetched", "evicted MiB (unhinted / hinted)", "GETs to moto (u / h)",
               "MiB from moto (u / h)"], rows),
        "",
    ]
    if hinted > h["belady_mean"]:
        lines += ["The hinted hit ratio is above Belady's: prefetching brings objects in before "
                  "their read, which demand paging (every miss loads the object) cannot.", ""]
    return lines, hinted, unhinted


def report(args: argparse.Namespace, r: dict) -> tuple[str, list[dict]]:
    """The markdown tables, and the targets (met or missed)."""
    lines = report_configs(args, r)
    hinted_s, hot_s = r["configs"]["cold, hinted"]["wall_s"], r["configs"]["all hot"]["wall_s"]
    targets = [{
        "target": "cold, hinted epoch time within 1.25x of all hot", "value": hinted_s / hot_s,
        "limit": 1.25, "met": hinted_s / hot_s <= 1.25,
        "measured": f"{hinted_s:.1f} s / {hot_s:.1f} s = {hinted_s / hot_s:.2f}x",
    }]
    if "half" in r:
        half, hinted, unhinted = report_half(args, r["half"])
        lines += half
        belady = r["half"]["belady_mean"]
        to_belady = hinted / belady if belady else math.inf
        to_unhinted = hinted / unhinted if unhinted else math.inf
        targets += [
            {"target": "half-size tier: hinted hit ratio at least 95% of Belady's",
             "value": to_belady, "limit": 0.95, "met": to_belady >= 0.95,
             "measured": f"{hinted:.1%} / {belady:.1%} = {to_belady:.2f}x"},
            {"target": "half-size tier: hinted hit ratio at least 2x unhinted",
             "value": to_unhinted, "limit": 2.0, "met": to_unhinted >= 2.0,
             "measured": f"{hinted:.1%} / {unhinted:.1%} = {to_unhinted:.2f}x"},
        ]
    lines += [
        "### Targets",
        "",
        table(["target", "measured", ""],
              [[t["target"], t["measured"], "met" if t["met"] else "**missed**"]
               for t in targets]),
        "",
    ]
    return "\n".join(lines), targets
