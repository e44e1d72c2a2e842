"""Metrics: counters and labels, the percentile estimator, /stats, the
Prometheus exposition, and S3App recording real requests in process."""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import S3App
from gateway.config.values import Config
from gateway.node import Node
from gateway.observability.accesslog import AccessLog
from gateway.observability.metrics import CONTENT_TYPE, LATENCY_BUCKETS, Metrics, quantile, tier_of
from tiering.reads.plan import ReadTally

# --------------------------------------------------------------------------
# Counters and labels


def _value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_observe_counts_by_operation_status_and_tier() -> None:
    m = Metrics()
    m.observe("PutObject", 200, "none", 0.003, received=100, sent=0)
    m.observe("PutObject", 200, "none", 0.004, received=50, sent=0)
    m.observe("GetObject", 404, "none", 0.001, received=0, sent=200)
    m.observe("GetObject", 200, "hot", 0.002, received=0, sent=10, served_hot=10)
    m.observe("GetObject", 206, "capacity", 0.5, received=0, sent=30, served_hot=5, served_capacity=25)

    assert _value(m, "tierstore_s3_requests_total", operation="PutObject", code="200") == 2
    assert _value(m, "tierstore_s3_requests_total", operation="GetObject", code="404") == 1
    assert _value(m, "tierstore_s3_requests_total", operation="GetObject", code="206") == 1
    assert _value(m, "tierstore_s3_received_bytes_total", operation="PutObject") == 150
    assert _value(m, "tierstore_s3_sent_bytes_total", operation="GetObject") == 240
    assert _value(m, "tierstore_s3_request_duration_seconds_count", operation="PutObject", tier="none") == 2
    assert _value(m, "tierstore_s3_request_duration_seconds_sum", operation="GetObject", tier="capacity") == 0.5
    assert _value(m, "tierstore_s3_request_duration_seconds_bucket",
                  operation="PutObject", tier="none", le="0.004") == 2
    assert _value(m, "tierstore_object_reads_total", tier="hot") == 1
    assert _value(m, "tierstore_object_reads_total", tier="capacity") == 1
    assert _value(m, "tierstore_object_reads_total", tier="none") is None  # only hot|capacity
    assert _value(m, "tierstore_served_bytes_total", tier="hot") == 15
    assert _value(m, "tierstore_served_bytes_total", tier="capacity") == 25


def test_instances_are_independent_of_each_other_and_of_the_default_registry() -> None:
    a, b = Metrics(), Metrics()
    a.observe("GetObject", 200, "hot", 0.001, 0, 1, served_hot=1)
    assert _value(a, "tierstore_s3_requests_total", operation="GetObject", code="200") == 1
    assert _value(b, "tierstore_s3_requests_total", operation="GetObject", code="200") is None
    assert REGISTRY.get_sample_value("tierstore_s3_requests_total", {"operation": "GetObject", "code": "200"}) is None


def test_tier_of() -> None:
    assert tier_of(None) == "none"
    assert tier_of(ReadTally()) == "none"  # a GET that read no body (an error, an empty object)
    assert tier_of(ReadTally(hot=10)) == "hot"
    assert tier_of(ReadTally(hot=10, capacity=1)) == "capacity"
    assert tier_of(ReadTally(capacity=1)) == "capacity"
    assert tier_of(ReadTally(hot=10, peer=5)) == "peer"  # from the cluster node that keeps it
    assert tier_of(ReadTally(peer=5, capacity=1)) == "capacity"


def test_buckets_cover_a_fraction_of_a_millisecond_to_thirty_seconds() -> None:
    assert LATENCY_BUCKETS[0] == 0.0002 and LATENCY_BUCKETS[-1] == 30.0
    assert list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS)
    ratios = [b / a for a, b in zip(LATENCY_BUCKETS, LATENCY_BUCKETS[1:], strict=False)]
    assert max(ratios) <= 2.1  # a step never more than doubles: estimates stay close


