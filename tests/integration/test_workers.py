"""`serve --workers 3`: three read workers on the S3 port, the writer behind them.

Every check opens a new connection, so the kernel spreads them over the
three workers; the workers' CPU time is checked to grow."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path

import pytest
import s3fs
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from gateway.workers.worker import REPORT_EVERY
from tests.conftest import make_client, running_gateway
from tests.integration.helpers import wait_until
from tests.integration.oracle import RawReader
from tests.integration.s3raw import Sender, check_error
from tests.servers import ACCESS_KEY, SECRET_KEY, Gateway, children
from tiering.cluster.peers import FETCH, HOT, PEER_HEADER

WORKERS = 3
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("workers") / "data", "--workers", str(WORKERS)) as g:
        wait_for(lambda: len(children(g.proc.pid)) == WORKERS)
        yield g


def fresh(gw: Gateway) -> RawReader:
    """A signed client whose next request opens a new connection."""
    return RawReader(gw)


def writer_and_workers_cpu(gw: Gateway) -> tuple[float, float]:
    return cpu_seconds(gw.proc.pid), sum(cpu_seconds(pid) for pid in children(gw.proc.pid))


def assert_served_by_workers(gw: Gateway, before: tuple[float, float]) -> None:
    """Hot GETs since ``before`` were answered by the workers, not passed
    on: a lookup costs the writer less than the GET costs a worker, and a
    GET passed on would cost the writer more than the worker. (CPU time
    comes in ticks of 10 ms and the writer has its own background work:
    no wider margin than that holds on a loaded machine.)"""
    writer, workers = (now - then for now, then in zip(writer_and_workers_cpu(gw), before, strict=True))
    assert workers > writer, f"writer {writer:.2f} s, workers {workers:.2f} s of CPU"


def settled_gets(gw: Gateway) -> dict[str, int]:
    """The GetObject figures of /stats once the workers' reports of earlier
    requests are in: unchanged over two report periods."""
    last = gw.admin("GET", "/stats").json()["requests"].get("GetObject", {})
    while True:
        time.sleep(2 * REPORT_EVERY)
        now = gw.admin("GET", "/stats").json()["requests"].get("GetObject", {})
        if now == last:
            return now
        last = now


def test_every_read_sees_the_last_acknowledged_write(gw: Gateway) -> None:
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="raw")
    before = writer_and_workers_cpu(gw)[1]
    for i in range(150):
        key = f"k{i % 7}"
        body = os.urandom(100 + i)
        status, _, _ = fresh(gw).put("raw", key, body)
        assert status == 200
        status, got = fresh(gw).get("raw", key)
        assert (status, got) == (200, body), i
        status, headers, _ = fresh(gw).request("HEAD", "raw", key)
        assert status == 200 and headers["etag"] == f'"{hashlib.md5(body).hexdigest()}"'
        if i % 10 == 9:
            s3.delete_object(Bucket="raw", Key=key)
            assert fresh(gw).get("raw", key)[0] == 404
    assert writer_and_workers_cpu(gw)[1] - before > 0.2
    # PUTs and DELETEs were passed to the writer, which logs the client's
    # address (lines are written in batches: at most 0.1 s late).
    def puts() -> list[str]:
        return [line for line in gw.log().splitlines() if "op=PutObject bucket=raw " in line]

    wait_until(lambda: len(puts()) >= 150, "every PUT in the access log", timeout=10)
    assert all(" remote=127.0.0.1 " in line for line in puts())
    status, _, _ = fresh(gw).request("PUT", "raw", "spoof", b"x", headers={"x-tierstore-client": "6.6.6.6"})
    assert status == 200
    assert "6.6.6.6" not in gw.log()
    gw.flush()  # not during the reads below: the writer's CPU is then its lookups
    hot = writer_and_workers_cpu(gw)
    for _ in range(300):
        assert fresh(gw).get("raw", "k0")[0] in (200, 404)
    assert_served_by_workers(gw, hot)


def test_large_objects_ranges_and_conditions(gw: Gateway) -> None:
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="large")
    data = os.urandom(9 * 1024 * 1024 + 17)
    s3.upload_fileobj(__import__("io").BytesIO(data), "large", "big")  # multipart, passed on
    etag = s3.head_object(Bucket="large", Key="big")["ETag"]
    before = writer_and_workers_cpu(gw)
    for _ in range(6):
        c = make_client(gw.endpoint)
        assert c.get_object(Bucket="large", Key="big")["Body"].read() == data
        got = c.get_object(Bucket="large", Key="big", Range="bytes=5000000-9000000")["Body"].read()
        assert got == data[5_000_000:9_000_001]
        assert c.get_object(Bucket="large", Key="big", PartNumber=1)["ContentLength"] == 8 * 1024 * 1024
        with pytest.raises(ClientError) as caught:
            c.get_object(Bucket="large", Key="big", IfNoneMatch=etag)
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
        with pytest.raises(ClientError) as caught:
            c.get_object(Bucket="large", Key="big", IfMatch='"0000"')
        assert caught.value.response["Error"]["Code"] == "PreconditionFailed"
    # Whole, ranged, part and conditional GETs of a multipart object, streamed by the workers.
    assert_served_by_workers(gw, before)


def test_errors_are_s3_errors_on_every_process(gw: Gateway) -> None:
    make_client(gw.endpoint).create_bucket(Bucket="errs")
    for _ in range(12):
        c = make_client(gw.endpoint)
        with pytest.raises(ClientError) as caught:
            c.get_object(Bucket="errs", Key="absent")
        assert caught.value.response["Error"]["Code"] == "NoSuchKey"
        with pytest.raises(ClientError) as caught:
            c.get_object(Bucket="no-such-bucket-here", Key="k")
        assert caught.value.response["Error"]["Code"] == "NoSuchBucket"
        conn = HTTPConnection("127.0.0.1", gw.port, timeout=10)  # unsigned
        conn.request("GET", "/errs/absent")
        response = conn.getresponse()
        assert response.status == 403 and b"<Code>AccessDenied</Code>" in response.read()
        conn.close()
    for _ in range(6):
        bad = make_client(gw.endpoint)
        bad._request_signer._credentials.secret_key = "wrong"
        with pytest.raises(ClientError) as caught:
            bad.get_object(Bucket="errs", Key="absent")
        assert caught.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_misses_are_passed_to_the_writer_and_hits_counted(gw: Gateway) -> None:
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="tiers")
    blobs = {f"o{i}": os.urandom(70_000) for i in range(20)}
    for key, body in blobs.items():
        s3.put_object(Bucket="tiers", Key=key, Body=body)
    gw.flush()
    gw.evict()
    for key, body in blobs.items():  # cold: the workers pass them to the writer, which fetches
        assert fresh(gw).get("tiers", key) == (200, body)
    hits = gw.admin("GET", "/tiers").json()["cache_hits"]
    served = settled_gets(gw)
    for _ in range(3):
        for key, body in blobs.items():  # hot now, wherever they land
            assert fresh(gw).get("tiers", key) == (200, body)
    # Hits the workers answer from lookups they kept are reported a moment later.
    wait_for(lambda: gw.admin("GET", "/tiers").json()["cache_hits"] - hits == 60, timeout=10)
    assert gw.admin("GET", "/tiers").json()["cache_hits"] - hits == 60

    def counted() -> bool:  # the workers report what they served about once a second
        now = gw.admin("GET", "/stats").json()["requests"]["GetObject"]
        return (now["count"] - served["count"], now["bytes_out"] - served["bytes_out"]) == (60, 60 * 70_000)

    wait_for(counted, timeout=10)


def test_s3fs_reads_through_the_workers(gw: Gateway) -> None:
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="fsspec")
    data = os.urandom(3 * 1024 * 1024)
    s3.put_object(Bucket="fsspec", Key="d/blob", Body=data)
    fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=gw.endpoint,
                           skip_instance_cache=True, client_kwargs={"region_name": "us-east-1"})
    before = writer_and_workers_cpu(gw)
    for _ in range(10):
        assert fs.cat_file("fsspec/d/blob") == data
        assert fs.cat_file("fsspec/d/blob", start=1000, end=2_000_000) == data[1000:2_000_000]
    assert_served_by_workers(gw, before)
    assert fs.ls("fsspec/d") == ["fsspec/d/blob"]


def test_a_killed_worker_is_replaced(gw: Gateway) -> None:
    victim = children(gw.proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: victim not in children(gw.proc.pid) and len(children(gw.proc.pid)) == WORKERS)
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="after")
    for i in range(20):
        fresh(gw).put("after", "k", b"v%d" % i)
        assert fresh(gw).get("after", "k") == (200, b"v%d" % i)
    assert "read worker 1 (pid" in gw.log() or "read worker 2 (pid" in gw.log()


def test_workers_end_with_the_writer(tmp_path: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        g = Gateway(tmp_path / f"data-{sig}", extra_args=["--workers", "2"]).start()
        try:
            wait_for(lambda: len(children(g.proc.pid)) == 2)
            workers = children(g.proc.pid)
            conn = HTTPConnection("127.0.0.1", g.port, timeout=10)
            conn.request("GET", "/")
            assert conn.getresponse().status == 403  # anonymous: refused, by whichever process
            conn.close()
        finally:
            g.stop(sig)
        # SIGTERM: stopped by the writer; SIGKILL: the worker sees the lookup socket close.
        wait_for(lambda: not any(alive(w) for w in workers), timeout=20)


def _raw_exchange(port: int, request: bytes, wait: float = 15.0) -> tuple[bytes, float]:
    """Send ``request`` and read until the server closes: (answer, seconds)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request)
        sock.settimeout(wait)
        start, answer = time.monotonic(), b""
        with contextlib.suppress(TimeoutError):
            while chunk := sock.recv(65536):
                answer += chunk
        return answer, time.monotonic() - start


