"""The admin API through a real gateway over a real moto capacity store:
every route, its auth, its errors, and what its answers say about the data
the S3 clients wrote."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import assert_consistent, make_client, running_gateway
from tests.integration.test_capacity import capacity_args
from tests.servers import ADMIN_TOKEN, Gateway, free_port

MiB = 1024 * 1024
OPEN = {("GET", "/health"), ("GET", "/ready"), ("GET", "/openapi.json"), ("GET", "/docs"),
        ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc")}


@pytest.fixture(scope="module")
def gw(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("admin")
    args = capacity_args("s3", moto_endpoint, root, f"cap-admin-{os.getpid()}")
    with running_gateway(root / "data", *args, "--flush-delay", "3600") as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gw: Gateway):
    return make_client(gw.endpoint)


def call(gw: Gateway, method: str, path: str, **kwargs: object) -> httpx.Response:
    """An admin call with the token; no status check."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    return httpx.request(method, gw.admin_url + path, headers=headers, timeout=60, **kwargs)  # type: ignore[arg-type]


def error_of(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["message"]
    return body["error"]["code"]


def wait_job(gw: Gateway, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = call(gw, "GET", f"/jobs/{job_id}").json()
        if job["state"] != "running":
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still running after {timeout}s")


# -- probes, auth, errors -------------------------------------------------------


def test_probes_are_open_and_say_what_is_ready(gw: Gateway) -> None:
    assert httpx.get(f"{gw.admin_url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{gw.admin_url}/ready")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"index": "ok", "capacity": "ok"}}


def test_with_the_capacity_store_gone_ready_is_503_and_a_stuck_job_can_be_cancelled(tmp_path: Path) -> None:
    from moto.server import ThreadedMotoServer

    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    stopped = False
    args = capacity_args("s3", f"http://127.0.0.1:{port}", tmp_path, "gone")
    gateway = Gateway(tmp_path / "data", extra_args=[*args, "--flush-delay", "3600"]).start()
    try:
        make_client(gateway.endpoint).create_bucket(Bucket="cold")
        make_client(gateway.endpoint).put_object(Bucket="cold", Key="k", Body=b"c" * 10_000)
        gateway.flush()
        gateway.evict()
        assert httpx.get(f"{gateway.admin_url}/ready").status_code == 200
        moto.stop()
        stopped = True
        ready = httpx.get(f"{gateway.admin_url}/ready", timeout=30)
        assert ready.status_code == 503
        assert ready.json() == {"status": "unavailable", "checks": {"index": "ok", "capacity": "unreachable"}}
        assert httpx.get(f"{gateway.admin_url}/health").status_code == 200, "alive, just not ready"

        # A store that takes connections and never answers: the pin job's
        # fetch waits on it (against the closed port, its retries could all
        # be spent within the half second, their backoff being jittered).
        with socket.create_server(("127.0.0.1", port)):
            job = call(gateway, "POST", "/jobs/pin", json={"bucket": "cold"}).json()
            time.sleep(0.5)
            assert call(gateway, "GET", f"/jobs/{job['id']}").json()["state"] == "running"
            cancelled = call(gateway, "POST", f"/jobs/{job['id']}/cancel")
            assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
            assert cancelled.json()["finished"] is not None
    finally:
        gateway.stop()
        if not stopped:
            moto.stop()
    assert_consistent(gateway)


def test_every_route_but_the_probes_needs_the_token(gw: Gateway) -> None:
    schema = httpx.get(f"{gw.admin_url}/openapi.json").json()
    routes = [(m.upper(), p) for p, ops in schema["paths"].items() for m in ops]
    assert len(routes) >= 20
    for method, path in routes:
        if (method, path) in OPEN:
            continue
        url = gw.admin_url + path.replace("{name}", "b").replace("{job_id}", "j").replace(
            "{bucket}", "b").replace("{key}", "k")
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic eDp5"}):
            response = httpx.request(method, url, headers=headers)
            assert response.status_code == 401, (method, path, headers, response.text)
            assert error_of(response) == "Unauthorized"
            assert response.headers["www-authenticate"].startswith("Bearer")


