"""Three gateway processes over one moto S3 server: a writer per bucket by
lease, the other nodes following each writer, refusals that name the
writer, a race for a new bucket that exactly one node wins, and a takeover
after SIGKILL of a writer that loses nothing acknowledged."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
import s3fs
from botocore.exceptions import ClientError

from tests.conftest import make_client
from tests.integration.s3raw import Sender, check_error
from tests.integration.test_cli_admin import cli
from tests.servers import ACCESS_KEY, ADMIN_TOKEN, SECRET_KEY, Gateway, free_port, free_ports
from tiering.cluster.peers import HOT, PEER_HEADER

LEASE_TTL = 3.0  # the skew allowance is a quarter of it
FOLLOW = 0.3
FLUSH_DELAY = 0.2
# How stale a replica may be: the writer's flush delay, one follow interval,
# and generous room for a loaded two-core machine to list, read and apply.
BOUND = FLUSH_DELAY + FOLLOW + 10.0


def capacity_bucket(moto_endpoint: str) -> list[str]:
    name = f"tierstore-cluster-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
        aws_secret_access_key="testing", region_name="us-east-1",
    ).create_bucket(Bucket=name)
    return [
        "--capacity", f"s3://{name}", "--capacity-endpoint", moto_endpoint,
        "--capacity-access-key", "testing", "--capacity-secret-key", "testing",
    ]


def node(root: Path, name: str, capacity: list[str]) -> Gateway:
    return Gateway(root / name, extra_args=[
        *capacity, "--node-id", name, "--lease-ttl", str(LEASE_TTL),
        "--follow-interval", str(FOLLOW), "--flush-delay", str(FLUSH_DELAY),
    ])


def cluster(gw: Gateway) -> dict[str, Any]:
    return gw.admin("GET", "/tiers").json()["cluster"]


def eventually(check: Callable[[], Any], timeout: float = BOUND) -> Any:
    """``check()``'s first result that does not raise, within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except (AssertionError, ClientError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture(scope="module")
def nodes(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Gateway]]:
    root = tmp_path_factory.mktemp("cluster")
    capacity = capacity_bucket(moto_endpoint)
    started = []
    try:
        started += [node(root, name, capacity).start() for name in ("n1", "n2", "n3")]
        yield started
    finally:
        for gw in started:
            gw.stop()


def test_writes_on_each_writer_reach_the_other_nodes_within_the_bound(nodes: list[Gateway]) -> None:
    writer, *replicas = nodes
    assert [cluster(gw)["role"] for gw in nodes] == ["replica"] * 3  # no bucket written yet
    s3 = make_client(writer.endpoint)
    s3.create_bucket(Bucket="follow")  # n1 takes its lease
    second = make_client(replicas[0].endpoint)
    second.create_bucket(Bucket="second")  # and n2 that of another bucket, writing beside n1
    second.put_object(Bucket="second", Key="from-n2", Body=b"n2 writes this one")
    for i in range(20):
        s3.put_object(Bucket="follow", Key=f"obj-{i:02d}", Body=f"body {i}".encode() * 100)
    s3.put_object(Bucket="follow", Key="big", Body=b"B" * (12 << 20))  # split into parts
    s3.delete_object(Bucket="follow", Key="obj-07")
    written = time.monotonic()
    for gw in replicas:
        client = make_client(gw.endpoint)

        def caught_up(client=client) -> list[str]:
            listed = client.list_objects_v2(Bucket="follow")
            keys = [o["Key"] for o in listed.get("Contents", [])]
            assert keys == ["big", *(f"obj-{i:02d}" for i in range(20) if i != 7)]
            return keys

        eventually(caught_up)
        assert client.get_object(Bucket="follow", Key="obj-03")["Body"].read() == b"body 3" * 100
        assert client.get_object(Bucket="follow", Key="big", Range="bytes=9437180-9437189")["Body"].read() == b"B" * 10
        with pytest.raises(ClientError) as gone:
            client.head_object(Bucket="follow", Key="obj-07")
        assert gone.value.response["Error"]["Code"] == "404"
    assert time.monotonic() - written < BOUND
    for gw in (writer, replicas[1]):
        client = make_client(gw.endpoint)
        assert eventually(lambda client=client: client.get_object(
            Bucket="second", Key="from-n2")["Body"].read()) == b"n2 writes this one"

    # Every node reports the buckets it writes and its lag; a caught-up node
    # trails by about one interval.
    expected = {"n1": ["follow"], "n2": ["second"], "n3": []}
    for gw in nodes:
        status = eventually(lambda gw=gw: _lag_below(gw, 5 * FOLLOW + 2.0))
        assert status["lag_segments"] == 0 and status["writing"] == expected[gw.data_dir.name]
        assert status["role"] == ("writer" if expected[gw.data_dir.name] else "replica")
        assert status["writers"] == {"follow": "n1", "second": "n2"}
        metrics = gw.admin("GET", "/metrics").text
        assert "tierstore_replica_lag_seconds " in metrics
        assert f"tierstore_cluster_leases_held {len(expected[gw.data_dir.name])}.0" in metrics

    # `tierstore status` shows the same: what n2 writes, whom it follows.
    shown = cli(replicas[0], "status").stdout
    assert "cluster" in shown and "second" in shown and "follow (n1)" in shown, shown

    # s3fs reads the replica like any S3 endpoint.
    fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=replicas[1].endpoint,
                           use_listings_cache=False, skip_instance_cache=True,
                           client_kwargs={"region_name": "us-east-1"})
    assert fs.cat_file("follow/obj-19") == b"body 19" * 100


