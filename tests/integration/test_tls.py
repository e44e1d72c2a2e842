"""TLS on both ports, with a CA made by the test (tests/tls.py).

Real clients verify the gateway's certificate against that CA: boto3,
s3fs, the AWS CLI, the admin CLI and httpx; one that trusts another CA is
refused, and plain HTTP to either TLS port is refused without an answer,
a traceback or the gateway going down. Read workers serve TLS on the S3
port, and gateways that are peers of each other read from each other over
https, trusting --tls-ca.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
import s3fs
from botocore.config import Config as BotoConfig
from botocore.exceptions import SSLError

from gateway.observability.accesslog import FLUSH_SECONDS
from tests.conftest import assert_consistent
from tests.integration.conftest import clean_env
from tests.integration.helpers import wait_until
from tests.integration.test_scale_out import capacity_bucket, eventually, node
from tests.servers import ACCESS_KEY, ADMIN_TOKEN, SECRET_KEY, Gateway, free_ports
from tests.tls import Pki, make_pki
from tiering.cluster.peers import owner

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_env(pki: Pki) -> dict[str, str]:
    return {"TIERSTORE_TLS_CERT": str(pki.cert), "TIERSTORE_TLS_KEY": str(pki.key),
            "TIERSTORE_TLS_CA": str(pki.ca)}


@pytest.fixture(scope="module")
def gw(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = Gateway(tmp_path_factory.mktemp("tls") / "data", extra_env=tls_env(pki), ca=pki.ca).start()
    try:
        yield gateway
    finally:
        gateway.stop()
    assert_consistent(gateway)


def trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def client(endpoint: str, verify: str | bool):
    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1", verify=verify, config=BotoConfig(retries={"max_attempts": 1}),
    )


def test_boto3_and_the_admin_api_over_tls(gw: Gateway, pki: Pki) -> None:
    assert gw.endpoint.startswith("https://")
    s3 = client(gw.endpoint, str(pki.ca))
    s3.create_bucket(Bucket="tls-boto3")
    body = os.urandom(300_000)
    s3.put_object(Bucket="tls-boto3", Key="k", Body=body)
    assert s3.get_object(Bucket="tls-boto3", Key="k")["Body"].read() == body
    assert s3.get_object(Bucket="tls-boto3", Key="k", Range="bytes=10-19")["Body"].read() == body[10:20]
    upload = s3.create_multipart_upload(Bucket="tls-boto3", Key="multi")["UploadId"]
    part = s3.upload_part(Bucket="tls-boto3", Key="multi", UploadId=upload, PartNumber=1, Body=body)
    done = s3.complete_multipart_upload(Bucket="tls-boto3", Key="multi", UploadId=upload,
                                        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert done["Location"] == f"https://127.0.0.1:{gw.port}/tls-boto3/multi"  # the scheme it was reached by
    assert httpx.get(f"{gw.admin_url}/health", verify=trusting(pki.ca)).status_code == 200
    assert gw.flush()["hot_staged"] == 0  # the admin API, with the token, over TLS
    assert "https://127.0.0.1" in gw.log()  # the banner says how to reach it


def test_s3fs_over_tls(gw: Gateway, pki: Pki) -> None:
    fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=gw.endpoint,
                           client_kwargs={"verify": str(pki.ca)}, use_listings_cache=False)
    fs.mkdir("tls-s3fs")
    with fs.open("tls-s3fs/a/b.bin", "wb") as f:
        f.write(b"x" * 70_000)
    assert fs.cat("tls-s3fs/a/b.bin") == b"x" * 70_000
    assert fs.ls("tls-s3fs/a") == ["tls-s3fs/a/b.bin"]


def test_a_client_that_trusts_another_ca_is_refused(gw: Gateway, pki: Pki) -> None:
    with pytest.raises(SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        client(gw.endpoint, str(pki.other_ca)).list_buckets()
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{gw.admin_url}/health", verify=trusting(pki.other_ca))


def _plain_http(port: int) -> bytes:
    """What a plain-HTTP client reads back from ``port``: everything until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
        return received