def test_errors_have_one_shape(gw: Gateway) -> None:
    assert error_of(call(gw, "GET", "/no/such/route")) == "NotFound"
    assert error_of(call(gw, "DELETE", "/tiers")) == "MethodNotAllowed"
    bad = call(gw, "POST", "/jobs/compact", json={"threshold": 2})
    assert bad.status_code == 400 and error_of(bad) == "InvalidRequest"
    assert "threshold" in bad.json()["error"]["message"]
    assert error_of(call(gw, "POST", "/buckets", content=b"{not json")) == "InvalidRequest"


def test_config_hides_secrets(gw: Gateway) -> None:
    config = call(gw, "GET", "/config").json()
    assert config["admin_token"] == "***" and config["capacity_secret_key"] == "***"
    assert ADMIN_TOKEN not in call(gw, "GET", "/config").text


# -- buckets ----------------------------------------------------------------------


def test_bucket_lifecycle_with_a_policy(gw: Gateway, client) -> None:  # type: ignore[no-untyped-def]
    created = call(gw, "POST", "/buckets", json={
        "name": "adm-policy", "compression": False, "part_size": "6M",
        "small_object_size": 1024 * 1024, "write_through": True,
    })
    assert created.status_code == 201, created.text
    view = created.json()
    assert view | {"created": None} == {
        "name": "adm-policy", "created": None, "region": "us-east-1", "write_through": True,
        "compression": False, "part_size": 6 * MiB, "small_object_size": MiB, "pinned": False,
    }
    client.head_bucket(Bucket="adm-policy")  # an S3 bucket like any other
    assert error_of(call(gw, "POST", "/buckets", json={"name": "adm-policy"})) == "BucketAlreadyExists"
    assert error_of(call(gw, "POST", "/buckets", json={"name": "Bad_Name"})) == "InvalidBucketName"
    for bad in ({"name": "x-ok", "part_size": "1M"}, {"name": "x-ok", "colour": "red"},
                {"name": "x-ok", "part_size": "lots"}, {"name": "x-ok", "small_object_size": "1G"}):
        response = call(gw, "POST", "/buckets", json=bad)
        assert response.status_code == 400 and error_of(response) == "InvalidRequest", bad
    assert "adm-policy" in [b["name"] for b in call(gw, "GET", "/buckets").json()["buckets"]]

    # write-through: acknowledged only once in the capacity store, uncompressed, 6 MiB extents
    client.put_object(Bucket="adm-policy", Key="big", Body=b"a" * (13 * MiB))
    where = call(gw, "GET", "/objects/adm-policy/big").json()
    assert [c["size"] for c in where["chunks"]] == [6 * MiB, 6 * MiB, MiB]
    assert {c["state"] for c in where["chunks"]} == {"cached"} and where["where"] == "hot"
    assert {c["codec"] for c in where["chunks"]} == {"none"}

    patched = call(gw, "PATCH", "/buckets/adm-policy", json={"compression": True, "write_through": False})
    assert patched.json()["compression"] is True and patched.json()["write_through"] is False
    assert call(gw, "GET", "/buckets/adm-policy").json() == patched.json()
    assert error_of(call(gw, "DELETE", "/buckets/adm-policy")) == "BucketNotEmpty"
    client.delete_object(Bucket="adm-policy", Key="big")
    assert call(gw, "DELETE", "/buckets/adm-policy").status_code == 204
    for method in ("GET", "PATCH", "DELETE"):
        kwargs = {"json": {}} if method == "PATCH" else {}
        assert error_of(call(gw, method, "/buckets/adm-policy", **kwargs)) == "NoSuchBucket"


# -- where objects live, jobs, pins ------------------------------------------------------


