"""The soak benchmark (``benchmarks/soak.py``), kept working.

A short run of the real thing: moto as the capacity store, the gateway with a
hot tier smaller than the data set, four client threads mixing PUTs,
overwrites, multipart uploads, GETs, range GETs, HEADs, listings,
deletes, batch GETs, copies and aborted uploads, with hostile clients and
an operator flushing and evicting beside them, every answer checked against what was acknowledged. The run must
end with zero errors, a clean fsck and every figure of the report present.
Its length and throughput are not judged here, and neither is the memory
slope (a 10 s run is all warm-up); the slope's arithmetic and verdict are
checked on made-up samples instead.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
KINDS = {"get", "get_large", "get_range", "head", "put", "overwrite", "put_large", "delete", "list",
         "batch", "copy", "abort_upload"}


@pytest.fixture
def workload(monkeypatch: pytest.MonkeyPatch):
    """The benchmark's workload module (its siblings import each other by name)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import _soak_workload

    return _soak_workload


@pytest.fixture
def measure(monkeypatch: pytest.MonkeyPatch):
    """The benchmark's measurement module: figures, verdict, log reading."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import _soak_measure

    return _soak_measure


def run_soak(json_path: Path) -> subprocess.CompletedProcess[str]:
    args = ["--seconds", "10", "--threads", "4", "--dataset-size", "32M", "--hot-size", "16M",
            "--large-objects", "1", "--large-min", "10M", "--large-max", "12M",
            "--max-rss-slope", "inf", "--json", str(json_path),
            # The hostile mix: batch GETs, copies, aborted uploads, broken
            # clients and an operator flushing and evicting.
            "--hostile", "--operator-every", "3", "--rate", "200"]
    proc = subprocess.Popen([sys.executable, str(BENCHMARKS / "soak.py"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the soak stops its gateway and moto on the way out
        stdout, stderr = proc.communicate(timeout=90)
        pytest.fail(f"the soak did not end within 240 s:\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_short_soak_answers_every_request_correctly(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = run_soak(out)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    results = json.loads(out.read_text())["results"]
    summary = results["summary"]

    assert results["errors"] == 0 and results["first_errors"] == []
    assert summary["passed"] and summary["failures"] == []
    assert results["final_listing"]["ok"] and results["fsck_problems"] == []
    assert results["gateway_log"]["errors"] == results["gateway_log"]["tracebacks"] == 0
    assert set(summary["ops"]) == KINDS
    for kind in ("get", "get_range", "head", "overwrite", "delete", "list", "batch", "copy",
                 "abort_upload"):
        assert summary["ops"][kind]["count"] > 0, kind
        assert summary["ops"][kind]["p99_ms"] >= summary["ops"][kind]["p50_ms"] > 0
    assert summary["total_ops"] == sum(o["count"] for o in summary["ops"].values())
    assert results["verified_bytes"] > 0
    hostile = results["hostile"]
    assert hostile["flush"] > 0 and hostile["evict"] > 0, hostile
    assert sum(n for kind, n in hostile.items() if kind not in ("flush", "evict")) > 10, hostile

    # A data set larger than the hot tier: objects were evicted and read back.
    tiers = results["end"]["tiers"]
    assert tiers["evicted"] > 0 and tiers["cache_misses"] > 0
    assert results["capacity"]["gets"] > 0

    memory = summary["memory"]
    assert set(memory["at"]) == {"25", "50", "75", "100"}
    assert memory["peak_mib"] >= max(memory["at"].values()) > 0
    assert isinstance(memory["slope_mib_per_min"], float)
    assert results["samples"] and all(s["rss_kib"] > 0 for s in results["samples"])
    assert "| get_range |" in done.stdout and "Verdict: **passed**" in done.stdout


def samples(rss_mib: list[float]) -> list[dict]:
    return [{"t": float(t), "rss_kib": int(mib * 1024)} for t, mib in enumerate(rss_mib)]


def test_rss_slope_is_measured_over_the_second_half(measure) -> None:
    # Growth while warming up, then flat with noise: flat.
    warm = [100 + t for t in range(60)] + [160 + (t % 3) for t in range(60)]
    figures = measure.rss_figures(samples(warm), seconds=120, hwm_kib=170 * 1024)
    assert abs(figures["slope_mib_per_min"]) < 1
    assert figures["at"]["25"] == pytest.approx(130, abs=1) and figures["peak_mib"] == 170
    # 0.2 MiB a second from the middle on: 12 MiB/min.
    leak = [100.0] * 60 + [100 + 0.2 * t for t in range(60)]
    figures = measure.rss_figures(samples(leak), seconds=120, hwm_kib=0)
    assert figures["slope_mib_per_min"] == pytest.approx(12, rel=0.05)
    # Buffers of requests in flight at the end: every sample's fit tilts, the floor does not.
    spike = [100.0] * 115 + [250.0] * 5
    figures = measure.rss_figures(samples(spike), seconds=120, hwm_kib=0)
    assert figures["raw_slope_mib_per_min"] > 20
    assert figures["slope_mib_per_min"] == pytest.approx(0, abs=0.01)


def test_a_growing_rss_fails_the_run(measure) -> None:
    args = type("Args", (), {"max_rss_slope": measure.MAX_RSS_SLOPE})()
    leak = samples([100 + 0.5 * t for t in range(120)])
    run = {"wall_s": 120.0, "latencies": {k: [0.01] for k in KINDS}, "errors_by_kind": {},
           "errors": 0, "fill_errors": 0, "final_listing": {"ok": True}, "fsck_problems": [],
           "samples": leak, "end": {"VmHWM": 0}, "bytes_up": 0, "bytes_down": 0,
           "gateway_log": {"errors": 0, "tracebacks": 0}}
    summary = measure.summarise(run, args)
    assert not summary["passed"]
    assert summary["failures"] == [
        "the RSS floor grows 30.0 MiB/min over the second half (limit 10)"]
    flat = samples([100.0] * 120)
    assert measure.summarise(run | {"samples": flat}, args)["passed"]
    assert not measure.summarise(run | {"samples": flat, "errors": 1, "errors_by_kind": {"get": 1}},
                                 args)["passed"]
    logged = {"errors": 0, "tracebacks": 1}
    assert not measure.summarise(run | {"samples": flat, "gateway_log": logged}, args)["passed"]


def test_errors_in_the_gateway_log_are_counted(measure, tmp_path: Path) -> None:
    log = tmp_path / "data-gateway.log"
    log.write_text("\n".join([
        "2026-01-01 10:00:00,001 INFO tierstore: serving",
        "time=2026-01-01T10:00:00.002Z op=GetObject status=500 error=InternalError",
        "2026-01-01 10:00:01,000 WARNING tierstore.flush: slow",
        "2026-01-01 10:00:02,000 ERROR tierstore.flush: segment upload failed",
        "ERROR:    Exception in ASGI application",
        "Traceback (most recent call last):",
        '  File "gateway/app.py", line 1, in __call__',
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "gateway/app.py", line 2, in __call__',
        "RuntimeError: boom",
    ]))
    found = measure.log_problems(log)
    assert (found["warnings"], found["errors"], found["tracebacks"]) == (1, 2, 2)
    assert found["first_errors"] == [
        "2026-01-01 10:00:02,000 ERROR tierstore.flush: segment upload failed",
        "ERROR:    Exception in ASGI application",
        "raised KeyError: 'x'",
        "raised RuntimeError: boom"]


class FakeBody:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self) -> bytes:
        return self.data

    def iter_chunks(self, size: int):
        return (self.data[i:i + size] for i in range(0, len(self.data), size))


class LyingS3:
    """An in-memory S3 bucket for one worker that can be told to lie: flip
    a byte of every body, or ignore deletes."""

    def __init__(self, workload) -> None:
        self.workload = workload
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.flip = self.keep_deleted = False

    def put_object(self, Bucket: str, Key: str, Body: bytes) -> None:
        self.objects[Key] = (Body, f'"{hashlib.md5(Body).hexdigest()}"')

    def upload_fileobj(self, fileobj, bucket: str, key: str, Config) -> None:
        data = fileobj.read()
        etag = self.workload.multipart_etag(memoryview(data), Config.multipart_chunksize)
        self.objects[key] = (data, f'"{etag}"')

    def _find(self, key: str, code: str) -> tuple[bytes, str]:
        if key not in self.objects:
            raise ClientError({"Error": {"Code": code}}, "op")
        return self.objects[key]

    def get_object(self, Bucket: str, Key: str, Range: str | None = None) -> dict:
        data = self._find(Key, "NoSuchKey")[0]
        if Range:
            start, end = map(int, Range.removeprefix("bytes=").split("-"))
            data = data[start:end + 1]
        if self.flip:
            data = bytes([data[0] ^ 1]) + data[1:]
        return {"Body": FakeBody(data)}

    def head_object(self, Bucket: str, Key: str) -> dict:
        data, etag = self._find(Key, "404")
        return {"ContentLength": len(data), "ETag": etag}

    def delete_object(self, Bucket: str, Key: str) -> None:
        if not self.keep_deleted:
            self.objects.pop(Key, None)

    def get_paginator(self, name: str):
        objects = self.objects

        class Pages:
            def paginate(self, Bucket: str, Prefix: str = ""):
                return [{"Contents": [{"Key": k, "Size": len(d), "ETag": e}
                                      for k, (d, e) in sorted(objects.items())
                                      if k.startswith(Prefix)]}]

        return Pages()


@pytest.mark.parametrize("lie", ["flip", "keep_deleted"])
def test_the_checks_catch_a_lying_store(workload, lie: str) -> None:
    plan = workload.Plan(threads=1, small_keys=20, large_keys=1, small=(4096, 65536),
                         large=(65536, 131072))  # "large" only in name: the store is a dict
    s3 = LyingS3(workload)
    worker = workload.Worker(0, s3, plan, workload.Pool(2**20, seed=1), seed=1)
    worker.fill(threading.Event())
    for _ in range(300):
        worker.step()
    assert worker.tally.errors.total() == 0, worker.tally.first_errors
    done = {k for k, v in worker.tally.latencies.items() if v}
    assert done >= {"get", "get_range", "head", "delete", "list"}

    setattr(s3, lie, True)
    for _ in range(300):
        worker.step()
    assert worker.tally.errors.total() > 0
    assert all("Mismatch" in e["error"] for e in worker.tally.first_errors)
