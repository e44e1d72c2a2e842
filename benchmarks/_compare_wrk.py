"""Workload 5 of benchmarks/compare.py: server efficiency under wrk, a load
generator in C, so that the client costs next to nothing. wrk asks for ONE
hot object over and over on keep-alive connections: nginx gets the plain
URL, S3 servers a presigned (SigV4, query-string) GET URL, checked with curl
to answer 200 with the whole object before wrk starts. Figures: requests/s,
p50/p99 from ``--latency``, the server's CPU seconds per 1,000 requests and
cores busy, wrk's own cores busy.
"""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys

import boto3
from _common import ACCESS_KEY, REGION, SECRET_KEY  # first: puts the repo root on sys.path
from _compare_workloads import cpu_meter
from botocore.config import Config as BotoConfig

WRK_THREADS = 2
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}
_PERCENTILE = re.compile(r"^\s*(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s|m)\s*$", re.M)
_TOTAL = re.compile(r"(\d+) requests in ([\d.]+)(us|ms|s|m),")
_RATE = re.compile(r"^Requests/sec:\s+([\d.]+)", re.M)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")
_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ensure_wrk() -> str:
    """The wrk binary; installed with apt-get when missing (as root).
    RuntimeError, with the reason, if it cannot be had."""
    found = shutil.which("wrk")
    if found:
        return found
    log("[wrk] not installed: apt-get install -y wrk")
    done = subprocess.run(["apt-get", "install", "-y", "wrk"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    found = shutil.which("wrk")
    if not found:
        tail = done.stdout.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"apt-get install -y wrk exited {done.returncode}: {tail[0]}")
    return found


def presigned_get(endpoint: str, bucket: str, key: str, expires_s: int = 3600) -> str:
    """A SigV4 presigned GET URL of bucket/key on ``endpoint`` (the
    benchmark's fixed keys, path-style)."""
    s3 = boto3.session.Session().client(
        "s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY, region_name=REGION,
        config=BotoConfig(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    return s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key},
                                     ExpiresIn=expires_s)


def check_url(url: str, size: int) -> None:
    """curl GETs ``url`` once: it must answer 200 with ``size`` bytes."""
    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", url],
                         capture_output=True, text=True, timeout=60, check=False).stdout.split()
    if out != ["200", str(size)]:
        raise RuntimeError(f"curl GET {url.split('?')[0]}: {' '.join(out) or 'no answer'} "
                           f"(expected 200 {size})")


def _ms(value: str, unit: str) -> float:
    return float(value) * _UNITS[unit]


def parse_wrk(text: str) -> dict:
    """requests, seconds, requests/s, p50/p99 ms, non-2xx answers and
    socket errors from wrk's ``--latency`` output."""
    total, rate = _TOTAL.search(text), _RATE.search(text)
    percentiles = {q: _ms(v, u) for q, v, u in _PERCENTILE.findall(text)}
    if not total or not rate or set(percentiles) != {"50", "99"}:
        raise RuntimeError(f"wrk output not understood:\n{text}")
    non_2xx = _NON_2XX.search(text)
    sockets = _SOCKET.search(text)
    return {
        "requests": int(total.group(1)), "wall_s": _ms(total.group(2), total.group(3)) / 1000,
        "requests_per_s": float(rate.group(1)), "p50_ms": percentiles["50"],
        "p99_ms": percentiles["99"], "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": sum(int(n) for n in sockets.groups()) if sockets else 0,
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_wrk(binary: str, url: str, seconds: int, connections: int, pids) -> dict:  # type: ignore[no-untyped-def]
    """wrk -t2 -c``connections`` -d``seconds``s --latency against ``url``,
    the CPU of the ``pids`` groups metered around it."""
    figures: dict = {}
    wrk_before = _children_cpu()
    with cpu_meter(pids, figures):
        done = subprocess.run([binary, f"-t{WRK_THREADS}", f"-c{connections}", f"-d{seconds}s",
                               "--latency", url], capture_output=True, text=True,
                              timeout=seconds + 60, check=False)
    wrk_cpu = _children_cpu() - wrk_before
    if done.returncode != 0:
        raise RuntimeError(f"wrk exited {done.returncode}: {done.stderr.strip() or done.stdout}")
    figures |= parse_wrk(done.stdout)
    for name in pids:
        cpu = figures.pop(f"{name}_cpu_s")
        figures[f"{name}_cpu_per_1k"] = cpu * 1000 / max(figures["requests"], 1)
        figures[f"{name}_cores"] = cpu / figures["wall_s"]
    figures["wrk_cores"] = wrk_cpu / figures["wall_s"]
    return figures


def server_efficiency(binary: str, url: str, size: int, seconds: int, connections: int,
                      pids) -> dict:  # type: ignore[no-untyped-def]
    """``url`` checked with curl, then hammered by wrk: the figures."""
    check_url(url, size)
    return run_wrk(binary, url, seconds, connections, pids)