def test_an_object_moves_through_the_tiers_and_jobs_report_it(gw: Gateway, client) -> None:  # type: ignore[no-untyped-def]
    client.create_bucket(Bucket="adm-jobs")
    for i in range(20):
        client.put_object(Bucket="adm-jobs", Key=f"train/{i:02d}", Body=os.urandom(100_000))
    client.put_object(Bucket="adm-jobs", Key="other", Body=b"x" * 1000)
    where = call(gw, "GET", "/objects/adm-jobs/train/00").json()
    assert where["where"] == "staged" and where["chunks"][0]["file_id"]

    started = call(gw, "POST", "/jobs/flush")
    assert started.status_code == 202 and started.json()["kind"] == "flush"
    job = wait_job(gw, started.json()["id"])
    assert job["state"] == "succeeded", job
    assert job["progress"]["items_done"] >= 21 and job["progress"]["bytes_done"] >= 2_000_000
    assert job["progress"]["fraction"] == 1.0 and job["finished"] and job["errors"] == []
    where = call(gw, "GET", "/objects/adm-jobs/train/00").json()
    assert where["where"] == "hot" and where["chunks"][0]["segment"]

    evicted = call(gw, "POST", "/jobs/evict", params={"wait": "true"},
                   json={"bucket": "adm-jobs", "prefix": "train/"})
    assert evicted.status_code == 200 and evicted.json()["state"] == "succeeded"
    assert evicted.json()["result"]["evicted_bytes"] == 2_000_000
    assert evicted.json()["progress"]["items_done"] == 20
    assert call(gw, "GET", "/objects/adm-jobs/train/05").json()["where"] == "capacity"
    assert call(gw, "GET", "/objects/adm-jobs/other").json()["where"] == "hot", "outside the prefix"

    pinned = call(gw, "POST", "/jobs/pin", params={"wait": "true"},
                  json={"bucket": "adm-jobs", "prefix": "train/"}).json()
    assert pinned["state"] == "succeeded" and pinned["result"]["fetched_bytes"] == 2_000_000
    assert pinned["progress"] == {"items_done": 20, "items_total": 20, "bytes_done": 2_000_000,
                                  "bytes_total": 2_000_000, "fraction": 1.0}
    where = call(gw, "GET", "/objects/adm-jobs/train/05").json()
    assert where["where"] == "hot" and where["pinned"] is True
    assert {"bucket": "adm-jobs", "prefix": "train/"} in call(gw, "GET", "/pins").json()["pins"]
    assert call(gw, "GET", "/tiers").json()["hot_pinned"] >= 2_000_000

    whole = call(gw, "POST", "/jobs/evict", params={"wait": "true"}).json()
    assert whole["result"]["skipped_pinned_bytes"] >= 2_000_000
    assert call(gw, "GET", "/objects/adm-jobs/train/05").json()["where"] == "hot", "pinned: never evicted"
    assert call(gw, "GET", "/objects/adm-jobs/other").json()["where"] == "capacity"

    assert call(gw, "DELETE", "/pins", params={"bucket": "adm-jobs", "prefix": "train/"}).status_code == 204
    assert error_of(call(gw, "DELETE", "/pins", params={"bucket": "adm-jobs", "prefix": "train/"})) == "NoSuchPin"
    call(gw, "POST", "/jobs/evict", params={"wait": "true"})
    assert call(gw, "GET", "/objects/adm-jobs/train/05").json()["where"] == "capacity"

    compact = call(gw, "POST", "/jobs/compact", params={"wait": "true"}, json={"threshold": 0.5}).json()
    assert compact["state"] == "succeeded" and set(compact["result"]) >= {"deleted", "rewritten", "bytes_reclaimed"}

    listed = call(gw, "GET", "/jobs").json()["jobs"]
    assert [j["id"] for j in listed][:2] == [compact["id"], listed[1]["id"]], "newest first"
    assert {j["kind"] for j in listed} >= {"flush", "evict", "pin", "compact"}
    assert error_of(call(gw, "POST", f"/jobs/{compact['id']}/cancel")) == "JobFinished"
    assert error_of(call(gw, "GET", "/jobs/nope")) == "NoSuchJob"
    assert error_of(call(gw, "POST", "/jobs/pin", json={"bucket": "no-such-bucket"})) == "NoSuchBucket"
    assert error_of(call(gw, "GET", "/objects/adm-jobs/missing")) == "NoSuchKey"
    assert error_of(call(gw, "GET", "/objects/no-such-bucket/k")) == "NoSuchBucket"