def _lag_below(gw: Gateway, limit: float) -> dict[str, Any]:
    status = cluster(gw)
    assert status["lag_seconds"] is not None and status["lag_seconds"] < limit, status
    return status


def test_a_node_refuses_writes_to_another_writers_bucket_and_names_it(nodes: list[Gateway]) -> None:
    writer, replica, _ = nodes
    make_client(writer.endpoint).create_bucket(Bucket="refused")
    s3 = make_client(replica.endpoint)
    eventually(lambda: s3.head_bucket(Bucket="refused"))
    for attempt in (
        lambda: s3.put_object(Bucket="refused", Key="k", Body=b"x"),
        lambda: s3.delete_object(Bucket="refused", Key="k"),
        lambda: s3.create_multipart_upload(Bucket="refused", Key="mp"),
        lambda: s3.delete_objects(Bucket="refused", Delete={"Objects": [{"Key": "k"}]}),
    ):
        with pytest.raises(ClientError) as refused:
            attempt()
        error = refused.value.response["Error"]
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 405
        assert error["Code"] == "MethodNotAllowed" and error["Writer"] == "n1"
        assert "n1" in error["Message"]
    # The admin API refuses bucket changes the same way (421, naming the writer).
    answer = httpx.patch(f"{replica.admin_url}/buckets/refused", json={"write_through": True},
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert answer.status_code == 421 and answer.json()["error"]["code"] == "NotWriter"
    assert "n1" in answer.json()["error"]["message"]
    # CreateBucket of an existing bucket is the same answer on every node:
    # 200 in us-east-1, the bucket as it was.
    assert s3.create_bucket(Bucket="refused")["ResponseMetadata"]["HTTPStatusCode"] == 200
    # Reads on the replica still work, and nothing was written.
    assert s3.list_objects_v2(Bucket="refused")["KeyCount"] == 0
    with pytest.raises(ClientError):
        make_client(writer.endpoint).head_object(Bucket="refused", Key="k")


def test_two_nodes_racing_to_create_a_bucket_one_wins(moto_endpoint: str, tmp_path: Path) -> None:
    import threading

    capacity = capacity_bucket(moto_endpoint)
    gws = [node(tmp_path, f"race{i}", capacity).start() for i in range(2)]
    try:
        outcomes: dict[str, Any] = {}
        start = threading.Barrier(len(gws))

        def create(gw: Gateway) -> None:
            client = make_client(gw.endpoint)
            start.wait()
            try:
                client.create_bucket(Bucket="race")
                outcomes[gw.data_dir.name] = "created"
            except ClientError as exc:
                outcomes[gw.data_dir.name] = exc.response

        threads = [threading.Thread(target=create, args=(gw,)) for gw in gws]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # One node holds the bucket's lease and writes it.
        writing = {gw.data_dir.name: cluster(gw)["writing"] for gw in gws}
        winners = [name for name, buckets in writing.items() if buckets == ["race"]]
        assert len(winners) == 1 and sorted(writing.values()) == [[], ["race"]], writing
        assert outcomes[winners[0]] == "created", outcomes
        # The other was refused by the lease (naming the winner), or, had it
        # already followed the winner's CreateBucket, told 200 as S3 tells
        # an owner in us-east-1.
        (loser,) = [out for name, out in outcomes.items() if name != winners[0]]
        if loser != "created":
            assert loser["Error"]["Code"] == "MethodNotAllowed", loser
            assert loser["Error"]["Writer"] == winners[0]
    finally:
        for gw in gws:
            gw.stop()


def warm_everywhere(gws: list[Gateway], body: dict[str, Any]) -> list[dict[str, Any]]:
    """Start the same warm job on every node at once; their results."""
    jobs = [gw.admin("POST", "/jobs/warm", json=body).json() for gw in gws]

    def ended(gw: Gateway, job: dict[str, Any]) -> dict[str, Any]:
        view = gw.admin("GET", f"/jobs/{job['id']}").json()
        assert view["state"] not in ("queued", "running"), view
        return view

    results = []
    for gw, job in zip(gws, jobs, strict=True):
        view = eventually(lambda gw=gw, job=job: ended(gw, job), timeout=120)
        assert view["state"] == "succeeded", view
        results.append(view["result"])
    return results


def test_cooperative_warm_reads_each_segment_from_the_store_once(nodes: list[Gateway]) -> None:
    writer = nodes[0]
    s3 = make_client(writer.endpoint)
    s3.create_bucket(Bucket="coop")
    data = {}
    for i in range(48):
        # Mostly incompressible (stored as is), every fourth compressible (stored as zstd):
        # a peer's bytes are checked against both forms.
        body = (f"line {i}\n".encode() * 20_000)[:150_000] if i % 4 == 0 else os.urandom(100_000 + i)
        s3.put_object(Bucket="coop", Key=f"shard/{i:03d}", Body=body)
        data[f"shard/{i:03d}"] = body
        if i % 8 == 7:
            writer.flush()  # a segment for every eight objects
    for gw in nodes[1:]:
        client = make_client(gw.endpoint)
        eventually(lambda client=client: _count_is(client, "coop", len(data)))
    segments = {s for s in _segments_of(writer, "coop")}
    assert len(segments) >= 4

    # Alone: one node reads every segment (one GET each: a segment is one run).
    for gw in nodes:
        gw.evict()
    # What a peer asks: from the hot tier only, 503 (S3 XML) while not there.
    raw = Sender(nodes[0])
    try:
        cold = raw.signed("GET", "/coop/shard/001", {PEER_HEADER: HOT})
        check_error(cold, 503, "ServiceUnavailable")
        alone = warm_everywhere(nodes[:1], {"bucket": "coop", "prefix": "shard/"})[0]
        hot = raw.signed("GET", "/coop/shard/001", {PEER_HEADER: HOT})
        assert hot.status_code == 200 and hot.content == data["shard/001"]
    finally:
        raw.close()
    assert alone["requests"] == len(segments) and alone["hot_objects"] == len(data)
    nodes[0].evict()

    # Together: the three nodes read each segment once between them, and
    # every node ends with the whole set hot.
    peers = {gw.data_dir.name: gw.endpoint for gw in nodes}
    results = warm_everywhere(nodes, {"bucket": "coop", "prefix": "shard/", "peers": peers})
    assert sum(r["requests"] for r in results) == len(segments)
    assert sum(r["fetched_bytes"] for r in results) == alone["fetched_bytes"]
    assert all(r["peer_fallbacks"] == 0 and r["errors"] == 0 for r in results), results
    assert sum(r["peer_extents"] for r in results) == 2 * len(data)  # each node gets the others' shares
    for gw in nodes:
        misses = gw.admin("GET", "/tiers").json()["cache_misses"]
        client = make_client(gw.endpoint)
        for key, body in data.items():
            assert client.get_object(Bucket="coop", Key=key)["Body"].read() == body
        assert gw.admin("GET", "/tiers").json()["cache_misses"] == misses  # all served hot

    # A peer that is not running: its share comes from the store at once.
    for gw in nodes:
        gw.evict()
    absent = {"n1": nodes[0].endpoint, "gone": f"http://127.0.0.1:{free_port()}"}
    started = time.monotonic()
    results = warm_everywhere(nodes[:1], {"bucket": "coop", "prefix": "shard/", "peers": absent, "peer_wait": 600})
    assert results[0]["hot_objects"] == len(data) and results[0]["peer_fallbacks"] > 0
    assert results[0]["requests"] == len(segments)
    assert results[0]["peer_requests"] == 1  # refused once, then left alone (not once per extent)
    assert time.monotonic() - started < 300  # not the peer_wait: a refused connection is not waited for


def _count_is(client: Any, bucket: str, count: int) -> None:
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == count


def _segments_of(gw: Gateway, bucket: str) -> set[str]:
    keys = [o["Key"] for o in make_client(gw.endpoint).list_objects_v2(Bucket=bucket)["Contents"]]
    where = [gw.admin("GET", f"/objects/{bucket}/{key}").json() for key in keys]
    return {chunk["segment"] for w in where for chunk in w["chunks"] if chunk.get("segment")}


def test_a_read_miss_asks_the_segment_owner_so_the_store_is_read_once(
    moto_endpoint: str, tmp_path: Path
) -> None:
    """With --peers, a GET that misses asks the node that owns the segment,
    which reads the store for everyone: after n2 and then n3 read the whole
    set, every extent was read from the store once, and n3 read none."""
    capacity = capacity_bucket(moto_endpoint)
    free = iter(free_ports(6))
    ports = {name: (next(free), next(free)) for name in ("p1", "p2", "p3")}
    peers = ",".join(f"{name}=http://127.0.0.1:{s3}" for name, (s3, _) in ports.items())
    gws = []
    try:
        for name in ports:
            gw = node(tmp_path, name, capacity)
            gw.extra_args += ["--peers", peers]
            gws.append(gw.start(ports[name]))
        s3 = make_client(gws[0].endpoint)
        s3.create_bucket(Bucket="miss")
        data = {}
        for i in range(24):
            data[f"k{i:02d}"] = os.urandom(50_000 + i)
            s3.put_object(Bucket="miss", Key=f"k{i:02d}", Body=data[f"k{i:02d}"])
            if i % 6 == 5:
                gws[0].flush()  # four segments
        for gw in gws[1:]:
            eventually(lambda gw=gw: _count_is(make_client(gw.endpoint), "miss", len(data)))
        for gw in gws:
            gw.evict()
        def store_reads() -> list[int]:
            """Per node, the misses it read from the store (not from a peer)."""
            status = [gw.admin("GET", "/tiers").json() for gw in gws]
            return [s["cache_misses"] - s["peer_reads"] for s in status]

        def read_all(gw: Gateway) -> None:
            client = make_client(gw.endpoint)
            for key, body in data.items():
                assert client.get_object(Bucket="miss", Key=key)["Body"].read() == body

        start = store_reads()
        peers_before = gws[1].admin("GET", "/tiers").json()["peer_reads"]
        read_all(gws[1])  # n2: its own segments from the store, the others' through their owners
        middle = store_reads()
        assert sum(middle) - sum(start) == len(data)  # every extent once, each by its segment's owner
        assert gws[1].admin("GET", "/tiers").json()["peer_reads"] > peers_before
        read_all(gws[2])  # n3: all hot somewhere already
        assert store_reads() == middle
    finally:
        for gw in gws:
            gw.stop()


def test_sigkill_of_a_writer_another_node_takes_over_and_nothing_acknowledged_is_lost(
    nodes: list[Gateway],
) -> None:
    writer, promoted, other = nodes
    s3 = make_client(writer.endpoint)
    s3.create_bucket(Bucket="durable")
    writer.admin("PATCH", "/buckets/durable", json={"write_through": True})  # acknowledged once in a segment
    acked = {}
    for i in range(30):
        body = f"acknowledged {i}".encode() * 50
        s3.put_object(Bucket="durable", Key=f"k{i:02d}", Body=body)
        acked[f"k{i:02d}"] = body
    writer.stop(signal.SIGKILL)
    killed = time.monotonic()
    fresh = make_client(promoted.endpoint)
    eventually(lambda: fresh.head_bucket(Bucket="durable"))

    # Until the dead writer's lease runs out, the bucket's writes are refused
    # and name it; then the first write through another node takes it over.
    with pytest.raises(ClientError) as refused:
        fresh.put_object(Bucket="durable", Key="early", Body=b"x")
    assert refused.value.response["Error"]["Writer"] == "n1"
    eventually(lambda: fresh.put_object(Bucket="durable", Key="after", Body=b"after the takeover"),
               timeout=LEASE_TTL * 1.25 + BOUND)
    took = time.monotonic() - killed
    assert cluster(promoted)["writing"] == ["durable", "second"]
    for gw in (promoted, other):
        client = make_client(gw.endpoint)
        for key, body in acked.items():
            assert eventually(lambda: client.get_object(Bucket="durable", Key=key)["Body"].read()) == body

    # The third node follows the new writer and names it.
    reader = make_client(other.endpoint)
    assert eventually(lambda: reader.get_object(Bucket="durable", Key="after")["Body"].read()) == b"after the takeover"
    with pytest.raises(ClientError) as refused:
        reader.put_object(Bucket="durable", Key="x", Body=b"x")
    assert refused.value.response["Error"]["Writer"] == promoted.data_dir.name

    # The killed node comes back, follows the new writer, and writes
    # "durable" no more.
    writer.start()
    assert "durable" not in cluster(writer)["writing"]
    back = make_client(writer.endpoint)
    assert eventually(lambda: back.get_object(Bucket="durable", Key="after")["Body"].read()) == b"after the takeover"
    assert took < LEASE_TTL * 1.25 + BOUND


def test_an_idle_bucket_moves_to_the_node_written_through_next(moto_endpoint: str, tmp_path: Path) -> None:
    """With --lease-idle, a writer gives up a bucket nothing was written to
    for that long (once flushed), and the next write through another node
    takes it at once instead of being refused."""
    capacity = capacity_bucket(moto_endpoint)
    gws = []
    try:
        for name in ("i1", "i2"):
            gw = node(tmp_path, name, capacity)
            gw.extra_args += ["--lease-idle", "1"]
            gws.append(gw.start())
        first, second = (make_client(gw.endpoint) for gw in gws)
        first.create_bucket(Bucket="moving")
        first.put_object(Bucket="moving", Key="one", Body=b"through i1")
        eventually(lambda: second.head_bucket(Bucket="moving"))
        eventually(lambda: _writes(gws[0], []))  # flushed, idle, given up
        second.put_object(Bucket="moving", Key="two", Body=b"through i2")  # no 405, no wait
        assert cluster(gws[1])["writing"] == ["moving"]
        assert eventually(lambda: first.get_object(Bucket="moving", Key="two")["Body"].read()) == b"through i2"
        assert second.get_object(Bucket="moving", Key="one")["Body"].read() == b"through i1"
    finally:
        for gw in gws:
            gw.stop()


def _writes(gw: Gateway, buckets: list[str]) -> None:
    assert cluster(gw)["writing"] == buckets
