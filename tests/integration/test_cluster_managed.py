"""Four gateways over one store hold a managed bucket as one cache.

The same epochs as tests/integration/test_cluster_cache.py, over a bucket
written through the gateway instead of a mounted one: one node writes it
(the bucket's writer), all four follow it, and each node's hot tier is 35 %
of the data set. Every extent of a segment has one owner (rendezvous
hashing of the extent over the nodes); a miss elsewhere asks the owner, so
the store serves each extent once and the four hot tiers add up. Store
requests are counted by a proxy in front of the capacity store, only those
for segments (the nodes' leases, terms and heartbeats go through it too).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.conftest import make_client
from tests.integration.helpers import counting_proxy, peered_nodes
from tests.integration.test_cluster_cache import epoch
from tests.servers import Gateway

OBJECTS = 200
SIZE = 16 * 1024
NODES = ("m1", "m2", "m3", "m4")
HOT = int(OBJECTS * SIZE * 0.35)  # each node's hot tier: 35 % of the data set
BUCKET = "managed-set"


@pytest.fixture(scope="module")
def proxy(moto_endpoint: str) -> Iterator[object]:
    """A request-counting proxy in front of moto."""
    with counting_proxy(moto_endpoint) as counting:
        yield counting


@pytest.fixture(scope="module")
def nodes(moto_endpoint: str, proxy: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Gateway]]:
    with peered_nodes(tmp_path_factory.mktemp("cluster-managed"), NODES, moto_endpoint,
                      proxy.endpoint,  # type: ignore[attr-defined]
                      ["--hot-size", str(HOT), "--follow-interval", "0.3",
                       "--flush-delay", "600"]) as started:  # one flush packs the set
        yield started


@pytest.fixture(scope="module")
def dataset(nodes: list[Gateway]) -> dict[str, bytes]:
    """The set, written through the first node and flushed; every node
    lists all of it; no node holds any of it hot."""
    writer = make_client(nodes[0].endpoint)
    writer.create_bucket(Bucket=BUCKET)
    files = {f"train/{i:04d}.bin": os.urandom(SIZE) for i in range(OBJECTS)}
    for key, data in files.items():
        writer.put_object(Bucket=BUCKET, Key=key, Body=data)
    nodes[0].flush()
    deadline = time.monotonic() + 60
    for gw in nodes[1:]:
        client = make_client(gw.endpoint)
        while client.list_objects_v2(Bucket=BUCKET).get("KeyCount") != OBJECTS:
            assert time.monotonic() < deadline, f"{gw.data_dir.name} does not follow the writer"
            time.sleep(0.2)
    for gw in nodes:
        gw.evict()
    return files


def segment_gets(proxy: object) -> int:
    return proxy.requests_to("GetObject", "/segments/")  # type: ignore[attr-defined]


def test_four_nodes_read_each_extent_from_the_store_once_and_then_not_at_all(
    nodes: list[Gateway], dataset: dict[str, bytes], proxy: object
) -> None:
    proxy.reset()  # type: ignore[attr-defined]
    epoch(nodes, dataset, seed=0, bucket=BUCKET)
    first = segment_gets(proxy)
    print(f"epoch 0: {first} store GETs for {OBJECTS} objects")
    assert first <= 1.05 * OBJECTS, first  # each extent once, by its owner
    for seed in (1, 2):
        proxy.reset()  # type: ignore[attr-defined]
        epoch(nodes, dataset, seed, bucket=BUCKET)
        later = segment_gets(proxy)
        print(f"epoch {seed}: {later} store GETs for {OBJECTS} objects")
        assert later <= 0.01 * OBJECTS, (seed, later)  # every read a hit on its owner
    held = [gw.admin("GET", "/tiers").json()["hot_cached"] for gw in nodes]
    assert sum(held) <= 1.05 * OBJECTS * SIZE, held  # one copy for the cluster, not one per node
    assert all(0 < h <= HOT for h in held), held  # every node holds its share