def test_bucket_pinned_policy_keeps_reads_hot(gw: Gateway, client) -> None:  # type: ignore[no-untyped-def]
    assert call(gw, "POST", "/buckets", json={"name": "adm-pinned", "pinned": True}).status_code == 201
    client.put_object(Bucket="adm-pinned", Key="k", Body=b"p" * 50_000)
    gw.flush()
    call(gw, "POST", "/jobs/evict", params={"wait": "true"})
    where = call(gw, "GET", "/objects/adm-pinned/k").json()
    assert (where["size"], where["pinned"], where["where"]) == (50_000, True, "hot")
    assert call(gw, "PATCH", "/buckets/adm-pinned", json={"pinned": False}).json()["pinned"] is False
    call(gw, "POST", "/jobs/evict", params={"wait": "true"})
    assert call(gw, "GET", "/objects/adm-pinned/k").json()["where"] == "capacity"


# -- tiers, stats, metrics ----------------------------------------------------------


def test_tiers_report_both_tiers(gw: Gateway) -> None:
    tiers = call(gw, "GET", "/tiers").json()
    for field in ("hot_budget", "hot_used", "hot_staged", "hot_cached", "hot_pinned", "high_watermark",
                  "low_watermark", "segments", "capacity_bytes", "capacity_live", "live_ratio",
                  "flush_queue", "capacity_requests", "capacity_bytes_read", "capacity_bytes_written"):
        assert field in tiers, field
    assert 0 <= tiers["live_ratio"] <= 1 and tiers["hot_used"] <= tiers["hot_budget"]


def _samples(gw: Gateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = call(gw, "GET", "/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.text)
        for s in family.samples
    }


def test_stats_and_metrics_move_with_s3_traffic(gw: Gateway, client) -> None:  # type: ignore[no-untyped-def]
    client.create_bucket(Bucket="adm-stats")
    client.put_object(Bucket="adm-stats", Key="k", Body=b"s" * 300_000)
    gw.flush()
    call(gw, "POST", "/jobs/evict", params={"wait": "true"})
    before = call(gw, "GET", "/stats").json()
    metrics_before = _samples(gw)

    assert client.get_object(Bucket="adm-stats", Key="k")["Body"].read() == b"s" * 300_000  # cold
    middle = call(gw, "GET", "/stats").json()
    for _ in range(3):
        client.get_object(Bucket="adm-stats", Key="k")["Body"].read()  # hot
    after = call(gw, "GET", "/stats").json()

    assert middle["served"]["capacity"]["objects"] == before["served"]["capacity"]["objects"] + 1
    assert after["served"]["hot"]["objects"] == middle["served"]["hot"]["objects"] + 3
    assert after["served"]["hot"]["bytes"] - middle["served"]["hot"]["bytes"] == 900_000
    assert after["hit_ratio"]["objects"] > middle["hit_ratio"]["objects"]
    assert after["hit_ratio"]["bytes"] > middle["hit_ratio"]["bytes"]
    gets = after["requests"]["GetObject"]
    assert gets["count"] - before["requests"].get("GetObject", {"count": 0})["count"] == 4
    assert gets["latency_ms"]["p50"] is not None and gets["latency_ms"]["p99"] >= gets["latency_ms"]["p50"]
    assert after["capacity"]["bytes_read"] > before["capacity"]["bytes_read"]
    assert after["since"] and after["uptime_s"] > 0

    metrics_after = _samples(gw)
    hot_reads = ("tierstore_object_reads_total", (("tier", "hot"),))
    assert metrics_after[hot_reads] - metrics_before.get(hot_reads, 0) == 3
    ok_gets = ("tierstore_s3_requests_total", (("code", "200"), ("operation", "GetObject")))
    assert metrics_after[ok_gets] - metrics_before.get(ok_gets, 0) == 4
    assert metrics_after[("tierstore_hot_budget_bytes", ())] > 0
