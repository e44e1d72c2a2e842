"""Two gateways over one moto store, each reaching it through a proxy of its
own; the first node's proxy cuts it off from the store (it holds every
request) while clients keep writing through both nodes, then heals.

Each node starts as the writer of its own write-back bucket; the first also
writes a write-through bucket. Writers own their keys and write them over
and over, each PUT retried until one gateway acknowledges it: a refusal
(NotWriter, 503) or a timeout sends the retry to the other node, and the
writer stays with the node that acknowledged, as a client of a real
deployment would. At the end every key reads back, from
both nodes, as the bytes of its last acknowledged PUT: nothing the cut-off
node acknowledged before it stopped (unflushed, write-back) is lost, and
none of it overwrites what the other node acknowledged later. Progress is
counted (acknowledgements, refusals, held requests), never timed.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, ConnectionError, ReadTimeoutError

from tests.conftest import make_client
from tests.faults import FaultProxy
from tests.servers import Gateway, free_ports

LEASE_TTL = 4.0  # the skew allowance is a quarter of it
ARGS = ["--lease-ttl", str(LEASE_TTL), "--lease-idle", "2", "--follow-interval", "0.3",
        "--follow-fallback", "1", "--flush-delay", "1"]
BACK_A, BACK_B, THROUGH = "part-a", "part-b", "part-wt"
WRITERS = {BACK_A: 3, BACK_B: 2, THROUGH: 1}  # writer threads per bucket
KEYS = 4  # keys per writer, written in turn
POLLS = 600  # bound on every wait below, in polls of POLL seconds
POLL = 0.1


@pytest.fixture
def nodes(moto_endpoint: str, tmp_path: Path) -> Iterator[tuple[list[Gateway], list[FaultProxy]]]:
    capacity = f"tierstore-partition-{os.urandom(6).hex()}"
    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=capacity)
    names = ("pa", "pb")
    free = iter(free_ports(2 * len(names)))
    ports = {name: (next(free), next(free)) for name in names}
    peers = ",".join(f"{name}=http://127.0.0.1:{s3}" for name, (s3, _) in ports.items())
    with FaultProxy(moto_endpoint) as proxy_a, FaultProxy(moto_endpoint) as proxy_b:
        started: list[Gateway] = []
        try:
            for name, proxy in zip(names, (proxy_a, proxy_b)):
                gw = Gateway(tmp_path / name, extra_args=[
                    "--capacity", f"s3://{capacity}", "--capacity-endpoint", proxy.endpoint,
                    "--capacity-access-key", "testing", "--capacity-secret-key", "testing",
                    "--node-id", name, "--peers", peers, *ARGS,
                ])
                started.append(gw.start(ports[name]))
            yield started, [proxy_a, proxy_b]
        finally:
            for gw in started:
                gw.stop()


class Writers:
    """Threads that write their own keys in turn, each PUT retried on the
    other node until acknowledged, then sent to that node; ``acked`` holds each key's last
    acknowledged bytes."""

    def __init__(self, nodes: list[Gateway]) -> None:
        # No botocore retries (a refusal goes to the other node at once); a
        # short read timeout stands for a client that gives up on a node.
        self.clients = [make_client(gw.endpoint, read_timeout=10, connect_timeout=5) for gw in nodes]
        self.acked: dict[tuple[str, str], bytes] = {}
        self.by_node = [0, 0]
        self.refused: dict[str, int] = {}
        self.failed: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._write, args=(bucket, f"w{n}"), daemon=True)
            for bucket, count in WRITERS.items() for n in range(count)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)
        assert not any(t.is_alive() for t in self._threads)
        assert not self.failed, self.failed

    def count(self) -> int:
        return sum(self.by_node)

    def _write(self, bucket: str, writer: str) -> None:
        node = 0 if bucket != BACK_B else 1  # the node that acknowledged last, tried first
        for n in itertools.count():
            if self._stop.is_set():
                return
            key = f"{writer}/k{n % KEYS}"
            body = f"{bucket}/{key}#{n}:".encode() + os.urandom(64)
            for _ in range(POLLS):  # until acknowledged
                try:
                    self.clients[node].put_object(Bucket=bucket, Key=key, Body=body)
                except ClientError as exc:
                    code = exc.response["Error"]["Code"]
                    if code not in ("MethodNotAllowed", "ServiceUnavailable", "SlowDown"):
                        self.failed.append(f"{bucket}/{key}: {exc}")
                        return
                    with self._lock:
                        self.refused[code] = self.refused.get(code, 0) + 1
                    node = 1 - node  # refused: the other node may be the writer now
                    time.sleep(0.05)
                    continue
                except (ReadTimeoutError, ConnectionError) as exc:
                    with self._lock:
                        self.refused[type(exc).__name__] = self.refused.get(type(exc).__name__, 0) + 1
                    node = 1 - node
                    continue
                with self._lock:
                    self.acked[bucket, key] = body
                    self.by_node[node] += 1
                break
            else:
                self.failed.append(f"{bucket}/{key}: no node acknowledged it")
                return


def status(gw: Gateway) -> dict[str, Any]:
    return gw.admin("GET", "/tiers").json()


def writes(gw: Gateway) -> list[str]:
    return status(gw)["cluster"]["writing"]


def known(client: Any, bucket: str) -> bool:
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError:
        return False
    return True


def poll(check: Any, what: str) -> Any:
    """``check()``'s first true result, within POLLS polls."""
    for _ in range(POLLS):
        if result := check():
            return result
        time.sleep(POLL)
    raise AssertionError(f"not within {POLLS} polls: {what}")


