"""Three gateway processes with node ids and no --peers over one moto
server: they find each other through the node registry in the store
(``leases/_nodes/``), a node stopped cleanly leaves the others' live set,
and one started again comes back. Polled with a bound, never timed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_client
from tests.integration.test_scale_out import capacity_bucket, eventually
from tests.servers import Gateway, free_ports

FOLLOW = 0.3  # the heartbeat and listing intervals too
BOUND = 20.0


def node(root: Path, name: str, capacity: list[str]) -> Gateway:
    port, admin_port = free_ports(2)
    gw = Gateway(root / name, extra_args=[
        *capacity, "--node-id", name, "--follow-interval", str(FOLLOW), "--flush-delay", "0.2",
        "--heartbeat-interval", str(FOLLOW), "--members-interval", str(FOLLOW),
        "--advertise-url", f"http://127.0.0.1:{port}",
    ])
    gw.port, gw.admin_port = port, admin_port
    return gw


def members(gw: Gateway) -> dict[str, dict[str, Any]]:
    listed = gw.admin("GET", "/tiers").json()["cluster"]["members"]
    return {m["node"]: m for m in listed}


def live(gw: Gateway) -> set[str]:
    return {name for name, m in members(gw).items() if m["live"]}


@pytest.fixture(scope="module")
def nodes(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Gateway]]:
    root = tmp_path_factory.mktemp("members")
    capacity = capacity_bucket(moto_endpoint)
    started: list[Gateway] = []
    try:
        for name in ("m1", "m2", "m3"):
            gw = node(root, name, capacity)
            started.append(gw.start((gw.port, gw.admin_port)))
        yield started
    finally:
        for gw in started:
            gw.stop()


def test_nodes_without_peers_find_each_other_in_the_registry(nodes: list[Gateway]) -> None:
    def all_live() -> None:
        for gw in nodes:
            assert live(gw) == {"m1", "m2", "m3"}

    eventually(all_live, BOUND)
    shown = members(nodes[0])
    assert shown["m1"]["me"] and not shown["m2"]["me"]
    assert shown["m2"]["endpoint"] == nodes[1].endpoint
    assert all(m["heartbeat_age"] < BOUND for m in shown.values())

    # Reads work across the set: a miss asks the owner, or the store.
    writer = make_client(nodes[0].endpoint)
    writer.create_bucket(Bucket="members")
    for i in range(6):
        writer.put_object(Bucket="members", Key=f"k{i}", Body=f"body {i}".encode() * 1000)
    nodes[0].flush()
    reader = make_client(nodes[2].endpoint)
    for i in range(6):
        assert eventually(lambda i=i: reader.get_object(Bucket="members", Key=f"k{i}")["Body"].read(),
                          BOUND) == f"body {i}".encode() * 1000

    # A clean stop deletes the entry: the others drop the node; it comes back when started again.
    third = nodes[2]
    third.stop()

    def dropped() -> None:
        for gw in nodes[:2]:
            assert "m3" not in members(gw)

    eventually(dropped, BOUND)
    third.start((third.port, third.admin_port))
    eventually(all_live, BOUND)
