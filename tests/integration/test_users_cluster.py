"""Users among three gateways over one moto server: a user created, a
policy changed, a key revoked on one node is honoured by the others within
their follow interval (polled with a bound, never timed); the nodes share
one secrets key file, and a node with another key refuses to start."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from tests.conftest import make_client
from tests.integration.test_scale_out import capacity_bucket, eventually
from tests.servers import Gateway, free_ports

FOLLOW = 0.3
BOUND = 20.0


def node(root: Path, name: str, capacity: list[str], key_file: Path) -> Gateway:
    port, admin_port = free_ports(2)
    gw = Gateway(root / name, extra_args=[
        *capacity, "--node-id", name, "--follow-interval", str(FOLLOW), "--flush-delay", "0.2",
        "--heartbeat-interval", str(FOLLOW), "--members-interval", str(FOLLOW),
        "--advertise-url", f"http://127.0.0.1:{port}", "--secrets-key-file", str(key_file),
    ])
    gw.port, gw.admin_port = port, admin_port
    return gw


@pytest.fixture(scope="module")
def cluster(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Gateway], list[str]]]:
    root = tmp_path_factory.mktemp("users-cluster")
    capacity = capacity_bucket(moto_endpoint)
    key_file = root / "shared" / "secrets.key"  # made by the first node, read by the others
    started: list[Gateway] = []
    try:
        for name in ("u1", "u2", "u3"):
            gw = node(root, name, capacity, key_file)
            started.append(gw.start((gw.port, gw.admin_port)))
        yield started, capacity
    finally:
        for gw in started:
            gw.stop()


def client(gw: Gateway, key: dict[str, str]):
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=key["access_key"],
                        aws_secret_access_key=key["secret_key"], region_name="us-east-1",
                        config=BotoConfig(retries={"max_attempts": 1}))


def code(call, **kwargs) -> str | None:  # type: ignore[no-untyped-def]
    try:
        call(**kwargs)
    except ClientError as exc:
        return exc.response["Error"]["Code"]
    return None


def test_a_change_on_one_node_is_honoured_by_the_others(cluster: tuple[list[Gateway], list[str]]) -> None:
    nodes, _ = cluster
    first = nodes[0]
    root = make_client(first.endpoint)
    root.create_bucket(Bucket="shared-users")
    root.put_object(Bucket="shared-users", Key="k", Body=b"shared")
    first.flush()
    key = first.admin("POST", "/users", json={"name": "everywhere", "policies": ["read-only:shared-users"]}).json()["key"]

    for gw in nodes:  # created on u1: every node serves the user, u1 at once
        assert eventually(lambda gw=gw: client(gw, key).get_object(Bucket="shared-users", Key="k")["Body"].read(),
                          BOUND) == b"shared"
        assert code(client(gw, key).put_object, Bucket="shared-users", Key="x", Body=b"x") == "AccessDenied"

    # A policy changed on u2 holds on u1 and u3; a key revoked on u3 is refused on u1 and u2.
    nodes[1].admin("PATCH", "/users/everywhere", json={"policies": []})
    for gw in nodes:
        eventually(lambda gw=gw: _refused(gw, key, "AccessDenied"), BOUND)
    nodes[1].admin("PATCH", "/users/everywhere", json={"policies": ["read-only:shared-users"]})
    nodes[2].admin("DELETE", f"/users/everywhere/keys/{key['access_key']}")
    for gw in nodes:
        eventually(lambda gw=gw: _refused(gw, key, "InvalidAccessKeyId"), BOUND)
    # Every node lists the same users, whichever wrote last.
    assert {json.dumps(gw.admin("GET", "/users").json(), sort_keys=True) for gw in nodes} == {
        json.dumps(nodes[0].admin("GET", "/users").json(), sort_keys=True)}


def _refused(gw: Gateway, key: dict[str, str], expected: str) -> None:
    assert code(client(gw, key).get_object, Bucket="shared-users", Key="k") == expected


def test_bucket_policies_reach_every_node(cluster: tuple[list[Gateway], list[str]]) -> None:
    nodes, _ = cluster
    root = make_client(nodes[1].endpoint)
    root.create_bucket(Bucket="shared-public")
    root.put_object(Bucket="shared-public", Key="d", Body=b"data")
    nodes[1].flush()
    root.put_bucket_policy(Bucket="shared-public", Policy=json.dumps({"Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::shared-public/*"}]}))
    for gw in nodes:
        eventually(lambda gw=gw: _public(gw), BOUND)


def _public(gw: Gateway) -> None:
    assert httpx.get(f"{gw.endpoint}/shared-public/d").content == b"data"


def test_a_node_with_another_secrets_key_refuses_to_start(
        cluster: tuple[list[Gateway], list[str]], tmp_path: Path) -> None:
    nodes, capacity = cluster
    nodes[0].admin("POST", "/users", json={"name": "sealed", "policies": []})
    stranger = node(tmp_path, "u4", capacity, tmp_path / "other.key")
    with pytest.raises(RuntimeError, match="exited"):
        stranger.start((stranger.port, stranger.admin_port))
    stranger.proc = None  # it ended by itself
    assert "sealed under another secrets key" in stranger.log()