def test_bodies_refused_or_stalled_through_a_worker(tmp_path: Path) -> None:
    """A PUT a worker passes on: refused before its body (unsigned) or with
    its body stalled past --client-timeout, the client gets S3's answer and
    the connection is closed, as from a single process."""
    with running_gateway(tmp_path / "data", "--workers", "2", "--client-timeout", "2") as g:
        wait_for(lambda: len(children(g.proc.pid)) == 2)
        make_client(g.endpoint).create_bucket(Bucket="stall")
        head = f"PUT /stall/k HTTP/1.1\r\nHost: 127.0.0.1:{g.port}\r\nContent-Length: 1000\r\n"
        answer, seconds = _raw_exchange(g.port, (head + "\r\n").encode() + b"0123456789")
        assert answer.startswith(b"HTTP/1.1 403 ") and b"<Code>AccessDenied</Code>" in answer
        assert seconds < 10  # closed, not left open

        request = AWSRequest(method="PUT", url=f"{g.endpoint}/stall/k",
                             headers={"Content-Length": "1000", "x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
        S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(request)
        signed = head + "".join(f"{k}: {v}\r\n" for k, v in request.headers.items() if k != "Content-Length")
        answer, seconds = _raw_exchange(g.port, (signed + "\r\n").encode() + b"0123456789")
        assert answer.startswith(b"HTTP/1.1 400 ") and b"<Code>RequestTimeout</Code>" in answer
        assert seconds < 10
        assert make_client(g.endpoint).list_objects_v2(Bucket="stall")["KeyCount"] == 0


def test_another_gateways_request_is_answered_by_the_writer(gw: Gateway) -> None:
    """A peer's GET (x-tierstore-peer, tiering/cluster/peers.py) passes through a
    worker to the writer, which alone answers it: 503 while the object is
    not hot (with "hot"), the bytes once it is; a large object too."""
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="peered")
    small, large = os.urandom(40_000), os.urandom(3 * 1024 * 1024)
    s3.put_object(Bucket="peered", Key="small", Body=small)
    s3.put_object(Bucket="peered", Key="large", Body=large)
    gw.flush()
    gw.evict()
    def peer_get(path: str, headers: dict[str, str]):  # on a new connection: any worker may take it
        raw = Sender(gw)
        try:
            return raw.signed("GET", path, headers)
        finally:
            raw.close()

    for _ in range(2 * WORKERS):
        check_error(peer_get("/peered/small", {PEER_HEADER: HOT}), 503, "ServiceUnavailable")
        check_error(peer_get("/peered/large", {PEER_HEADER: HOT}), 503, "ServiceUnavailable")
    fetched = peer_get("/peered/large", {PEER_HEADER: FETCH})  # reads through: now hot
    assert fetched.status_code == 200 and fetched.content == large
    assert fresh(gw).get("peered", "small") == (200, small)  # a client's read: hot now too
    for _ in range(2 * WORKERS):
        hot = peer_get("/peered/large", {PEER_HEADER: HOT, "Range": "bytes=1048576-2097151"})
        assert hot.status_code == 206 and hot.content == large[1048576:2097152]
        assert peer_get("/peered/small", {PEER_HEADER: HOT}).content == small


def test_hot_objects_of_a_mounted_bucket_are_served_by_the_workers(gw: Gateway, moto_endpoint: str) -> None:
    import boto3

    source = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    source.create_bucket(Bucket="workers-src")
    data = os.urandom(64 * 1024)
    source.put_object(Bucket="workers-src", Key="train/0", Body=data)
    mounted = gw.admin("POST", "/mounts", json={
        "name": "workers-mnt", "source": "s3://workers-src", "endpoint": moto_endpoint,
        "access_key": "testing", "secret_key": "testing", "freshness": "immutable"})
    assert mounted.status_code == 201, mounted.text
    s3 = make_client(gw.endpoint)
    assert s3.get_object(Bucket="workers-mnt", Key="train/0")["Body"].read() == data  # cold: the writer
    before = writer_and_workers_cpu(gw)
    reader = fresh(gw)
    for _ in range(600):  # enough CPU ticks on both sides to compare
        assert reader.get("workers-mnt", "train/0") == (200, data)
    assert s3.get_object(Bucket="workers-mnt", Key="train/0", Range="bytes=10-19")["Body"].read() == data[10:20]
    assert_served_by_workers(gw, before)


def worker_reads(gw: Gateway) -> dict[str, int]:
    return gw.admin("GET", "/stats").json()["worker_reads"]


def test_workers_answer_repeated_reads_from_the_lookups_they_kept(gw: Gateway) -> None:
    """Once a worker has looked an object up, its next GETs of it need no
    lookup; the writer still counts every hit and moves the epoch readers."""
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="kept")
    data = {f"k{i}": os.urandom(20_000) for i in range(30)}
    for key, body in data.items():
        s3.put_object(Bucket="kept", Key=key, Body=body)
    # Flushed now, not 5 s after the PUTs: a flush in the middle of the test
    # rewrites every record, and the kept answers rightly end with it.
    gw.flush()
    reader = RawReader(gw)  # one connection: one worker, which looks every key up
    for key in data:
        assert reader.get("kept", key)[0] == 200
    before, hits = worker_reads(gw), gw.admin("GET", "/tiers").json()["cache_hits"]
    epoch = gw.admin("POST", "/epochs", json={"bucket": "kept", "keys": list(data)}).json()
    for key, body in data.items():
        assert reader.get("kept", key) == (200, body)
    wait_for(lambda: gw.admin("GET", f"/epochs/{epoch['id']}").json()["consumed"] == 30, timeout=10)
    status = gw.admin("GET", f"/epochs/{epoch['id']}").json()
    assert (status["state"], status["hits"]) == ("finished", 30), status
    wait_for(lambda: worker_reads(gw)["kept"] - before["kept"] == 30, timeout=10)
    assert worker_reads(gw)["lookup"] == before["lookup"]
    assert gw.admin("GET", "/tiers").json()["cache_hits"] - hits == 30
    metrics = gw.admin("GET", "/metrics").text
    assert 'tierstore_worker_reads_total{answer="kept"}' in metrics


