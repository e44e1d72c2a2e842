"""Four gateways over one store hold a mounted data set as one cache.

Each node's hot tier is 35 % of the data set. Every epoch the keys are
reshuffled and split four ways, two readers per node, as a distributed
sampler does: each object is read by a different node from one epoch to the
next. With one owner per object (rendezvous hashing over the nodes), the
owner reads the source once and keeps the bytes; the other nodes ask it and
keep no copy, so the four hot tiers add up. Requests are counted at the
source, by a proxy in front of it, never by the gateways' own counters.

Then one node is killed (SIGKILL): the readers on the others get every
byte right and no error; the dead node's share is read from the source.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import boto3
import httpx
import pytest

from gateway.client.hints import Hints
from tests.conftest import make_client
from tests.integration.helpers import counting_proxy, peered_nodes
from tests.integration.s3raw import Sender
from tests.servers import ADMIN_TOKEN, Gateway
from tiering.model.archive import members

OBJECTS = 200
SIZE = 16 * 1024
NODES = ("c1", "c2", "c3", "c4")
HOT = int(OBJECTS * SIZE * 0.35)  # each node's hot tier: 35 % of the data set


@pytest.fixture(scope="module")
def proxy(moto_endpoint: str) -> Iterator[object]:
    """A request-counting proxy in front of moto."""
    with counting_proxy(moto_endpoint) as counting:
        yield counting


@pytest.fixture(scope="module")
def dataset(moto_endpoint: str) -> dict[str, bytes]:
    source = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    source.create_bucket(Bucket="cluster-data")
    files = {f"train/{i:04d}.bin": os.urandom(SIZE) for i in range(OBJECTS)}
    for key, data in files.items():
        source.put_object(Bucket="cluster-data", Key=key, Body=data)
    return files


@pytest.fixture(scope="module")
def nodes(moto_endpoint: str, proxy: object, dataset: dict[str, bytes],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Gateway]]:
    with peered_nodes(tmp_path_factory.mktemp("cluster-cache"), NODES, moto_endpoint, moto_endpoint,
                      ["--hot-size", str(HOT)]) as started:
        for gw in started:
            answer = httpx.post(gw.admin_url + "/mounts", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                                json={"name": "data", "source": "s3://cluster-data", "endpoint": proxy.endpoint,
                                      "access_key": "testing", "secret_key": "testing"}, timeout=60)
            assert answer.status_code == 201, answer.text
        yield started


def epoch(gws: list[Gateway], files: dict[str, bytes], seed: int, bucket: str = "data") -> None:
    """Every object of ``bucket`` read once, by a node other than last
    epoch's as often as not: the keys shuffled by ``seed`` and split between
    the nodes, two readers each. Every byte is checked."""
    keys = sorted(files)
    random.Random(seed).shuffle(keys)
    share = -(-len(keys) // len(gws))
    jobs = []
    for n, gw in enumerate(gws):
        mine = keys[n * share:(n + 1) * share]
        jobs += [(gw, mine[0::2]), (gw, mine[1::2])]

    def read(job: tuple[Gateway, list[str]]) -> None:
        gw, wanted = job
        client = make_client(gw.endpoint)
        for key in wanted:
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            assert hashlib.md5(body).digest() == hashlib.md5(files[key]).digest(), key

    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(read, jobs))


def source_gets(proxy: object) -> int:
    return proxy.operations["GetObject"] + proxy.operations["HeadObject"]  # type: ignore[attr-defined]


def test_four_nodes_read_the_source_once_and_then_not_at_all(
    nodes: list[Gateway], dataset: dict[str, bytes], proxy: object
) -> None:
    proxy.reset()  # type: ignore[attr-defined]
    epoch(nodes, dataset, seed=0)
    first = source_gets(proxy)
    assert first <= 1.05 * OBJECTS, first  # each object once, by its owner
    for seed in (1, 2):
        proxy.reset()  # type: ignore[attr-defined]
        served = [gw.admin("GET", "/stats").json()["served"] for gw in nodes]
        epoch(nodes, dataset, seed)
        later = source_gets(proxy)
        assert later <= 0.01 * OBJECTS, (seed, later)  # every read a hit on its owner
        print(f"epoch {seed}: {later} source requests for {OBJECTS} objects")
        # Where each GET came from, as the nodes count them: a reader's own
        # hot tier, or the owner's (counted peer by the reader, and hot by
        # the owner that answered it): every object read hot exactly once.
        after = [gw.admin("GET", "/stats").json()["served"] for gw in nodes]
        by_tier = {tier: sum(a[tier]["objects"] - b[tier]["objects"] for a, b in zip(after, served, strict=True))
                   for tier in ("hot", "peer", "capacity")}
        assert by_tier["hot"] == OBJECTS and by_tier["capacity"] <= 0.01 * OBJECTS, by_tier
        assert 0.5 * OBJECTS <= by_tier["peer"] < OBJECTS, by_tier  # about three in four read elsewhere
    print(f"epoch 0: {first} source requests for {OBJECTS} objects")
    held = [gw.admin("GET", "/tiers").json()["hot_cached"] for gw in nodes]
    assert sum(held) <= 1.05 * OBJECTS * SIZE, held  # one copy for the cluster, not one per node


def test_a_hinted_epoch_on_one_node_is_fetched_ahead_once_by_the_owners(
    nodes: list[Gateway], moto_endpoint: str, proxy: object
) -> None:
    """An epoch registered on one node, for keys the four nodes own: each
    object is fetched ahead by its owner (the registering node keeps only its
    own share), the source reads each object once, and an object hot on its
    owner is not planned again (else the prefetcher would ask the owners
    round after round, and count each landing again)."""
    source = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    source.create_bucket(Bucket="cluster-hinted")
    files = {f"s/{i:03d}.bin": os.urandom(SIZE) for i in range(60)}
    for key, data in files.items():
        source.put_object(Bucket="cluster-hinted", Key=key, Body=data)
    for gw in nodes:
        answer = httpx.post(gw.admin_url + "/mounts", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                            json={"name": "hinted", "source": "s3://cluster-hinted", "endpoint": proxy.endpoint,
                                  "access_key": "testing", "secret_key": "testing"}, timeout=60)
        assert answer.status_code == 201, answer.text
    for gw in nodes:  # room for this data set beside the other tests' (each hot tier is small)
        gw.evict()
    proxy.reset()  # type: ignore[attr-defined]
    keys = sorted(files)
    client = make_client(nodes[0].endpoint)
    with Hints(nodes[0].admin_url, ADMIN_TOKEN, strict=True) as hints:
        epoch_id = hints.epoch("hinted", keys, readers=1)
        assert epoch_id is not None
        for key in keys:  # the reader, the prefetch window moving ahead of it
            assert client.get_object(Bucket="hinted", Key=key)["Body"].read() == files[key]
            time.sleep(0.01)
        status = hints.status(epoch_id)
        hints.end(epoch_id)
    first = source_gets(proxy)
    print(f"hinted epoch: {first} source requests, {status['prefetched_objects']} prefetched, "
          f"{status['hits']} hits")
    assert first <= 1.05 * len(keys), first  # each object once, by its owner or its reader
    assert status["prefetched_objects"] <= 1.05 * len(keys), json.dumps(status)  # none planned twice
    assert status["hits"] + status["late"] + status["misses"] == len(keys), json.dumps(status)
    proxy.reset()  # type: ignore[attr-defined]
    for key in keys:  # hot on the owners now
        assert client.get_object(Bucket="hinted", Key=key)["Body"].read() == files[key]
    assert source_gets(proxy) == 0
    for gw in nodes:  # its room back for the data set of the other tests
        assert httpx.delete(gw.admin_url + "/mounts/hinted", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                            timeout=60).status_code in (200, 204)


def test_a_batch_gathers_what_other_nodes_keep_in_one_request_each(
    nodes: list[Gateway], dataset: dict[str, bytes], proxy: object
) -> None:
    """A batch on one node of objects the four nodes own: the members the
    other nodes keep come in one batch request to each owner, not one GET
    per member; the source is not asked; every byte and the order are right."""
    epoch(nodes, dataset, seed=20)  # every object hot on its owner
    keys = sorted(dataset)[:64]
    reader = nodes[0]
    epoch([reader], {key: dataset[key] for key in keys}, seed=21)  # and known to the reader

    def requests(gw: Gateway) -> dict[str, int]:
        counted = gw.admin("GET", "/stats").json()["requests"]
        return {op: counted.get(op, {"count": 0})["count"] for op in ("GetObject", "GetBatch")}

    before = [requests(gw) for gw in nodes[1:]]
    proxy.reset()  # type: ignore[attr-defined]
    raw = Sender(reader)
    try:
        answer = raw.signed("POST", "/data?batch", body=json.dumps({"keys": keys}).encode())
    finally:
        raw.close()
    assert answer.status_code == 200, answer.text
    got = [(name, bytes(body)) for name, body in members(answer.content)]
    assert got == [(key, dataset[key]) for key in keys]
    assert source_gets(proxy) == 0
    after = [requests(gw) for gw in nodes[1:]]
    batches = sum(a["GetBatch"] - b["GetBatch"] for a, b in zip(after, before, strict=True))
    gets = sum(a["GetObject"] - b["GetObject"] for a, b in zip(after, before, strict=True))
    print(f"a batch of {len(keys)}: {batches} batch requests and {gets} GETs to the owners")
    assert 1 <= batches <= 3 and gets == 0, (batches, gets)


def test_a_killed_node_costs_its_share_from_the_source_and_no_error(
    nodes: list[Gateway], dataset: dict[str, bytes], proxy: object
) -> None:
    epoch(nodes, dataset, seed=10)  # all hot on their owners
    dead = nodes[-1]
    assert dead.proc is not None
    os.kill(dead.proc.pid, signal.SIGKILL)
    dead.proc.wait(30)
    proxy.reset()  # type: ignore[attr-defined]
    epoch(nodes[:-1], dataset, seed=11)  # the other three read everything
    gets = source_gets(proxy)
    print(f"one node down: {gets} source requests for {OBJECTS} objects")
    # The dead node's share, about a quarter, each object once (not kept by
    # the readers: they do not own it); the rest stays a hit on its owner.
    assert 0 < gets <= 0.5 * OBJECTS, gets
