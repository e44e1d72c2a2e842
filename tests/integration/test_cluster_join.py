"""Nodes that join and leave a running cluster over the node registry.

Three gateways with node ids and no --peers find each other in the
registry and hold a mounted data set as one cache. A fourth is started
while readers run: no reader sees an error, and the only objects read from
the source again are the ones the new node now owns (rendezvous hashing
moves only its share). Then a node is killed (SIGKILL) while readers run:
no error, no wrong byte, its share read from the source; started again, it
takes its share back with its hot tier as it left it. Source requests are
counted by a proxy in front of the source, per key.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest

from tests.integration.helpers import counting_proxy
from tests.integration.s3raw import Sender, check_error
from tests.integration.test_cluster_cache import epoch
from tests.integration.test_membership import FOLLOW, live
from tests.integration.test_scale_out import capacity_bucket, eventually
from tests.servers import ADMIN_TOKEN, Gateway, free_ports
from tiering.cluster import peers
from tiering.cluster.peers import PEER_HEADER, owner

OBJECTS = 160
SIZE = 16 * 1024
HOT = int(OBJECTS * SIZE * 0.45)  # each node's hot tier: 45 % of the set (three nodes hold it)
MOUNT = "joined"
BOUND = 30.0


@pytest.fixture(scope="module")
def proxy(moto_endpoint: str) -> Iterator[object]:
    """A request-counting proxy in front of moto."""
    with counting_proxy(moto_endpoint) as counting:
        yield counting


@pytest.fixture(scope="module")
def source(moto_endpoint: str) -> tuple[str, dict[str, bytes]]:
    name = f"join-source-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    client.create_bucket(Bucket=name)
    files = {f"train/{i:04d}.bin": os.urandom(SIZE) for i in range(OBJECTS)}
    for key, data in files.items():
        client.put_object(Bucket=name, Key=key, Body=data)
    return name, files


class Cluster:
    """Registry-joined nodes over one capacity store, each mounting the source."""

    def __init__(self, root: Path, capacity: list[str], proxy: object, source: str) -> None:
        self.root, self.capacity, self.proxy, self.source = root, capacity, proxy, source
        self.nodes: dict[str, Gateway] = {}

    def start(self, name: str) -> Gateway:
        gw = self.nodes.get(name)
        if gw is None:
            port, admin_port = free_ports(2)
            gw = Gateway(self.root / name, extra_args=[
                *self.capacity, "--node-id", name, "--follow-interval", str(FOLLOW),
                "--heartbeat-interval", str(FOLLOW), "--members-interval", str(FOLLOW),
                "--advertise-url", f"http://127.0.0.1:{port}", "--hot-size", str(HOT),
            ])
            gw.port, gw.admin_port = port, admin_port
            self.nodes[name] = gw
        gw.start((gw.port, gw.admin_port))
        answer = httpx.post(gw.admin_url + "/mounts", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                            json={"name": MOUNT, "source": f"s3://{self.source}",
                                  "endpoint": self.proxy.endpoint,  # type: ignore[attr-defined]
                                  "access_key": "testing", "secret_key": "testing"}, timeout=60)
        assert answer.status_code in (201, 409), answer.text  # 409: kept from before a restart
        return gw

    def settle(self, names: set[str]) -> None:
        """Until every running node sees exactly ``names`` live."""
        def agreed() -> None:
            for name in names:
                assert live(self.nodes[name]) == names, (name, live(self.nodes[name]))
        eventually(agreed, BOUND)

    def running(self, names: list[str]) -> list[Gateway]:
        return [self.nodes[name] for name in names]

    def stop(self) -> None:
        for gw in self.nodes.values():
            gw.stop()


@pytest.fixture(scope="module")
def cluster(moto_endpoint: str, proxy: object, source: tuple[str, dict[str, bytes]],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path_factory.mktemp("cluster-join"), capacity_bucket(moto_endpoint), proxy, source[0])
    try:
        for name in ("j1", "j2", "j3"):
            nodes.start(name)
        nodes.settle({"j1", "j2", "j3"})
        yield nodes
    finally:
        nodes.stop()


def fetched_keys(proxy: object, bucket: str) -> set[str]:
    """The source keys read (GET or HEAD) since the last reset."""
    prefix = f"/{bucket}/"
    paths = proxy.paths  # type: ignore[attr-defined]
    return {path[len(prefix):] for (op, path), n in list(paths.items())
            if op in ("GetObject", "HeadObject") and path.startswith(prefix) and n}


def owned(names: list[str], keys: list[str], by: str) -> set[str]:
    return {key for key in keys if owner(f"{MOUNT}\0{key}", sorted(names)) == by}


def in_background(fn: object, *args: object) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn(*args)  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_a_node_that_joins_takes_only_its_share(
    cluster: Cluster, source: tuple[str, dict[str, bytes]], proxy: object
) -> None:
    bucket, files = source
    three = ["j1", "j2", "j3"]
    epoch(cluster.running(three), files, seed=0, bucket=MOUNT)  # each object hot on its owner
    proxy.reset()  # type: ignore[attr-defined]
    epoch(cluster.running(three), files, seed=1, bucket=MOUNT)
    assert fetched_keys(proxy, bucket) == set()

    # A fourth node joins while the three read: no reader sees an error.
    reading, errors = in_background(epoch, cluster.running(three), files, 2, MOUNT)
    cluster.start("j4")
    reading.join()
    assert errors == [], errors
    four = [*three, "j4"]
    cluster.settle(set(four))

    # Two epochs: the new node's share is handed over by the nodes that kept
    # it (they still hold it hot), not read from the source again; nothing
    # else moves. What the old owners no longer held comes from the source,
    # once each, and only from the new node's share.
    proxy.reset()  # type: ignore[attr-defined]
    epoch(cluster.running(four), files, seed=3, bucket=MOUNT)
    epoch(cluster.running(four), files, seed=4, bucket=MOUNT)
    moved = fetched_keys(proxy, bucket)
    share = owned(four, list(files), "j4")
    print(f"joined: {len(moved)} objects read from the source, the new node owns {len(share)}")
    assert moved <= share, sorted(moved - share)[:5]  # nothing else moved
    assert len(share) > 0.1 * OBJECTS and len(moved) <= 0.1 * len(share), (len(moved), len(share))
    assert all(proxy.paths["GetObject", f"/{bucket}/{key}"] == 1 for key in moved)  # type: ignore[attr-defined]
    # The new node keeps its share now (the old owners' copies go as their eviction reaches them).
    joined = cluster.nodes["j4"]
    held = [key for key in share if joined.admin("GET", f"/objects/{MOUNT}/{key}").json()["where"] == "hot"]
    assert len(held) >= 0.9 * len(share), (len(held), len(share))

    # What a joined node asks of the old owners is their memory alone: an
    # object a node does not hold is a 503 there, never a read of the source.
    proxy.reset()  # type: ignore[attr-defined]
    raw = Sender(cluster.nodes["j1"])
    try:
        check_error(raw.signed("GET", f"/{MOUNT}/train/never-read.bin", {PEER_HEADER: peers.HOT}), 503,
                    "ServiceUnavailable")
    finally:
        raw.close()
    assert fetched_keys(proxy, bucket) == set()


def test_a_killed_node_is_read_around_and_takes_its_share_back(
    cluster: Cluster, source: tuple[str, dict[str, bytes]], proxy: object
) -> None:
    bucket, files = source
    four = ["j1", "j2", "j3", "j4"]
    cluster.settle(set(four))
    epoch(cluster.running(four), files, seed=5, bucket=MOUNT)  # all hot on their owners
    others = ["j1", "j3", "j4"]
    victim = cluster.nodes["j2"]
    proxy.reset()  # type: ignore[attr-defined]
    reading, errors = in_background(epoch, cluster.running(others), files, 6, MOUNT)
    assert victim.proc is not None
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(30)
    reading.join()
    assert errors == [], errors  # every byte checked by epoch()
    epoch(cluster.running(others), files, seed=7, bucket=MOUNT)
    theirs = owned(four, list(files), "j2")
    read = fetched_keys(proxy, bucket)
    print(f"one node down: {len(read)} objects read from the source, it owned {len(theirs)}")
    assert read and read <= theirs, sorted(read - theirs)[:5]  # only its share
    cluster.settle(set(others))  # its heartbeat ran out: its share moved to the three

    cluster.start("j2")  # same data dir: its hot tier as the kill left it
    cluster.settle(set(four))
    proxy.reset()  # type: ignore[attr-defined]
    epoch(cluster.running(four), files, seed=8, bucket=MOUNT)
    back = fetched_keys(proxy, bucket)
    print(f"back: {len(back)} objects read from the source")
    assert back <= theirs  # only what it owns again can be missing
    assert len(back) <= 0.5 * len(theirs), (len(back), len(theirs))  # most of it kept across the kill
