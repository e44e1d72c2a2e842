"""Memory a real gateway reports and keeps to: every cache's bytes and
bound in GET /stats and /metrics, caches filled past their bounds by
requests staying under them, and over its memory budget 503 SlowDown to
S3 work while the operator's routes answer; large bodies admitted by the
bytes they hold, so RSS stays under the budget."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from tests.conftest import make_client, running_gateway
from tests.servers import ACCESS_KEY, SECRET_KEY, Gateway

KiB = 1024
MiB = 1024 * KiB


def _cache_gauges(text: str, name: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in re.finditer(rf'^{name}\{{cache="([a-z_]+)"\}} (\S+)$', text, re.M)}


def test_caches_filled_by_requests_stay_within_their_bounds(tmp_path: Path) -> None:
    bounds = {"records": 128 * KiB, "heads": 32 * KiB, "decisions": 32 * KiB}
    sizes = ",".join(f"{name}={size}" for name, size in bounds.items())
    with running_gateway(tmp_path / "data", "--cache-sizes", sizes) as gw:
        s3 = make_client(gw.endpoint)
        s3.create_bucket(Bucket="fill")
        for i in range(300):
            s3.put_object(Bucket="fill", Key=f"k/{i:04d}", Body=b"x" * 100)
        for i in range(300):
            assert s3.get_object(Bucket="fill", Key=f"k/{i:04d}")["Body"].read() == b"x" * 100
        memory = gw.admin("GET", "/stats").json()["memory"]
        caches = memory["caches"]
        for name, bound in bounds.items():
            assert caches[name]["bound"] == bound and caches[name]["configured"] == bound
            assert caches[name]["bytes"] <= bound
        # Past the bound: full, and fewer entries than objects read.
        assert caches["records"]["bytes"] > bounds["records"] // 2
        assert 0 < caches["records"]["entries"] < 300
        assert 0 < caches["heads"]["entries"] < 300 and caches["heads"]["bytes"] > bounds["heads"] // 2
        assert memory["rss"] > 0 and memory["limit"] is None and not memory["refusing"]

        text = gw.admin("GET", "/metrics").text
        assert _cache_gauges(text, "tierstore_cache_bound_bytes")["records"] == bounds["records"]
        held = _cache_gauges(text, "tierstore_cache_bytes")
        assert set(held) >= set(bounds) and all(held[name] <= bound for name, bound in bounds.items())
        assert 0 < _cache_gauges(text, "tierstore_cache_entries")["heads"] < 300
        assert re.search(r"^tierstore_memory_rss_bytes \d", text, re.M)


def test_over_its_memory_budget_the_gateway_refuses_s3_work_but_answers_the_operator(tmp_path: Path) -> None:
    # 64 MiB is less than the process's own RSS once it serves: over the budget from the start.
    with running_gateway(tmp_path / "data", "--memory-limit", "64M") as gw:
        assert gw.admin("GET", "/health").status_code == 200
        memory = wait_for(lambda: (m := gw.admin("GET", "/stats").json()["memory"])["refusing"] and m)
        s3 = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                          config=BotoConfig(retries={"mode": "standard", "total_max_attempts": 1}))
        with pytest.raises(ClientError) as refused:
            s3.get_object(Bucket="any", Key="k")
        answer = refused.value.response
        assert answer["Error"]["Code"] == "SlowDown"
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert answer["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "1"
        with pytest.raises(ClientError, match="SlowDown"):
            s3.list_buckets()
        with pytest.raises(ClientError, match="SlowDown"):
            s3.put_object(Bucket="any", Key="k", Body=b"small body")
        with pytest.raises(ClientError) as head:  # HEAD is not refused: it allocates no body
            s3.head_bucket(Bucket="any")
        assert head.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404

        memory = gw.admin("GET", "/stats").json()["memory"]
        assert memory["limit"] == 64 * MiB and memory["refuse_at"] == int(64 * MiB * 0.95)
        assert memory["rss"] > memory["refuse_at"] and memory["refusing"]
        assert memory["refused"] >= 3 and memory["sheds"] >= 1 and memory["squeeze"] < 1
        assert all(row["bound"] < row["configured"] for row in memory["caches"].values())  # shed
        text = gw.admin("GET", "/metrics").text
        assert "tierstore_memory_refusing 1.0" in text
        assert 'tierstore_s3_requests_total{code="503",operation="GetObject"} 1.0' in text  # one attempt
        status = tierstore_status(gw)
        assert "REFUSING" in status and "64.0 MiB" in status


def test_within_a_generous_budget_the_gateway_serves(tmp_path: Path) -> None:
    with running_gateway(tmp_path / "data", "--memory-limit", "16G") as gw:
        s3 = make_client(gw.endpoint)
        s3.create_bucket(Bucket="served")
        s3.put_object(Bucket="served", Key="k", Body=b"served")
        assert s3.get_object(Bucket="served", Key="k")["Body"].read() == b"served"
        memory = gw.admin("GET", "/stats").json()["memory"]
        assert memory["limit"] == 16 * 1024 * MiB and not memory["refusing"]
        assert memory["refused"] == 0 and memory["sheds"] == 0 and memory["squeeze"] == 1


def wait_for(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "the gateway never got there"
        time.sleep(0.1)
    return found


def tierstore_status(gw: Gateway) -> str:
    done = subprocess.run([sys.executable, "-m", "gateway", "status", "--admin-url", gw.admin_url],
                          env=gw.env(), capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def _rss(pid: int) -> int:
    """VmRSS of ``pid`` in bytes, from /proc (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KiB
    except OSError:
        pass
    return 0


class _Peak:
    """The gateway's RSS sampled from /proc by a thread of the test until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid, self.samples = pid, [_rss(pid)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.samples.append(_rss(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.samples)


# The budget of the tests of large PUTs: above an idle gateway's RSS (about
# 110 MiB, docs/configuration.md) with room for a few bodies. Without
# admission by bytes, 24 PUTs of 24 MiB at once took RSS from 110 to 182
# MiB; with it, to 148 at a budget of 176 MiB.
PUT_BUDGET = 160 * MiB
# What RSS may pass the budget by: pages the allocator has not handed back
# yet when the test samples (the budget's own shedding trims them).
TOLERANCE = 8 * MiB
PUTS = 24
BODY = 24 * MiB


def _concurrent_puts(gw: Gateway, attempts: int) -> tuple[list[str], int]:
    """PUTS bodies of BODY bytes at once, each client allowed ``attempts``;
    the outcome of each (``ok`` or its error code) and the peak RSS seen."""
    assert gw.proc is not None
    s3 = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=ACCESS_KEY,
                      aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                      config=BotoConfig(retries={"mode": "standard", "total_max_attempts": attempts},
                                        max_pool_connections=PUTS))
    s3.create_bucket(Bucket="bodies")
    body = bytes(range(256)) * (BODY // 256)

    def put(i: int) -> str:
        try:
            s3.put_object(Bucket="bodies", Key=f"b/{i:02d}", Body=body)
        except ClientError as exc:
            return str(exc.response["Error"]["Code"])
        return "ok"

    peak = _Peak(gw.proc.pid)
    with ThreadPoolExecutor(PUTS) as pool:
        outcomes = list(pool.map(put, range(PUTS)))
    return outcomes, peak.stop()


def test_concurrent_large_puts_are_admitted_by_their_bodies_bytes(tmp_path: Path) -> None:
    with running_gateway(tmp_path / "data", "--memory-limit", str(PUT_BUDGET)) as gw:
        outcomes, peak = _concurrent_puts(gw, attempts=1)
        memory = gw.admin("GET", "/stats").json()["memory"]
        buffers = memory["buffers"]
        # Some bodies were refused before a byte of them was read, the others stored.
        assert set(outcomes) == {"ok", "SlowDown"}, outcomes
        assert buffers["refused"] >= outcomes.count("SlowDown") and memory["refused"] >= outcomes.count("SlowDown")
        # (The peak may pass the limit by one reservation taken alone: a flush's.)
        assert buffers["peak"] > 0 and 0 < buffers["limit"] < PUT_BUDGET
        assert peak <= PUT_BUDGET + TOLERANCE, f"peak RSS {peak >> 20} MiB"
        text = gw.admin("GET", "/metrics").text
        assert re.search(r"^tierstore_memory_buffers_refused_total [1-9]", text, re.M)
        limit = re.search(r"^tierstore_memory_buffers_limit_bytes (\S+)$", text, re.M)
        assert limit is not None and float(limit[1]) == buffers["limit"]
        s3 = make_client(gw.endpoint)
        stored = [o["Key"] for o in s3.list_objects_v2(Bucket="bodies").get("Contents", [])]
        assert len(stored) == outcomes.count("ok")


def test_with_retries_every_large_put_lands_within_the_budget(tmp_path: Path) -> None:
    with running_gateway(tmp_path / "data", "--memory-limit", str(PUT_BUDGET)) as gw:
        outcomes, peak = _concurrent_puts(gw, attempts=20)
        assert outcomes == ["ok"] * PUTS
        assert peak <= PUT_BUDGET + TOLERANCE, f"peak RSS {peak >> 20} MiB"
        memory = gw.admin("GET", "/stats").json()["memory"]
        assert memory["peak_rss"] <= PUT_BUDGET + TOLERANCE
        gw.flush()  # each body streamed into a segment of its own, its bytes reserved and given back
        assert gw.admin("GET", "/stats").json()["memory"]["buffers"]["held"] == 0
        s3 = make_client(gw.endpoint)
        assert s3.get_object(Bucket="bodies", Key="b/07")["ContentLength"] == BODY
