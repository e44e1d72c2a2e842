"""Epoch hints against a real gateway over a moto capacity store: readers on
threads read a hinted epoch that was made hot ahead of them; the lookahead
follows a reader's position; epochs queue, finish, end and are abandoned;
the client helper registers epochs; bad requests are 400s."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import boto3
import httpx
import pytest
from typer.testing import CliRunner

from gateway.cli.app import app as cli_app
from gateway.client.admin import Unreachable
from gateway.client.hints import HintedSampler, Hints, shard_epoch
from gateway.client.order import shuffled
from tests.conftest import make_client, running_gateway
from tests.faults import FaultProxy, Rates
from tests.integration.helpers import wait_until
from tests.servers import ADMIN_TOKEN, Gateway, free_port

CAPACITY_KEYS = ["--capacity-access-key", "testing", "--capacity-secret-key", "testing"]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> Iterator[Gateway]:
    bucket = f"epoch-cap-{os.getpid()}"
    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    args = ["--capacity", f"s3://{bucket}/tier", "--capacity-endpoint", moto_endpoint, *CAPACITY_KEYS]
    with running_gateway(tmp_path_factory.mktemp("epochs") / "data", *args) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def hints(gw: Gateway) -> Iterator[Hints]:
    with Hints(gw.admin_url, ADMIN_TOKEN, strict=True) as h:
        yield h


def where(gw: Gateway, bucket: str, key: str) -> str:
    return gw.admin("GET", f"/objects/{bucket}/{key}").json()["where"]


def gets(gw: Gateway) -> int:
    return gw.admin("GET", "/tiers").json()["capacity_requests"]["gets"]


def test_four_readers_read_a_hinted_epoch_that_was_made_hot_ahead_of_them(gw: Gateway, hints: Hints) -> None:
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="epall")
    data = {f"img/{i:04d}.jpg": os.urandom(16 * 1024) for i in range(400)}
    for key, body in data.items():
        s3.put_object(Bucket="epall", Key=key, Body=body)
    gw.flush()
    gw.evict()
    epoch_id = hints.shuffled_epoch("epall", "img/", seed=3, readers=4)
    assert epoch_id is not None
    order = shuffled(data, 3)  # the order the gateway was told, reproduced here
    wait_until(lambda: hints.status(epoch_id)["prefetched_objects"] >= 400, "the epoch prefetched")
    fetched = gets(gw)
    assert fetched <= 20, "packed neighbours come along: far fewer GETs than objects"

    failures: list[str] = []

    def reader(r: int) -> None:
        client = make_client(gw.endpoint)
        for key in order[r::4]:
            if client.get_object(Bucket="epall", Key=key)["Body"].read() != data[key]:
                failures.append(key)

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    status = hints.status(epoch_id)
    assert status["state"] == "finished" and status["consumed"] == 400
    assert (status["hits"], status["misses"]) == (400, 0)
    assert gets(gw) == fetched, "every read was served hot"


def test_the_lookahead_follows_a_readers_position_on_a_mounted_bucket(
    gw: Gateway, hints: Hints, moto_endpoint: str
) -> None:
    src = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                       aws_secret_access_key="testing", region_name="us-east-1")
    src.create_bucket(Bucket="epoch-source")
    keys = [f"k{i:02d}" for i in range(40)]
    for key in keys:
        src.put_object(Bucket="epoch-source", Key=key, Body=key.encode() * 100)
    gw.admin("POST", "/mounts", json={"name": "epmount", "source": "s3://epoch-source", "endpoint": moto_endpoint,
                                       "access_key": "testing", "secret_key": "testing"})
    order = list(reversed(keys))
    epoch_id = hints.epoch("epmount", order, readers=1, lookahead_objects=4)
    assert epoch_id is not None
    wait_until(lambda: all(where(gw, "epmount", k) == "hot" for k in order[:4]), "the first window is hot")
    assert where(gw, "epmount", order[8]) != "hot", "nothing beyond the window"
    s3 = make_client(gw.endpoint)
    for key in order[:6]:
        s3.get_object(Bucket="epmount", Key=key)["Body"].read()
    wait_until(lambda: all(where(gw, "epmount", k) == "hot" for k in order[6:10]), "the window moved on")
    assert where(gw, "epmount", order[16]) != "hot"
    status = hints.status(epoch_id)
    assert status["positions"] == [5] and status["hits"] >= 4
    hints.end(epoch_id)
    assert hints.status(epoch_id)["state"] == "ended"


def test_sixteen_readers_of_one_queue_find_a_mount_20_ms_away_mostly_hot(
    gw: Gateway, hints: Hints, moto_endpoint: str
) -> None:
    """A mount whose source answers 20 ms late, an epoch of 300 objects for
    16 readers, and 16 threads that each take the next key of one shared
    queue (as DataLoader workers do) with a 20 ms step per object. The
    prefetch must move on with them, ahead of them, not trail behind its
    first window: a good share of reads are hits (100-150 of 300 on a
    2-core machine running moto, the proxy and the readers beside the
    gateway; none before the fix), and it brings far more than its first
    window of 64 objects."""
    src = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                       aws_secret_access_key="testing", region_name="us-east-1")
    src.create_bucket(Bucket="epoch-far-source")
    keys = [f"img/{i:04d}.jpg" for i in range(300)]
    for key in keys:
        src.put_object(Bucket="epoch-far-source", Key=key, Body=key.encode() * 5000)
    with FaultProxy(moto_endpoint, Rates(latency=1.0, delay=0.020)) as far:
        gw.admin("POST", "/mounts", json={"name": "epfar", "source": "s3://epoch-far-source",
                                           "endpoint": far.endpoint, "access_key": "testing", "secret_key": "testing"})
        order = shuffled(keys, 11)
        epoch_id = hints.epoch("epfar", order, readers=16)
        assert epoch_id is not None
        queue = list(reversed(order))
        lock = threading.Lock()
        failures: list[str] = []

        def reader() -> None:
            client = make_client(gw.endpoint)
            while True:
                with lock:
                    if not queue:
                        return
                    key = queue.pop()
                if client.get_object(Bucket="epfar", Key=key)["Body"].read() != key.encode() * 5000:
                    failures.append(key)
                time.sleep(0.020)  # the training step

        threads = [threading.Thread(target=reader) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        status = hints.status(epoch_id)
    assert not failures
    assert status["state"] == "finished" and status["consumed"] == 300
    assert status["hits"] >= 0.25 * 300, status  # before the fix: none
    assert status["prefetched_objects"] >= 0.5 * 300, status
    # Every read is a hit, a late read (joined the prefetch's fetch) or a miss,
    # and the status says how far ahead the prefetch is.
    assert status["hits"] + status["late"] + status["misses"] == 300, status
    assert status["ahead_objects"] >= 0 and status["in_flight_objects"] >= 0, status


def test_epochs_queue_behind_each_other_and_an_idle_one_is_abandoned(gw: Gateway, hints: Hints) -> None:
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="epq")
    for i in range(3):
        s3.put_object(Bucket="epq", Key=f"x{i}", Body=b"x")
    first = hints.epoch("epq", ["x0", "x1", "x2"], idle_timeout=1)
    second = hints.epoch("epq", ["x2", "x1", "x0"])
    assert first is not None and second is not None
    assert hints.status(second)["state"] == "queued"
    wait_until(lambda: hints.status(first)["state"] == "abandoned", "the idle epoch abandoned", timeout=10)
    assert hints.status(second)["state"] == "active"
    for key in ("x2", "x1", "x0", "x1"):  # the last read is past the epoch's end: ignored
        s3.get_object(Bucket="epq", Key=key)
    assert hints.status(second)["state"] == "finished"
    listed = gw.admin("GET", "/epochs").json()["epochs"]
    assert {second, first} <= {e["id"] for e in listed}


def test_bad_epoch_requests(gw: Gateway) -> None:
    make_client(gw.endpoint).create_bucket(Bucket="epbad")

    def error(method: str, path: str, body: dict | None = None) -> tuple[int, str]:
        with pytest.raises(httpx.HTTPStatusError) as failed:
            gw.admin(method, path, json=body)
        return failed.value.response.status_code, failed.value.response.json()["error"]["code"]

    assert error("POST", "/epochs", {"bucket": "epbad"}) == (400, "InvalidRequest")
    assert error("POST", "/epochs", {"bucket": "epbad", "keys": ["a"], "prefix": ""}) == (400, "InvalidRequest")
    assert error("POST", "/epochs", {"bucket": "epbad", "keys": ["a"], "seed": 1}) == (400, "InvalidRequest")
    assert error("POST", "/epochs", {"bucket": "epbad", "keys": []}) == (400, "InvalidRequest")
    assert error("POST", "/epochs", {"bucket": "epbad", "keys": ["a"], "readers": 0}) == (400, "InvalidRequest")
    assert error("POST", "/epochs", {"bucket": "epbad", "keys": ["s-{9..1}"], "patterns": True}) == (
        400, "InvalidRequest")
    assert error("POST", "/epochs", {"bucket": "epbad", "keys": ["{0..99999999999}"], "patterns": True}) == (
        400, "InvalidRequest")
    assert error("POST", "/epochs", {"bucket": "epbad", "prefix": "", "patterns": True}) == (400, "InvalidRequest")
    assert error("POST", "/epochs", {"bucket": "nope", "keys": ["a"]}) == (404, "NoSuchBucket")
    assert error("GET", "/epochs/e000") == (404, "NoSuchEpoch")
    assert error("DELETE", "/epochs/e000") == (404, "NoSuchEpoch")


def test_the_client_helpers_register_what_the_loop_reads(gw: Gateway, hints: Hints, caplog) -> None:  # type: ignore[no-untyped-def]
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="ephelp")
    keys = [f"shards/train-{i:03d}.tar" for i in range(12)]
    for key in keys:
        s3.put_object(Bucket="ephelp", Key=key, Body=b"tar")

    sampler = HintedSampler([3, 1, 2, 0], keys, bucket="ephelp", hints=hints)
    assert list(sampler) == [3, 1, 2, 0] and len(sampler) == 4
    first = sampler.epoch_id
    assert first is not None and hints.status(first)["objects"] == 4
    assert list(sampler) == [3, 1, 2, 0]  # the next epoch: the last one is ended, a new one registered
    assert hints.status(first)["state"] == "ended" and sampler.epoch_id != first

    order = shard_epoch("ephelp", "shards/train-{000..011}.tar", seed=9, hints=hints)
    assert order == shuffled(keys, 9)
    newest = gw.admin("GET", "/epochs").json()["epochs"]
    assert any(e["objects"] == 12 and e["state"] in ("active", "queued") for e in newest)

    away = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING, logger="tierstore.hints"):
        assert Hints(away, "t").epoch("ephelp", keys) is None, "no gateway: the loop reads on without hints"
    assert "hints unavailable" in caplog.text
    with pytest.raises(Unreachable):
        Hints(away, "t", strict=True).epoch("ephelp", keys)


def test_the_cli_starts_shows_lists_and_ends_epochs(gw: Gateway, tmp_path: Path) -> None:
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="epcli")
    keys = [f"data/{i:02d}" for i in range(6)]
    for key in keys:
        s3.put_object(Bucket="epcli", Key=key, Body=b"d")
    env = {"TIERSTORE_ADMIN_URL": gw.admin_url, "TIERSTORE_ADMIN_TOKEN": ADMIN_TOKEN}

    def tierstore(*args: str) -> str:
        result = CliRunner().invoke(cli_app, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.stdout + result.stderr
        return result.stdout

    started = json.loads(tierstore("epochs", "start", "s3://epcli/data/", "--seed", "5", "--readers", "2", "--json"))
    assert (started["objects"], started["readers"], started["state"]) == (6, 2, "active")
    s3.get_object(Bucket="epcli", Key=shuffled(keys, 5)[1])  # position 1: reader 1
    shown = tierstore("epochs", "show", started["id"])
    assert "epoch " + started["id"] in shown and "1/6" in shown
    assert started["id"] in tierstore("epochs", "list")
    order = tmp_path / "order.txt"
    order.write_text("data/05\ndata/04\n")
    queued = json.loads(tierstore("epochs", "start", "s3://epcli", "--keys-from", str(order), "--json"))
    assert queued["state"] == "queued"
    assert json.loads(tierstore("epochs", "end", started["id"], "--json"))["state"] == "ended"
    assert json.loads(tierstore("epochs", "show", queued["id"], "--json"))["state"] == "active"


# -- key lists are literal; patterns and URLs when asked; missing is an answer --

# Keys as real trainers name them: DLIO's "s3://<bucket>/<key>" as the key
# itself, braces and commas, a ".." segment. Beside them, the keys the
# pattern and URL forms name, so that a misread fetches something else.
ODD_KEYS = ["s3://{bucket}/train/a.bin", "a{{1,2}}.bin", "x/../y"]
FORM_KEYS = ["train/a.bin", "a1.bin", "a2.bin"]


def _source_keys(proxy: FaultProxy, source: str, method: str = "GET") -> list[str]:
    """The keys of ``source`` the proxy saw asked for with ``method``, in order."""
    out = []
    for verb, target, _ in proxy.requests:
        path = urlsplit(target).path
        if verb == method and path.startswith(f"/{source}/"):
            out.append(unquote(path[len(source) + 2:]))
    return out


def _odd_mount(gw: Gateway, moto_endpoint: str, name: str, proxy: FaultProxy) -> list[str]:
    """A mount ``name`` over a source holding the odd keys and the form
    keys, reached through ``proxy``; the odd keys."""
    src = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                       aws_secret_access_key="testing", region_name="us-east-1")
    source = f"{name}-src"
    src.create_bucket(Bucket=source)
    odd = [k.format(bucket=name) for k in ODD_KEYS]
    for key in odd + FORM_KEYS:
        src.put_object(Bucket=source, Key=key, Body=key.encode() * 10)
    assert sorted(o["Key"] for o in src.list_objects_v2(Bucket=source)["Contents"]) == sorted(odd + FORM_KEYS)
    gw.admin("POST", "/mounts", json={"name": name, "source": f"s3://{source}", "endpoint": proxy.endpoint,
                                       "access_key": "testing", "secret_key": "testing",
                                       "freshness": "immutable"})
    return odd


def test_an_epoch_names_keys_literally_and_patterns_and_urls_only_when_asked(
    gw: Gateway, hints: Hints, moto_endpoint: str
) -> None:
    with FaultProxy(moto_endpoint) as proxy:
        odd = _odd_mount(gw, moto_endpoint, "eplit", proxy)
        assert odd[0] == "s3://eplit/train/a.bin", "the DLIO form: a URL of this very bucket, as the key"
        epoch_id = hints.epoch("eplit", odd)
        assert epoch_id is not None
        wait_until(lambda: hints.status(epoch_id)["prefetched_objects"] == 3, "the literal keys prefetched")
        status = hints.status(epoch_id)
        assert (status["objects"], status["missing"], status["failed"]) == (3, 0, 0)
        assert sorted(_source_keys(proxy, "eplit-src")) == sorted(odd), "exactly the keys named"
        s3 = make_client(gw.endpoint)
        for key in odd:
            assert s3.get_object(Bucket="eplit", Key=key)["Body"].read() == key.encode() * 10
        assert hints.status(epoch_id)["hits"] == 3, "each read found its object hot"
        assert hints.status(epoch_id)["state"] == "finished"

        before = len(proxy.requests)
        forms = hints.epoch("eplit", odd[:2], patterns=True, urls=True)
        assert forms is not None
        wait_until(lambda: hints.status(forms)["prefetched_objects"] == 3, "the keys the forms name")
        assert hints.status(forms)["objects"] == 3 and hints.status(forms)["missing"] == 0
        got = [unquote(urlsplit(t).path)[len("/eplit-src/"):] for m, t, _ in proxy.requests[before:] if m == "GET"]
        assert sorted(got) == sorted(FORM_KEYS), "train/a.bin, a1.bin and a2.bin: not the literal keys"
        hints.end(forms)

        with pytest.raises(httpx.HTTPStatusError) as refused:
            gw.admin("POST", "/epochs", json={"bucket": "eplit", "keys": ["s3://other/k"], "urls": True})
        assert refused.value.response.status_code == 400


def test_an_epoch_reports_missing_keys_and_asks_the_source_once(
    gw: Gateway, hints: Hints, moto_endpoint: str
) -> None:
    with FaultProxy(moto_endpoint) as proxy:
        _odd_mount(gw, moto_endpoint, "epgone", proxy)
        absent = [f"gone/{i:02d}.bin" for i in range(12)]
        order = ["train/a.bin", *absent[:6], "a1.bin", *absent[6:]]
        epoch_id = hints.epoch("epgone", order, lookahead_objects=64)
        assert epoch_id is not None
        wait_until(lambda: hints.status(epoch_id)["missing"] == 12, "the absent keys reported missing")
        time.sleep(1.5)  # many prefetch rounds: none asks again
        status = hints.status(epoch_id)
        assert status["missing_keys"] == absent[:10], "the first ten, in read order"
        assert (status["missing"], status["missing_objects"], status["failed"]) == (12, 12, 0)
        assert status["prefetched_objects"] == 2
        asked = _source_keys(proxy, "epgone-src") + _source_keys(proxy, "epgone-src", "HEAD")
        assert all(asked.count(key) == 1 for key in absent), f"one request per missing key: {asked}"
        s3 = make_client(gw.endpoint)
        with pytest.raises(s3.exceptions.NoSuchKey):
            s3.get_object(Bucket="epgone", Key=absent[0])  # a reader still gets its 404
        hints.end(epoch_id)


def test_an_epoch_of_a_thousand_absent_keys_asks_the_source_at_most_once_each(
    gw: Gateway, hints: Hints, moto_endpoint: str
) -> None:
    """1,000 keys that do not exist on a mounted bucket (DLIO's hints with
    the wrong names): the epoch reports all 1,000 missing, the source sees
    at most one request per key over the epoch's life, and none after the
    epoch has reported them (counted at a proxy in front of the source)."""
    with FaultProxy(moto_endpoint) as proxy:
        _odd_mount(gw, moto_endpoint, "epthousand", proxy)
        absent = [f"nothing/{i:04d}.npz" for i in range(1000)]
        epoch_id = hints.epoch("epthousand", absent)
        assert epoch_id is not None
        wait_until(lambda: hints.status(epoch_id)["missing"] == 1000, "all 1,000 reported missing", timeout=120)
        reported = len(_source_keys(proxy, "epthousand-src") + _source_keys(proxy, "epthousand-src", "HEAD"))
        time.sleep(2.0)  # many prefetch rounds: none asks again
        asked = _source_keys(proxy, "epthousand-src") + _source_keys(proxy, "epthousand-src", "HEAD")
        assert len(asked) <= 1000 and len(set(asked)) == len(asked), f"{len(asked)} requests, {len(set(asked))} keys"
        assert len(asked) == reported, "no request after the epoch reported them missing"
        assert hints.status(epoch_id)["missing"] == 1000
        hints.end(epoch_id)


def test_a_failing_prefetch_is_retried_a_bounded_number_of_times(
    gw: Gateway, hints: Hints, moto_endpoint: str
) -> None:
    """The source fails every GET of one key (503): the prefetch tries it
    again after a back-off, three times in all, then counts it failed and
    leaves it (each try is the store client's own retries)."""
    def bad(method: str, target: str) -> bool:
        return method == "GET" and urlsplit(target).path.endswith("/flaky.bin")

    with FaultProxy(moto_endpoint, Rates(unavailable=1.0, only=bad)) as proxy:
        src = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                           aws_secret_access_key="testing", region_name="us-east-1")
        src.create_bucket(Bucket="epflaky-src")
        for key in ("ok.bin", "flaky.bin"):
            src.put_object(Bucket="epflaky-src", Key=key, Body=b"x" * 100)
        gw.admin("POST", "/mounts", json={"name": "epflaky", "source": "s3://epflaky-src",
                                           "endpoint": proxy.endpoint, "access_key": "testing",
                                           "secret_key": "testing", "serve_stale": False})
        epoch_id = hints.epoch("epflaky", ["flaky.bin", "ok.bin"])
        assert epoch_id is not None
        wait_until(lambda: hints.status(epoch_id)["failed"] == 1, "the failing key given up", timeout=60)
        tries = _source_keys(proxy, "epflaky-src").count("flaky.bin")
        time.sleep(1.5)
        status = hints.status(epoch_id)
        assert (status["failed_keys"], status["missing"], status["prefetched_objects"]) == (["flaky.bin"], 0, 1)
        assert _source_keys(proxy, "epflaky-src").count("flaky.bin") == tries, "not asked again"
        assert tries <= 3 * 6, "three prefetch attempts, each the store client's retries"
        hints.end(epoch_id)