def test_a_kept_lookup_never_outlives_a_write_a_flush_or_an_eviction(gw: Gateway) -> None:
    """Every worker keeps the object's lookup; then each change of it (a new
    body, a flush that moves it into a segment, an eviction, a delete) is
    seen by every GET after it is acknowledged, on whichever worker."""
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="churn")

    def every_worker_reads(expected: tuple[int, bytes]) -> None:
        for _ in range(6 * WORKERS):  # new connections: spread over the workers
            assert fresh(gw).get("churn", "obj") == expected

    for round_ in range(3):
        body = os.urandom(30_000 + round_)
        assert fresh(gw).put("churn", "obj", body)[0] == 200
        every_worker_reads((200, body))
        kept = worker_reads(gw)["kept"]
        every_worker_reads((200, body))
        wait_for(lambda kept=kept: worker_reads(gw)["kept"] > kept, timeout=10)  # kept answers were used
        gw.flush()  # the staged file is renamed into a segment's cached extent
        every_worker_reads((200, body))
        gw.evict()  # the extent's file is gone: passed to the writer, which fetches it again
        every_worker_reads((200, body))
    s3.delete_object(Bucket="churn", Key="obj")
    for _ in range(6 * WORKERS):
        assert fresh(gw).get("churn", "obj")[0] == 404