def test_a_node_cut_off_from_the_store_loses_and_overwrites_no_acknowledged_write(
    nodes: tuple[list[Gateway], list[FaultProxy]],
) -> None:
    (node_a, node_b), (proxy_a, _) = nodes
    a, b = make_client(node_a.endpoint), make_client(node_b.endpoint)
    for client, bucket in ((a, BACK_A), (b, BACK_B), (a, THROUGH)):
        client.create_bucket(Bucket=bucket)
    node_a.admin("PATCH", f"/buckets/{THROUGH}", json={"write_through": True})
    poll(lambda: {BACK_A, THROUGH} <= set(writes(node_a)) and BACK_B in writes(node_b), "each node writes its own")
    poll(lambda: all(known(client, bucket) for client in (a, b) for bucket in WRITERS), "both nodes know every bucket")

    writers = Writers([node_a, node_b])
    writers.start()
    poll(lambda: writers.count() >= 60, "60 writes acknowledged before the partition")
    proxy_a.partition()
    before = writers.by_node[0]
    # The other node takes the cut-off node's buckets over once their leases
    # ran out, and the writes go on there.
    poll(lambda: BACK_A in writes(node_b), "node b takes bucket a over")
    acked = writers.count()
    poll(lambda: writers.count() >= acked + 60, "60 more writes acknowledged during the partition")
    queued = status(node_a)["hot_staged"]
    assert queued > 0, "node a holds no unflushed writes when it is cut off: the test tests nothing"
    assert proxy_a.held > 0
    print(f"partition: node a acknowledged {before} writes before it, b took over; "
          f"{proxy_a.held} requests held, {queued} bytes staged on a; refusals {writers.refused}")
    proxy_a.heal()
    acked = writers.count()
    poll(lambda: writers.count() >= acked + 60, "60 more writes acknowledged after the heal")
    writers.stop()

    # Every acknowledged key, from both nodes, as its last acknowledged PUT:
    # the cut-off node's unflushed writes flushed (it takes its bucket back
    # once the other gives it up, idle), none over a newer one.
    def read_back() -> bool:
        for node in (a, b):
            for (bucket, key), body in writers.acked.items():
                try:
                    if node.get_object(Bucket=bucket, Key=key)["Body"].read() != body:
                        return False
                except ClientError:
                    return False
        return True

    poll(read_back, "every acknowledged write read back from both nodes")
    poll(lambda: status(node_a)["hot_staged"] == 0, "node a flushed what it acknowledged")
    for gw in (node_a, node_b):
        listed = {(bucket, o["Key"]) for bucket in WRITERS
                  for o in make_client(gw.endpoint).list_objects_v2(Bucket=bucket).get("Contents", [])}
        assert listed == set(writers.acked), gw.data_dir.name
    print(f"{len(writers.acked)} keys, {writers.count()} writes acknowledged "
          f"(a {writers.by_node[0]}, b {writers.by_node[1]}); refusals {writers.refused}")
