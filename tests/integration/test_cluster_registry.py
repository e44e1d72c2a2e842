"""A managed bucket over nodes that find each other in the node registry.

The nodes have node ids and advertised URLs and no --peers. A cooperative
warm started on one of them, with no node list, takes the registry's live
nodes: each extent is fetched from the store once, by the node that owns
it, which keeps it where reads look for it. Store requests are counted by
a proxy in front of the capacity store, only those for segments.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.conftest import make_client
from tests.integration.helpers import counting_proxy
from tests.integration.test_cluster_cache import epoch
from tests.integration.test_membership import FOLLOW, live
from tests.integration.test_scale_out import eventually
from tests.servers import Gateway, free_ports

OBJECTS = 120
SIZE = 16 * 1024
BOUND = 60.0


@pytest.fixture(scope="module")
def proxy(moto_endpoint: str) -> Iterator[object]:
    """A request-counting proxy in front of moto."""
    with counting_proxy(moto_endpoint) as counting:
        yield counting


class Registered:
    """Registry nodes over one capacity bucket reached through ``proxy``."""

    def __init__(self, root: Path, moto_endpoint: str, proxy: object) -> None:
        self.root = root
        self.bucket = f"tierstore-registry-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=self.bucket)
        self.store = proxy.endpoint  # type: ignore[attr-defined]
        self.nodes: list[Gateway] = []

    def start(self, name: str, *extra: str) -> Gateway:
        port, admin_port = free_ports(2)
        gw = Gateway(self.root / name, extra_args=[
            "--capacity", f"s3://{self.bucket}", "--capacity-endpoint", self.store,
            "--capacity-access-key", "testing", "--capacity-secret-key", "testing",
            "--node-id", name, "--advertise-url", f"http://127.0.0.1:{port}",
            "--follow-interval", str(FOLLOW), "--heartbeat-interval", str(FOLLOW),
            "--members-interval", str(FOLLOW), "--flush-delay", "600", *extra,
        ])
        self.nodes.append(gw.start((port, admin_port)))
        return gw

    def settle(self) -> None:
        """Until every node lists every node live."""
        names = {gw.data_dir.name for gw in self.nodes}

        def agreed() -> None:
            for gw in self.nodes:
                assert live(gw) == names, (gw.data_dir.name, live(gw))
        eventually(agreed, BOUND)

    def write(self, bucket: str, count: int) -> dict[str, bytes]:
        """``count`` objects written through the first node and flushed,
        listed by every node, hot on none."""
        writer = make_client(self.nodes[0].endpoint)
        writer.create_bucket(Bucket=bucket)
        files = {f"train/{i:04d}.bin": os.urandom(SIZE) for i in range(count)}
        for key, data in files.items():
            writer.put_object(Bucket=bucket, Key=key, Body=data)
        self.nodes[0].flush()
        for gw in self.nodes[1:]:
            client = make_client(gw.endpoint)  # NoSuchBucket until it follows the first segment

            def listed() -> None:
                assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == count  # noqa: B023
            eventually(listed, BOUND)
        for gw in self.nodes:
            gw.evict()
        return files

    def stop(self) -> None:
        for gw in self.nodes:
            gw.stop()


@pytest.fixture
def registered(moto_endpoint: str, proxy: object, tmp_path: Path) -> Iterator[Registered]:
    cluster = Registered(tmp_path, moto_endpoint, proxy)
    try:
        yield cluster
    finally:
        cluster.stop()


def segment_gets(proxy: object) -> int:
    return proxy.requests_to("GetObject", "/segments/")  # type: ignore[attr-defined]


def test_a_cooperative_warm_on_one_node_warms_each_extent_on_its_owner(
    registered: Registered, proxy: object
) -> None:
    for name in ("w1", "w2", "w3"):
        registered.start(name)
    registered.settle()
    files = registered.write("warmed", OBJECTS)
    proxy.reset()  # type: ignore[attr-defined]
    job = registered.nodes[1].admin("POST", "/jobs/warm?wait=true",
                                    json={"bucket": "warmed", "prefix": "train/", "cooperative": True}).json()
    assert job["state"] == "succeeded", job
    result = job["result"]
    warmed = segment_gets(proxy)
    print(f"cooperative warm: {warmed} segment GETs for {OBJECTS} objects; {result}")
    assert result["hot_objects"] == OBJECTS and result["peer_fallbacks"] == 0, result
    # About two thirds of the extents are the other two nodes' share: each asked of its owner.
    assert OBJECTS / 3 < result["owner_extents"] < OBJECTS, result
    assert warmed <= OBJECTS, warmed  # each extent from the store at most once, by its owner
    held = [gw.admin("GET", "/tiers").json()["hot_cached"] for gw in registered.nodes]
    assert all(h > 0 for h in held), held  # every node keeps its share
    assert sum(held) <= 1.05 * OBJECTS * SIZE, held  # and only it: one copy for the cluster
    proxy.reset()  # type: ignore[attr-defined]
    epoch(registered.nodes, files, seed=3, bucket="warmed")  # read on every node: all warm already
    assert segment_gets(proxy) == 0


def test_a_joining_node_takes_its_share_of_managed_extents_from_the_previous_owners(
    registered: Registered, proxy: object
) -> None:
    """Two nodes hold a managed bucket hot (each its share); a third joins.
    Every object read through the third comes from the store not once:
    the extents the other two still own are asked of them, and those the
    third owns now are handed over from the memory of the node that kept
    them, and kept on the third, so a read through the others finds them
    there."""
    for name in ("h1", "h2"):
        registered.start(name)
    registered.settle()
    files = registered.write("handed", OBJECTS)
    epoch(registered.nodes, files, seed=5, bucket="handed")  # hot on their owners
    joined = registered.start("h3")
    registered.settle()
    proxy.reset()  # type: ignore[attr-defined]
    epoch([joined], files, seed=6, bucket="handed")
    from_store = segment_gets(proxy)
    held = joined.admin("GET", "/tiers").json()["hot_cached"]
    print(f"after the join: {from_store} segment GETs reading {OBJECTS} objects through the new node, "
          f"which now holds {held} bytes")
    assert from_store == 0, from_store
    assert OBJECTS * SIZE / 6 < held < OBJECTS * SIZE / 2, held  # about a third: its share, handed over
    proxy.reset()  # type: ignore[attr-defined]
    epoch(registered.nodes, files, seed=7, bucket="handed")  # the new node's share is hot there now
    assert segment_gets(proxy) == 0