@pytest.mark.parametrize("port", ["S3", "admin"])
def test_plain_http_to_a_tls_port_is_refused_cleanly(gw: Gateway, pki: Pki, port: str) -> None:
    number = gw.port if port == "S3" else gw.admin_port
    time.sleep(3 * FLUSH_SECONDS)  # earlier requests' access-log lines are out
    logged = len(gw.log())
    for _ in range(20):
        answer = _plain_http(number)
        assert b"HTTP/" not in answer  # closed (at most a TLS alert), never served in the clear
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{number}/health", timeout=10)
    # Still serving (one access-log line for the GET below), and nothing
    # logged for the refusals: no traceback, no spam.
    assert client(gw.endpoint, str(pki.ca)).list_buckets()["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert httpx.get(f"{gw.admin_url}/health", verify=trusting(pki.ca)).status_code == 200
    wait_until(lambda: "op=ListBuckets" in gw.log()[logged:], "the access-log line (written in batches)", 10)
    (line,) = gw.log()[logged:].splitlines()
    assert "op=ListBuckets" in line and "status=200" in line


def _cli_env(home: Path, **extra: str) -> dict[str, str]:
    return clean_env(home, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra)


def test_tierstore_env_exports_the_ca_for_the_aws_cli_boto3_and_the_admin_cli(
    gw: Gateway, pki: Pki, tmp_path: Path
) -> None:
    env = _cli_env(tmp_path, **tls_env(pki), TIERSTORE_PORT=str(gw.port), TIERSTORE_ADMIN_PORT=str(gw.admin_port),
                   TIERSTORE_ACCESS_KEY=ACCESS_KEY, TIERSTORE_SECRET_KEY=SECRET_KEY,
                   TIERSTORE_ADMIN_TOKEN=ADMIN_TOKEN)
    script = """
        set -euo pipefail
        eval "$(tierstore env)"
        env -u TIERSTORE_TLS_CERT -u TIERSTORE_TLS_KEY -u TIERSTORE_PORT -u TIERSTORE_ADMIN_PORT bash -c '
            echo "$AWS_ENDPOINT_URL $TIERSTORE_ADMIN_URL"
            aws s3 mb s3://tls-env
            echo hello > hello.txt
            aws s3 cp hello.txt s3://tls-env/greeting.txt
            python -c "import boto3; print(boto3.client(\\"s3\\").get_object(Bucket=\\"tls-env\\", Key=\\"greeting.txt\\")[\\"Body\\"].read().decode())"
            tierstore status --json > /dev/null && echo status ok'
    """
    done = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"https://127.0.0.1:{gw.port} https://127.0.0.1:{gw.admin_port}"
    assert "hello" in lines and lines[-1] == "status ok"


def test_the_cli_names_the_ca_when_it_cannot_verify_the_gateway(gw: Gateway, pki: Pki, tmp_path: Path) -> None:
    env = _cli_env(tmp_path, TIERSTORE_ADMIN_URL=gw.admin_url, TIERSTORE_ADMIN_TOKEN=ADMIN_TOKEN,
                   TIERSTORE_TLS_CA=str(pki.other_ca))
    done = subprocess.run([str(BIN / "tierstore"), "status"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "certificate verify failed" in done.stderr and "TIERSTORE_TLS_CA" in done.stderr


def test_read_workers_serve_tls(pki: Pki, tmp_path: Path) -> None:
    gateway = Gateway(tmp_path / "data", extra_args=["--workers", "2"], extra_env=tls_env(pki), ca=pki.ca).start()
    try:
        s3 = client(gateway.endpoint, str(pki.ca))
        s3.create_bucket(Bucket="tls-workers")  # passed on to the writer
        for i in range(8):
            s3.put_object(Bucket="tls-workers", Key=f"k{i}", Body=b"%d" % i * 1000)
        for _ in range(3):  # hot GETs, served by the workers on fresh connections
            fresh = client(gateway.endpoint, str(pki.ca))
            assert [fresh.get_object(Bucket="tls-workers", Key=f"k{i}")["Body"].read() for i in range(8)] == [
                b"%d" % i * 1000 for i in range(8)]
        assert b"HTTP/" not in _plain_http(gateway.port)
    finally:
        gateway.stop()
    assert_consistent(gateway)


@pytest.mark.parametrize("trusted", [True, False])
def test_peers_read_from_each_other_over_https(
    moto_endpoint: str, pki: Pki, tmp_path: Path, trusted: bool
) -> None:
    """Two nodes, each the other's peer at an https URL: with --tls-ca
    trusting their certificate, a read miss on n2 of a segment n1 owns is
    served by n1; with a CA that does not, n2 refuses n1's certificate and
    reads the store instead. The data is right either way."""
    capacity = capacity_bucket(moto_endpoint)
    free = iter(free_ports(4))
    ports = {name: (next(free), next(free)) for name in ("n1", "n2")}
    peers = ",".join(f"{name}=https://127.0.0.1:{s3}" for name, (s3, _) in ports.items())
    ca = pki.ca if trusted else pki.other_ca
    nodes = []
    try:
        for name in ports:
            gw = node(tmp_path, name, capacity)
            gw.ca = pki.ca
            # Untrusted, the writer's notices fail too: the reader follows at its fallback reads.
            gw.extra_args += ["--peers", peers, "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
                              "--tls-ca", str(ca), "--follow-fallback", "1"]
            nodes.append(gw.start(ports[name]))
        writer = client(nodes[0].endpoint, str(pki.ca))
        writer.create_bucket(Bucket="peers")
        data = {f"k{i:02d}": os.urandom(40_000 + i) for i in range(24)}
        for i, (key, body) in enumerate(data.items()):
            writer.put_object(Bucket="peers", Key=key, Body=body)
            if i % 4 == 3:
                nodes[0].flush()  # six segments of four objects
        reader = client(nodes[1].endpoint, str(pki.ca))
        eventually(lambda: _count_is(reader, "peers", len(data)))
        chunks = [nodes[0].admin("GET", f"/objects/peers/{key}").json()["chunks"][0] for key in data]
        # Each extent's owner (tiering/cluster/peers.py: rendezvous on its cache name).
        places = [f"{c['segment']}-{c['offset']:x}-{c['stored']:x}" for c in chunks]
        from_n1 = sum(owner(place, ["n1", "n2"]) == "n1" for place in places)
        nodes[1].evict()
        before = nodes[1].admin("GET", "/tiers").json()["peer_reads"]
        for key, body in data.items():
            assert reader.get_object(Bucket="peers", Key=key)["Body"].read() == body
        peer_reads = nodes[1].admin("GET", "/tiers").json()["peer_reads"] - before
        # n1 owns from_n1 of the extents; n2 owns the rest, but new to the cluster
        # (its handover window) asks their previous owner, n1, first: n1 holds them all.
        assert 0 < from_n1 < len(data)
        assert peer_reads == (len(data) if trusted else 0)
    finally:
        for gw in nodes:
            gw.stop()


def _count_is(s3, bucket: str, count: int) -> None:
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == count


def test_a_stop_does_not_wait_for_idle_kept_alive_clients(pki: Pki, tmp_path: Path) -> None:
    """Over TLS a close waits for the client's close_notify, which an idle
    pooled client never sends: the gateway drops idle connections at a
    stop instead of waiting asyncio's 30 s TLS shutdown timeout for each."""
    gateway = Gateway(tmp_path / "data", extra_env=tls_env(pki), ca=pki.ca).start()
    kept = client(gateway.endpoint, str(pki.ca))
    kept.list_buckets()  # its connection stays in the pool, idle
    assert gateway.proc is not None
    gateway.proc.terminate()
    assert gateway.proc.wait(timeout=20) == 0  # not the 30 s timeout, not killed
    gateway.proc = None
    assert_consistent(gateway)