def _unmatched_reads(gw: Gateway) -> float:
    for line in gw.admin("GET", "/metrics").text.splitlines():
        if line.startswith("tierstore_epoch_unmatched_reads_total "):
            return float(line.split()[1])
    raise AssertionError("no tierstore_epoch_unmatched_reads_total in /metrics")


def test_an_epoch_whose_keys_are_not_the_keys_read_warns(gw: Gateway, hints: Hints, moto_endpoint: str) -> None:
    """Issue 43: DLIO reads ``s3://<bucket>/train/...`` as the literal key;
    an epoch that names ``train/...`` matches none of its reads. The epoch
    says so, /metrics counts the reads, and the CLI prints the warning."""
    src = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                       aws_secret_access_key="testing", region_name="us-east-1")
    src.create_bucket(Bucket="epdlio-src")
    names = [f"train/img_{i:04d}.npz" for i in range(120)]
    for name in names:
        src.put_object(Bucket="epdlio-src", Key=f"s3://epdlio/{name}", Body=b"n" * 64)
    gw.admin("POST", "/mounts", json={"name": "epdlio", "source": "s3://epdlio-src", "endpoint": moto_endpoint,
                                       "access_key": "testing", "secret_key": "testing"})
    before = _unmatched_reads(gw)
    epoch_id = hints.epoch("epdlio", names)  # without the s3://epdlio/ the keys hold
    assert epoch_id is not None
    assert hints.status(epoch_id)["warning"] is None, "nothing read yet"
    s3 = make_client(gw.endpoint)
    for name in names:
        assert s3.get_object(Bucket="epdlio", Key=f"s3://epdlio/{name}")["Body"].read() == b"n" * 64

    status = gw.admin("GET", f"/epochs/{epoch_id}").json()
    assert (status["state"], status["consumed"], status["hits"]) == ("active", 0, 0)
    assert (status["bucket_reads"], status["unmatched_reads"]) == (120, 120)
    assert status["warning"].startswith("0 of the 120 reads of bucket 'epdlio' since this epoch started")
    assert "'s3://epdlio/train/img_0000.npz' is not one of them" in status["warning"]
    assert "keys are taken literally; see docs/prefetch.md" in status["warning"]
    assert _unmatched_reads(gw) - before == 120
    # The named keys do not exist: once the prefetch has asked, the epoch says that too.
    wait_until(lambda: "entries are missing at the source" in (hints.status(epoch_id)["warning"] or ""),
               "the named keys reported missing")
    assert "120 of 120 entries are missing at the source" in hints.status(epoch_id)["warning"]

    result = CliRunner().invoke(cli_app, ["epochs", "show", epoch_id, "--admin-url", gw.admin_url,
                                          "--token", ADMIN_TOKEN], catch_exceptions=False)
    assert result.exit_code == 0, result.stdout + result.stderr
    shown = " ".join(result.stdout.split())  # the console wraps long lines
    assert f"warning: epoch {epoch_id}: 0 of the 120 reads of bucket 'epdlio'" in shown
    assert "keys are taken literally; see docs/prefetch.md" in shown
    assert "120 of 120 reads of the bucket were of keys not in the order" in shown
    listed = CliRunner().invoke(cli_app, ["epochs", "list", "--admin-url", gw.admin_url, "--token", ADMIN_TOKEN],
                                catch_exceptions=False)
    assert f"warning: epoch {epoch_id}: 0 of the 120 reads" in " ".join(listed.stdout.split())
    hints.end(epoch_id)