# --------------------------------------------------------------------------
# Percentile estimator


def _cumulative(bounds: list[float], values: list[float]) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of ``values`` over ``bounds`` plus +Inf."""
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1
    out, total = [], 0
    for bound, count in zip([*bounds, float("inf")], counts, strict=True):
        total += count
        out.append((bound, float(total)))
    return out


def test_quantile_of_a_uniform_distribution_is_exact() -> None:
    # 100 values spread evenly over (0, 10], buckets of width 1.
    buckets = _cumulative([float(b) for b in range(1, 11)], [i / 10 for i in range(1, 101)])
    assert quantile(0.5, buckets) == pytest.approx(5.0)
    assert quantile(0.9, buckets) == pytest.approx(9.0)
    assert quantile(0.99, buckets) == pytest.approx(9.9)
    assert quantile(1.0, buckets) == pytest.approx(10.0)
    assert quantile(0.0, buckets) == pytest.approx(0.0)


def test_quantile_interpolates_inside_one_bucket() -> None:
    # Everything in (0.1, 0.2]: the estimate is spread linearly across it.
    buckets = [(0.1, 0.0), (0.2, 100.0), (float("inf"), 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.15)
    assert quantile(0.25, buckets) == pytest.approx(0.125)
    # The first bucket starts at 0.
    assert quantile(0.5, [(0.1, 4.0), (float("inf"), 4.0)]) == pytest.approx(0.05)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    buckets = [(1.0, 10.0), (30.0, 50.0), (float("inf"), 100.0)]
    assert quantile(0.99, buckets) == 30.0
    assert quantile(0.5, buckets) == pytest.approx(30.0)  # rank 50 is the last of (1, 30]
    assert quantile(0.3, buckets) == pytest.approx(1.0 + 29.0 * (30 - 10) / 40)


def test_quantile_of_nothing_is_none_and_q_is_checked() -> None:
    assert quantile(0.5, []) is None
    assert quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None
    with pytest.raises(ValueError):
        quantile(1.5, [(1.0, 1.0), (float("inf"), 1.0)])


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_quantile_estimate_stays_in_the_true_quantiles_bucket(q: float) -> None:
    """Log-normal latencies (median 5 ms, long tail), through Metrics itself:
    the estimate lies in the bucket holding the exact sample quantile."""
    rng = random.Random(7)
    samples = sorted(rng.lognormvariate(mu=-5.3, sigma=1.2) for _ in range(20_000))
    m = Metrics()
    for s in samples:
        m.observe("GetObject", 200, "hot", s, 0, 0)
    exact = samples[int(q * len(samples)) - 1]
    estimate = m.stats()["requests"]["GetObject"]["latency_ms"][f"p{round(q * 100)}"] / 1000  # type: ignore[index]
    bounds = [0.0, *LATENCY_BUCKETS, float("inf")]
    i = bisect.bisect_left(bounds, exact)
    assert bounds[i - 1] <= estimate <= bounds[i] + 1e-9, (exact, estimate)
    assert estimate == pytest.approx(exact, rel=0.4)


# --------------------------------------------------------------------------
# /stats


def test_stats_before_any_request() -> None:
    stats = Metrics().stats()
    assert stats["requests"] == {}
    assert stats["hit_ratio"] == {"objects": None, "bytes": None}
    assert stats["served"] == {"hot": {"objects": 0, "bytes": 0}, "peer": {"objects": 0, "bytes": 0},
                               "capacity": {"objects": 0, "bytes": 0}}
    assert isinstance(stats["since"], str) and stats["since"].endswith("Z")
    assert isinstance(stats["uptime_s"], float) and stats["uptime_s"] >= 0


def test_stats_requests_and_hit_ratio() -> None:
    m = Metrics()
    m.observe("PutObject", 200, "none", 0.002, received=1000, sent=0)
    m.observe("HeadObject", 404, "none", 0.001, received=0, sent=0)
    m.observe("HeadObject", 200, "none", 0.001, received=0, sent=0)
    stats = m.stats()
    assert stats["hit_ratio"] == {"objects": None, "bytes": None}  # HEAD and PUT are no reads
    m.observe("GetObject", 200, "hot", 0.001, 0, 300, served_hot=300)
    m.observe("GetObject", 200, "hot", 0.001, 0, 300, served_hot=300)
    m.observe("GetObject", 200, "hot", 0.001, 0, 300, served_hot=300)
    m.observe("GetObject", 200, "capacity", 0.1, 0, 900, served_hot=0, served_capacity=900)
    m.observe("GetObject", 503, "none", 0.01, 0, 250)
    stats = m.stats()
    requests = stats["requests"]
    assert set(requests) == {"PutObject", "HeadObject", "GetObject"}  # type: ignore[arg-type]
    put = requests["PutObject"]  # type: ignore[index]
    assert {k: put[k] for k in ("count", "errors", "bytes_in", "bytes_out")} == {
        "count": 1, "errors": 0, "bytes_in": 1000, "bytes_out": 0}
    assert requests["HeadObject"]["errors"] == 1  # type: ignore[index]
    get = requests["GetObject"]  # type: ignore[index]
    assert (get["count"], get["errors"], get["bytes_out"]) == (5, 1, 2050)
    latency = get["latency_ms"]
    assert set(latency) == {"p50", "p90", "p99"}
    assert 0.7 <= latency["p50"] <= 1.0  # three of five in (0.7 ms, 1 ms]
    assert latency["p50"] <= latency["p90"] <= latency["p99"] <= 150
    assert stats["hit_ratio"] == {"objects": 0.75, "bytes": 0.5}
    assert stats["served"] == {"hot": {"objects": 3, "bytes": 900}, "peer": {"objects": 0, "bytes": 0},
                               "capacity": {"objects": 1, "bytes": 900}}
    json.dumps(stats)  # the admin endpoint returns it as is


# --------------------------------------------------------------------------
# Prometheus exposition


TIER_STATUS: dict[str, object] = {
    "hot_budget": 1000, "hot_used": 600, "hot_staged": 100, "hot_cached": 450, "hot_pinned": 200,
    "hot_reserved": 50, "high_watermark": 900, "low_watermark": 800, "evicted": 12345,
    "cache_hits": 40, "cache_misses": 2, "segments": 3, "capacity_bytes": 3000, "capacity_live": 2500,
    "live_ratio": 0.8333, "flush_queue": 4, "pending_records": 1, "segments_written": 7,
    "last_flush_error": "capacity unreachable", "capacity": "file:///x",
    "capacity_requests": {"puts": 7, "gets": 9, "heads": 0, "deletes": 1, "lists": 2, "retries": 3},
    "capacity_bytes_read": 4096, "capacity_bytes_written": 8192,
}


def _families(text: bytes) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def _samples(families: dict[str, Any], family: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in families[family].samples}


def test_render_parses_and_holds_request_tier_and_job_series() -> None:
    m = Metrics()
    m.observe("GetObject", 200, "hot", 0.001, 0, 10, served_hot=10)
    text = m.render(TIER_STATUS, {"running": 1, "succeeded": 4, "failed": 0, "cancelled": 0})
    assert CONTENT_TYPE.startswith("text/plain")
    families = _families(text)

    for name, kind in [
        ("tierstore_s3_requests", "counter"), ("tierstore_s3_request_duration_seconds", "histogram"),
        ("tierstore_s3_received_bytes", "counter"), ("tierstore_s3_sent_bytes", "counter"),
        ("tierstore_object_reads", "counter"), ("tierstore_served_bytes", "counter"),
        ("tierstore_hot_budget_bytes", "gauge"), ("tierstore_hot_used_bytes", "gauge"),
        ("tierstore_hot_bytes", "gauge"), ("tierstore_hot_watermark_bytes", "gauge"),
        ("tierstore_hot_evicted_bytes", "counter"), ("tierstore_hot_cache_lookups", "counter"),
        ("tierstore_capacity_segments", "gauge"), ("tierstore_capacity_stored_bytes", "gauge"),
        ("tierstore_capacity_live_bytes", "gauge"), ("tierstore_capacity_live_ratio", "gauge"),
        ("tierstore_flush_queue_items", "gauge"), ("tierstore_pending_records", "gauge"),
        ("tierstore_capacity_segments_written", "counter"), ("tierstore_capacity_requests", "counter"),
        ("tierstore_capacity_retries", "counter"), ("tierstore_capacity_read_bytes", "counter"),
        ("tierstore_capacity_written_bytes", "counter"), ("tierstore_flush_failing", "gauge"),
        ("tierstore_jobs", "gauge"), ("tierstore_start_time_seconds", "gauge"),
    ]:
        assert families[name].type == kind, name

    hot = _samples(families, "tierstore_hot_bytes")
    assert hot == {("tierstore_hot_bytes", (("state", s),)): v
                   for s, v in [("staged", 100), ("cached", 450), ("pinned", 200), ("reserved", 50)]}
    requests = _samples(families, "tierstore_capacity_requests")
    assert requests[("tierstore_capacity_requests_total", (("kind", "gets"),))] == 9
    assert all(labels != (("kind", "retries"),) for _, labels in requests)
    assert _samples(families, "tierstore_capacity_retries") == {("tierstore_capacity_retries_total", ()): 3}
    assert _samples(families, "tierstore_flush_failing") == {("tierstore_flush_failing", ()): 1}
    jobs = _samples(families, "tierstore_jobs")
    assert jobs[("tierstore_jobs", (("state", "succeeded"),))] == 4
    assert _samples(families, "tierstore_s3_requests")[
        ("tierstore_s3_requests_total", (("code", "200"), ("operation", "GetObject")))] == 1
    assert not [name for name in families if name.endswith("_created")]


def test_render_without_status_and_with_a_partial_one() -> None:
    m = Metrics()
    families = _families(m.render(None, None))
    assert "tierstore_hot_budget_bytes" not in families and "tierstore_jobs" not in families
    # An older /tiers body (no pinned, no live ratio): what is there is exported.
    partial = {k: v for k, v in TIER_STATUS.items() if k not in ("hot_pinned", "live_ratio", "capacity_requests")}
    partial["last_flush_error"] = None
    families = _families(m.render(partial, {}))
    assert len(families["tierstore_hot_bytes"].samples) == 3
    assert "tierstore_capacity_live_ratio" not in families
    assert "tierstore_capacity_requests" not in families
    assert families["tierstore_flush_failing"].samples[0].value == 0


# --------------------------------------------------------------------------
# S3App records every request (in process, real object service)


AK, SK = "metrics-test-key", "metrics-test-secret"
MiB = 1024 * 1024


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _scope(method: str, path: str, query: str, body: bytes) -> dict[str, Any]:
    host = "127.0.0.1:9100"
    request = AWSRequest(method=method, url=f"http://{host}{path}" + (f"?{query}" if query else ""),
                         data=body, headers={"host": host, "content-length": str(len(body))})
    S3SigV4Auth(Credentials(AK, SK), "s3", "us-east-1").add_auth(request)
    headers = [(k.lower().encode(), v.encode()) for k, v in request.headers.items()]
    return {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
            "query_string": query.encode(), "headers": headers, "client": ("127.0.0.1", 50000)}


async def _call(app: S3App, method: str, path: str, query: str = "", body: bytes = b"",
                leave_after: int | None = None) -> tuple[int, bytes]:
    """One request; with ``leave_after``, the client disconnects once that
    many body bytes arrived."""
    received = bytearray()
    status = 0
    gone = asyncio.Event()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not gone.is_set():  # a server drops what is sent after a disconnect
            received.extend(message.get("body", b""))
            if leave_after is not None and len(received) >= leave_after:
                gone.set()

    await app(_scope(method, path, query, body), receive, send)
    return status, bytes(received)


def test_s3app_records_operations_bytes_tiers_and_disconnects(tmp_path: Path) -> None:
    config = Config(data_dir=tmp_path / "data", credentials={AK: SK}, admin_token="t", access_log="off",
                    flush_delay=3600.0)
    node = Node(config)
    app = S3App(config, node, node.metrics, node.access_log)
    assert not app.access_log.enabled
    logger = logging.getLogger("tierstore.access.test-metrics")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    records = _Records()
    logger.addHandler(records)
    app.access_log = AccessLog("json", logger=logger)
    big = bytes(range(256)) * (12 * 1024)  # 3 MiB: streamed in ~1 MiB blocks
    small = b"0123456789" * 100

    async def scenario() -> None:
        assert (await _call(app, "GET", "/"))[0] == 503  # not started: counted all the same
        await node.start()
        try:
            assert (await _call(app, "PUT", "/bkt"))[0] == 200
            assert (await _call(app, "PUT", "/bkt/big", body=big))[0] == 200
            assert (await _call(app, "PUT", "/bkt/small", body=small))[0] == 200
            assert await _call(app, "GET", "/bkt/small") == (200, small)
            status, got = await _call(app, "GET", "/bkt/big", leave_after=1)
            assert status == 200 and 0 < len(got) < len(big)
            assert (await _call(app, "GET", "/bkt", "list-type=2"))[0] == 200
            assert (await _call(app, "GET", "/bkt/missing"))[0] == 404
            assert (await _call(app, "PATCH", "/bkt/small"))[0] == 405
            service = node.tiering
            assert service is not None
            await service.tiers.flush()
            await service.tiers.residency.evict()
            assert await _call(app, "GET", "/bkt/small") == (200, small)  # from the capacity store
            await service.tiers.reader.drain()  # the hot tier is filled in the background
            assert await _call(app, "GET", "/bkt/small") == (200, small)  # cached by the fetch
        finally:
            await node.stop()

    asyncio.run(scenario())
    logger.removeHandler(records)

    lines = [json.loads(line) for line in records.lines]
    ops = [(r["op"], r["status"], r["tier"]) for r in lines]
    assert ops == [
        ("Unknown", 503, "none"),
        ("CreateBucket", 200, "none"), ("PutObject", 200, "none"), ("PutObject", 200, "none"),
        ("GetObject", 200, "hot"), ("GetObject", 200, "hot"), ("ListObjectsV2", 200, "none"),
        ("GetObject", 404, "none"), ("Unknown", 405, "none"),
        ("GetObject", 200, "capacity"), ("GetObject", 200, "hot"),
    ]
    put_big, get_big = lines[2], lines[5]
    assert put_big["bytes_in"] == len(big) and put_big["key"] == "big"
    assert get_big["error"] == "ClientDisconnected"
    assert MiB <= get_big["bytes_out"] < len(big)  # what was sent before the client left
    assert lines[7]["error"] == "NoSuchKey" and lines[8]["error"] == "MethodNotAllowed"
    assert lines[4]["bytes_out"] == len(small)

    stats = app.metrics.stats()
    get = stats["requests"]["GetObject"]  # type: ignore[index]
    assert (get["count"], get["errors"]) == (5, 1)
    assert stats["served"]["capacity"] == {"objects": 1, "bytes": len(small)}  # type: ignore[index]
    assert stats["served"]["hot"]["objects"] == 3  # type: ignore[index]
    assert stats["hit_ratio"]["objects"] == 0.75  # type: ignore[index]
    assert stats["requests"]["PutObject"]["bytes_in"] == len(big) + len(small)  # type: ignore[index]
    assert stats["requests"]["Unknown"]["errors"] == 2  # type: ignore[index]