def test_a_kept_mounted_lookup_ends_with_its_validation(gw: Gateway, moto_endpoint: str) -> None:
    """A worker keeps a mounted object's lookup no longer than the mount's
    freshness: a change at the source is seen once a validation expires."""
    import boto3

    source = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    source.create_bucket(Bucket="fresh-src")
    first, second = os.urandom(10_000), os.urandom(10_000)
    source.put_object(Bucket="fresh-src", Key="obj", Body=first)
    mounted = gw.admin("POST", "/mounts", json={
        "name": "fresh-mnt", "source": "s3://fresh-src", "endpoint": moto_endpoint,
        "access_key": "testing", "secret_key": "testing", "freshness": 1})
    assert mounted.status_code == 201, mounted.text
    reader = RawReader(gw)
    for _ in range(20):  # looked up, then kept, by this connection's worker
        assert reader.get("fresh-mnt", "obj") == (200, first)
    source.put_object(Bucket="fresh-src", Key="obj", Body=second)
    wait_for(lambda: reader.get("fresh-mnt", "obj") == (200, second), timeout=15)


def test_workers_authorise_users_and_learn_a_change_at_once(gw: Gateway, moto_endpoint: str) -> None:
    """A user's hot GETs are authorised and served by the workers; a
    revoked key and a disabled user are refused by every process within
    1 s (the writer pushes each change to the workers); a mounted bucket is
    held to the same policies."""
    import boto3

    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="w-users")
    data = os.urandom(32 * 1024)
    s3.put_object(Bucket="w-users", Key="k", Body=data)
    source = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    source.create_bucket(Bucket="w-users-src")
    source.put_object(Bucket="w-users-src", Key="m", Body=b"mounted")
    assert gw.admin("POST", "/mounts", json={
        "name": "w-users-mnt", "source": "s3://w-users-src", "endpoint": moto_endpoint,
        "access_key": "testing", "secret_key": "testing", "freshness": "immutable"}).status_code == 201
    key = gw.admin("POST", "/users", json={"name": "w-reader", "policies": ["read-only:w-users"]}).json()["key"]
    reader = RawReader(gw, access_key=key["access_key"], secret_key=key["secret_key"])

    assert reader.get("w-users", "k") == (200, data)
    before = writer_and_workers_cpu(gw)
    for _ in range(600):  # on one connection: one worker's, and enough CPU ticks to compare
        assert reader.get("w-users", "k") == (200, data)
    assert_served_by_workers(gw, before)
    assert reader.get("w-users-mnt", "m")[0] == 403  # not in the user's policy
    assert reader.request("PUT", "w-users", "k", b"x")[0] == 403
    gw.admin("PUT", "/users/w-reader/policies/read-only:w-users-mnt")
    assert reader.get("w-users-mnt", "m") == (200, b"mounted")

    def refused_everywhere() -> bool:  # new connections: the kernel spreads them over the workers
        return all(RawReader(gw, access_key=key["access_key"], secret_key=key["secret_key"]).get(
            "w-users", "k")[0] == 403 for _ in range(2 * WORKERS))

    gw.admin("PATCH", "/users/w-reader", json={"enabled": False})
    wait_for(refused_everywhere, timeout=1.0)
    gw.admin("PATCH", "/users/w-reader", json={"enabled": True})
    wait_for(lambda: reader.get("w-users", "k") == (200, data), timeout=1.0)
    gw.admin("DELETE", f"/users/w-reader/keys/{key['access_key']}")
    wait_for(refused_everywhere, timeout=1.0)
    gw.admin("DELETE", "/users/w-reader")
