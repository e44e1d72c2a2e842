"""Memory a real gateway reports and keeps to: every cache's bytes and
bound in GET /stats and /metrics, caches filled past their bounds by
requests staying under them, and over its memory budget 503 SlowDown to
S3 work while the operator's routes answer."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
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
