"""Warm jobs against a real gateway over a moto capacity store: a prefix, a
key list with shard patterns, a manifest object, a mounted bucket; packed
objects come back in a few ranged GETs; a set larger than the hot tier is
warmed as far as it fits; bad requests are 400s; a job can be cancelled."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import boto3
import httpx
import pytest
from typer.testing import CliRunner

from gateway.cli.app import app as cli_app
from tests.conftest import make_client, running_gateway
from tests.faults import FaultProxy
from tests.servers import ADMIN_TOKEN, Gateway
from tiering.prefetch.warm import BATCH

MiB = 1024 * 1024
CAPACITY_KEYS = ["--capacity-access-key", "testing", "--capacity-secret-key", "testing"]


def direct(endpoint: str):  # type: ignore[no-untyped-def]
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


def capacity(moto_endpoint: str, bucket: str) -> list[str]:
    direct(moto_endpoint).create_bucket(Bucket=bucket)
    return ["--capacity", f"s3://{bucket}/tier", "--capacity-endpoint", moto_endpoint, *CAPACITY_KEYS,
            "--no-compression"]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("warm")
    with running_gateway(root / "data", *capacity(moto_endpoint, f"warm-cap-{os.getpid()}")) as gateway:
        yield gateway


def gets(gw: Gateway) -> int:
    return gw.admin("GET", "/tiers").json()["capacity_requests"]["gets"]


def where(gw: Gateway, bucket: str, key: str) -> str:
    return gw.admin("GET", f"/objects/{bucket}/{key}").json()["where"]


def cli(gw: Gateway, *args: str) -> dict:
    env = {"TIERSTORE_ADMIN_URL": gw.admin_url, "TIERSTORE_ADMIN_TOKEN": ADMIN_TOKEN}
    result = CliRunner().invoke(cli_app, [*args, "--json"], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def cold_set(gw: Gateway, bucket: str, keys: list[str], size: int) -> dict[str, bytes]:
    """Objects written, flushed to the capacity store and evicted. What
    earlier tests left staged is flushed first, so that these objects are
    not packed between theirs (a hole in a run costs the warm a GET)."""
    gw.flush()
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket=bucket)
    data = {key: os.urandom(size) for key in keys}
    for key, body in data.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    gw.flush()
    gw.evict()
    assert {where(gw, bucket, k) for k in keys[:3]} == {"capacity"}
    return data


def segments_written(gw: Gateway) -> int:
    return gw.admin("GET", "/tiers").json()["segments_written"]


def test_a_prefix_of_packed_objects_is_warmed_in_a_few_gets_then_read_without_any(gw: Gateway) -> None:
    keys = [f"train/{i:04d}.jpg" for i in range(300)]
    written = segments_written(gw)
    data = cold_set(gw, "wprefix", keys + ["val/0.jpg"], 16 * 1024)
    # Usually one segment; a timed flush during the writes makes two.
    segments = segments_written(gw) - written
    before = gets(gw)
    job = cli(gw, "warm", "s3://wprefix/train/")
    result = job["result"]
    assert job["state"] == "succeeded" and job["progress"]["items_done"] == 300
    assert (result["objects"], result["hot_objects"], result["left_out_objects"]) == (300, 300, 0)
    # One ranged GET per run: a run is a segment's part of one batch of
    # BATCH objects, so the 300 objects make at most segments + batches - 1.
    batches = -(-len(keys) // BATCH)
    assert result["requests"] == gets(gw) - before <= segments + batches - 1, "one ranged GET per segment run"
    assert where(gw, "wprefix", "val/0.jpg") == "capacity", "outside the prefix: not warmed"

    s3 = make_client(gw.endpoint)
    before = gets(gw)
    for key in keys:
        assert s3.get_object(Bucket="wprefix", Key=key)["Body"].read() == data[key]
    assert gets(gw) == before, "every read was a hit"
    again = gw.run_job("warm", bucket="wprefix", prefix="train/")
    assert again["requests"] == 0 and again["fetched_bytes"] == 0 and again["hot_objects"] == 300


def test_keys_with_shard_patterns_and_a_manifest_object(gw: Gateway, tmp_path: Path) -> None:
    shards = [f"shards/s-{i:03d}.tar" for i in range(10)]
    cold_set(gw, "wkeys", shards, 64 * 1024)
    s3 = make_client(gw.endpoint)
    s3.put_object(Bucket="wkeys", Key="lists/train.txt",
                  Body=b"shards/s-{000..003}.tar\n# held out\n\ns3://wkeys/shards/s-009.tar\nshards/missing.tar\n")
    literal = gw.run_job("warm", bucket="wkeys", manifest="lists/train.txt")
    assert (literal["objects"], literal["missing"]) == (0, 3), "each line is a key, as it is"
    assert literal["missing_keys"] == ["shards/s-{000..003}.tar", "s3://wkeys/shards/s-009.tar", "shards/missing.tar"]
    assert not {k for k in shards if where(gw, "wkeys", k) == "hot"}
    result = gw.run_job("warm", bucket="wkeys", manifest="lists/train.txt", patterns=True, urls=True)
    assert (result["objects"], result["missing"], result["missing_keys"]) == (5, 1, ["shards/missing.tar"])
    hot = {k for k in shards if where(gw, "wkeys", k) == "hot"}
    assert hot == {"shards/s-000.tar", "shards/s-001.tar", "shards/s-002.tar", "shards/s-003.tar",
                   "shards/s-009.tar"}

    listing = tmp_path / "keys.txt"
    listing.write_text("shards/s-{004,005}.tar\nshards/s-006.tar\n")
    job = cli(gw, "warm", "s3://wkeys", "--keys-from", str(listing), "--patterns")
    assert job["result"]["objects"] == 3
    assert where(gw, "wkeys", "shards/s-005.tar") == "hot" and where(gw, "wkeys", "shards/s-007.tar") == "capacity"


def test_bad_warm_requests_are_400s_and_an_unknown_bucket_404(gw: Gateway) -> None:
    make_client(gw.endpoint).create_bucket(Bucket="wbad")

    def error(body: dict) -> tuple[int, str]:
        with pytest.raises(httpx.HTTPStatusError) as failed:
            gw.admin("POST", "/jobs/warm", json=body)
        return failed.value.response.status_code, failed.value.response.json()["error"]["code"]

    assert error({"bucket": "wbad", "prefix": "a", "keys": ["b"]}) == (400, "InvalidRequest")
    assert error({"bucket": "wbad"}) == (400, "InvalidRequest")
    assert error({"bucket": "wbad", "manifest": "nothing-here"}) == (400, "InvalidRequest")
    assert error({"bucket": "wbad", "keys": ["s-{5..1}.tar"], "patterns": True}) == (400, "InvalidRequest")
    assert error({"bucket": "wbad", "keys": ["s-{0..99999999999}.tar"], "patterns": True}) == (400, "InvalidRequest")
    assert error({"bucket": "wbad", "keys": ["s3://other/k"], "urls": True}) == (400, "InvalidRequest")
    assert error({"bucket": "wbad", "prefix": "", "patterns": True}) == (400, "InvalidRequest")
    assert error({"bucket": "wbad", "prefix": "", "concurrency": 0}) == (400, "InvalidRequest")
    assert error({"bucket": "no-such-bucket", "prefix": ""}) == (404, "NoSuchBucket")


def test_a_slow_warm_job_can_be_cancelled(gw: Gateway) -> None:
    cold_set(gw, "wcancel", [f"k{i}" for i in range(8)], 1 * MiB)
    job = gw.admin("POST", "/jobs/warm", json={"bucket": "wcancel", "prefix": "", "bandwidth": 256 * 1024,
                                               "concurrency": 1}).json()
    assert job["state"] == "running"
    cancelled = gw.admin("POST", f"/jobs/{job['id']}/cancel").json()
    assert cancelled["state"] == "cancelled"


def test_a_set_larger_than_the_hot_tier_is_warmed_as_far_as_it_fits(tmp_path: Path, moto_endpoint: str) -> None:
    args = [*capacity(moto_endpoint, f"warm-small-{os.getpid()}"), "--hot-size", "8M"]
    with running_gateway(tmp_path / "data", *args) as small:
        cold_set(small, "wbig", [f"obj/{i:02d}" for i in range(20)], 1 * MiB)
        result = small.run_job("warm", bucket="wbig", prefix="obj/")
        assert result["objects"] == 20 and 0 < result["hot_objects"] < 20
        assert result["hot_objects"] + result["left_out_objects"] == 20
        assert result["hot_bytes"] <= result["room_bytes"] <= 8 * MiB
        assert "larger than the hot tier" in result["note"]
        hot = [i for i in range(20) if where(small, "wbig", f"obj/{i:02d}") == "hot"]
        assert hot == list(range(result["hot_objects"])), "the start of the set is warmed, and stays"


def test_a_mounted_prefix_is_warmed_from_the_source(gw: Gateway, moto_endpoint: str) -> None:
    src = direct(moto_endpoint)
    src.create_bucket(Bucket="wsource")
    files = {f"img/{i:02d}.jpg": os.urandom(20_000) for i in range(12)}
    files["img/large.bin"] = os.urandom(20 * MiB)  # three 8 MiB pieces
    for key, body in files.items():
        src.put_object(Bucket="wsource", Key=f"data/{key}", Body=body)
    mount = {"name": "wmount", "source": "s3://wsource/data", "endpoint": moto_endpoint,
             "access_key": "testing", "secret_key": "testing", "freshness": "immutable"}
    assert gw.admin("POST", "/mounts", json=mount).status_code == 201

    def source_gets() -> int:
        return gw.admin("GET", "/mounts/wmount").json()["source_requests"]["gets"]

    result = gw.run_job("warm", bucket="wmount", prefix="img/")
    assert (result["objects"], result["hot_objects"]) == (13, 13)
    assert result["requests"] == 12 + 3, "a small object is one ranged GET; the large one a GET per piece"
    before = source_gets()
    s3 = make_client(gw.endpoint)
    for key, body in files.items():
        assert s3.get_object(Bucket="wmount", Key=key)["Body"].read() == body
    assert source_gets() == before, "everything was hot"


def test_a_warm_job_names_keys_literally_and_patterns_and_urls_only_when_asked(
    gw: Gateway, moto_endpoint: str, tmp_path: Path
) -> None:
    """A mount whose source holds keys as DLIO and others name them
    (s3://<bucket>/..., braces and commas, a ".." segment) and the keys the
    pattern and URL forms would make of them: a literal list warms exactly
    the former, the forms when asked the latter; missing keys are asked for
    once and reported."""
    src = direct(moto_endpoint)
    src.create_bucket(Bucket="wlit-src")
    odd = ["s3://wlit/train/a.bin", "a{1,2}.bin", "x/../y"]
    forms = ["train/a.bin", "a1.bin", "a2.bin"]
    for key in odd + forms:
        src.put_object(Bucket="wlit-src", Key=key, Body=key.encode() * 10)

    def asked(proxy: FaultProxy, since: int = 0) -> list[str]:
        return [unquote(urlsplit(t).path)[len("/wlit-src/"):] for m, t, _ in proxy.requests[since:]
                if m in ("GET", "HEAD") and urlsplit(t).path.startswith("/wlit-src/")]

    with FaultProxy(moto_endpoint) as proxy:
        gw.admin("POST", "/mounts", json={"name": "wlit", "source": "s3://wlit-src", "endpoint": proxy.endpoint,
                                           "access_key": "testing", "secret_key": "testing",
                                           "freshness": "immutable"})
        result = gw.run_job("warm", bucket="wlit", keys=[*odd, "gone/1", "gone/2"])
        assert (result["objects"], result["hot_objects"], result["missing"]) == (3, 3, 2)
        assert sorted(result["missing_keys"]) == ["gone/1", "gone/2"], "(asked concurrently: in any order)"
        assert sorted(asked(proxy)) == sorted([*odd, "gone/1", "gone/2"]), "each key asked once, as named"

        before = len(proxy.requests)
        result = gw.run_job("warm", bucket="wlit", keys=odd[:2], patterns=True, urls=True)
        assert (result["objects"], result["hot_objects"], result["missing"]) == (3, 3, 0)
        assert sorted(asked(proxy, before)) == sorted(forms)

        listing = tmp_path / "odd.txt"
        listing.write_text("\n".join(odd) + "\n")
        before = len(proxy.requests)
        job = cli(gw, "warm", "s3://wlit", "--keys-from", str(listing))
        assert (job["result"]["objects"], job["result"]["hot_objects"]) == (3, 3)
        assert job["params"]["patterns"] is False and job["params"]["urls"] is False
        assert asked(proxy, before) == [], "hot already: the source is not asked"
