"""Read workers: hot GETs/s and CPU by process, for each ``--workers`` count.

For each count in ``--counts`` (1 2 3 by default), ``--rounds`` (2) times,
alternating: a gateway on its embedded defaults with ``--workers N`` and
the access log off, one 64 KiB object written (hot), then wrk (C, -t2 -c16)
GETting it through a presigned SigV4 URL for ``--seconds`` (10). Reported
per run: requests/s, p50/p99, and the CPU seconds of the writer and of the
workers (from /proc), per 1,000 requests. With 1, the one process serves
everything; above 1, the workers serve and the writer answers their lookups.

Run:  .venv/bin/python benchmarks/workers.py [--counts 1 2 4] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import _common  # first: puts the repo root on sys.path
from _common import client, gateway, machine, table, temp_dir, write_results
from _compare_wrk import check_url, ensure_wrk, presigned_get, run_wrk
from capacity import log

from tests.servers import children

SIZE = 64 * 1024
CONNECTIONS = 16


def one_run(workers: int, seconds: int, wrk: str) -> dict:
    with temp_dir(f"workers-{workers}") as tmp:
        with gateway(tmp / "data", extra_args=("--workers", str(workers), "--access-log", "off")) as gw:
            assert gw.proc is not None
            s3 = client(gw.endpoint)
            s3.create_bucket(Bucket="bench")
            s3.put_object(Bucket="bench", Key="hot", Body=os.urandom(SIZE))
            url = presigned_get(gw.endpoint, "bench", "hot")
            check_url(url, SIZE)
            writer = gw.proc.pid
            pids = {"writer": lambda: [writer], "workers": lambda: children(writer)}
            return {"workers": workers} | run_wrk(wrk, url, seconds, CONNECTIONS, pids)


def report(runs: list[dict]) -> str:
    rows = [[r["workers"], f"{r['requests_per_s']:,.0f}", f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}",
             f"{r['writer_cpu_per_1k']:.3f}", f"{r['workers_cpu_per_1k']:.3f}",
             f"{r['writer_cpu_per_1k'] + r['workers_cpu_per_1k']:.3f}",
             f"{r['writer_cores'] + r['workers_cores']:.2f}", f"{r['wrk_cores']:.2f}",
             r["non_2xx"] + r["socket_errors"]] for r in runs]
    head = ["--workers", "GETs/s", "p50 ms", "p99 ms", "writer CPU s / 1k", "workers CPU s / 1k",
            "gateway CPU s / 1k", "gateway cores busy", "wrk cores busy", "errors"]
    return "\n".join(["# Read workers: hot 64 KiB GETs under wrk", "", machine(), "",
                      f"wrk -t2 -c{CONNECTIONS}, one hot object, presigned GETs", "", table(head, rows)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 2, 3], help="--workers values (1 2 3)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each count, alternating (2)")
    ap.add_argument("--seconds", type=int, default=10, help="wrk's run, seconds (10)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    _common.begin()
    wrk = ensure_wrk()
    runs = []
    for _ in range(args.rounds):
        for count in args.counts:
            runs.append(one_run(count, args.seconds, wrk))
            log(f"[workers {count}] {runs[-1]['requests_per_s']:,.0f} GETs/s")
    print(report(runs))
    write_results(args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
