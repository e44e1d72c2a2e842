"""The compose stack's wiring, run without Docker: the image's command with
exactly the environment docker-compose.yml gives the tierstore service (and
the image's ENV under it), in front of a real S3 server standing in for MinIO.

Only what a container changes is changed: the listen addresses are loopback
and the ports free ones (no network namespace here), the data dir is a temp
dir (the /data volume), and http://minio:9000 is the moto server. The bucket
is created the way the minio-init service creates it, and /metrics is called
with the token read the way Prometheus reads it: from the file compose makes
of the tierstore-admin-token secret, named by deploy/prometheus.yml.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import httpx
import pytest
from botocore.exceptions import ClientError
from prometheus_client.parser import text_string_to_metric_families

from gateway.client.sources import env_name
from tests.conftest import assert_consistent, make_client
from tests.integration.helpers import counting_proxy
from tests.servers import ACCESS_KEY, ADMIN_TOKEN, SECRET_KEY, Gateway, free_port, wait_http
from tests.unit.test_packaging import (
    compose,
    environment,
    exec_form,
    image_env,
    prometheus_job,
    secret_of,
)

BIN = Path(sys.executable).parent


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[Any]:
    """A request-counting proxy in front of moto."""
    with counting_proxy(moto_endpoint) as counting:
        yield counting

# What the operator puts in .env; CAPACITY_BUCKET keeps this test's bucket
# apart from other tests' on the shared moto server.
SHELL = {
    "TIERSTORE_ADMIN_TOKEN": ADMIN_TOKEN,
    "TIERSTORE_ACCESS_KEY": ACCESS_KEY,
    "TIERSTORE_SECRET_KEY": SECRET_KEY,
    "CAPACITY_BUCKET": f"compose-{os.getpid()}",
}


def container_env(service: Mapping[str, object], moto_endpoint: str, root: Path) -> dict[str, str]:
    """The image's ENV, the service's environment on top, then what only a
    container provides replaced by its loopback equivalent."""
    env = {**image_env(), **environment(service)}
    assert urlsplit(env[env_name("capacity_endpoint")]).hostname == "minio"
    env.update({
        env_name("host"): "127.0.0.1",
        env_name("admin_host"): "127.0.0.1",
        env_name("port"): str(free_port()),
        env_name("admin_port"): str(free_port()),
        env_name("data_dir"): str(root / "data"),
        env_name("capacity_endpoint"): moto_endpoint,
    })
    return env


def process_env(env: Mapping[str, str], home: Path) -> dict[str, str]:
    """Nothing of this machine's environment but PATH: no AWS_* or
    TIERSTORE_* variable of the caller may help or hide anything."""
    return {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": str(home), **env}


def create_bucket_like_minio_init(services: Mapping[str, dict], endpoint: str) -> str:
    """``mc mb --ignore-existing`` of the bucket in minio-init's command, with
    MinIO's root credentials."""
    script = " ".join(services["minio-init"]["command"])
    bucket = script.rpartition("mc mb --ignore-existing ")[2].split()[0].split("/", 1)[1]
    minio = environment(services["minio"])
    boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=minio["MINIO_ROOT_USER"],
        aws_secret_access_key=minio["MINIO_ROOT_PASSWORD"],
    ).create_bucket(Bucket=bucket)
    return bucket


def token_as_prometheus_reads_it(parsed: Mapping[str, dict], root: Path) -> str:
    """Compose writes the secret's environment variable into a file under
    /run/secrets; Prometheus reads its credentials_file and trims whitespace."""
    grant = secret_of(prometheus_job()["authorization"]["credentials_file"],
                      parsed["services"]["prometheus"])
    secret_file = root / "run-secrets" / grant["source"]
    secret_file.parent.mkdir(exist_ok=True)
    secret_file.write_text(SHELL[parsed["secrets"][grant["source"]]["environment"]])
    return secret_file.read_text().strip()


def healthcheck(env: Mapping[str, str], home: Path) -> int:
    """The image's HEALTHCHECK command, run as Docker runs it: its exit code."""
    probe = subprocess.run(exec_form("HEALTHCHECK"), env=process_env(env, home), timeout=30)
    return probe.returncode


def start(env: Mapping[str, str], root: Path) -> Gateway:
    """ENTRYPOINT + CMD, exactly, with the container's environment."""
    command = exec_form("ENTRYPOINT") + exec_form("CMD")
    gw = Gateway(Path(env[env_name("data_dir")]), port=int(env[env_name("port")]),
                 admin_port=int(env[env_name("admin_port")]), log_path=root / "gateway.log")
    with open(gw.log_path, "ab") as log:
        gw.proc = subprocess.Popen(command, cwd=root, env=process_env(env, root),
                                   stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"{gw.admin_url}/health", proc=gw.proc)
    except (RuntimeError, TimeoutError):
        gw.stop()
        raise AssertionError("the gateway did not start:\n" + gw.log()[-3000:]) from None
    return gw


@dataclass
class Stack:
    """The gateway as the compose file starts it, and what the test made for it."""

    gw: Gateway
    env: dict[str, str]
    parsed: dict
    bucket: str
    prefix: str  # where the gateway stores in the bucket, with a trailing /
    root: Path


@pytest.fixture(scope="module")
def stack(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("compose")
    parsed = compose(SHELL)
    env = container_env(parsed["services"]["tierstore"], moto_endpoint, root)
    bucket = create_bucket_like_minio_init(parsed["services"], moto_endpoint)
    capacity = urlsplit(env[env_name("capacity")])
    assert capacity.netloc == bucket, "minio-init must create the gateway's bucket"
    gw = start(env, root)
    try:
        yield Stack(gw, env, parsed, bucket, capacity.path.strip("/") + "/", root)
    finally:
        gw.stop()
    assert healthcheck(env, root) != 0, "a stopped gateway must fail the health check"
    assert_consistent(gw)


def test_the_image_healthcheck_passes_while_serving(stack: Stack) -> None:
    assert healthcheck(stack.env, stack.root) == 0


def test_objects_flush_into_the_bucket_and_read_back_from_it(
    stack: Stack, moto_endpoint: str
) -> None:
    s3 = make_client(stack.gw.endpoint)
    s3.create_bucket(Bucket="train")
    shards = {f"shards/{i:03d}.tar": os.urandom(64 * 1024 + i) for i in range(5)}
    for key, body in shards.items():
        s3.put_object(Bucket="train", Key=key, Body=body)
    status = stack.gw.flush()
    assert status["flush_queue"] == 0 and status["hot_staged"] == 0, status
    stored = boto3.client(
        "s3", endpoint_url=moto_endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    ).list_objects_v2(Bucket=stack.bucket).get("Contents", [])
    keys = [o["Key"] for o in stored]
    assert keys and all(k.startswith(stack.prefix) for k in keys), keys
    assert any(k.startswith(stack.prefix + "segments/") for k in keys), keys
    stack.gw.evict()  # the next reads come from the capacity store
    for key, body in shards.items():
        assert s3.get_object(Bucket="train", Key=key)["Body"].read() == body, key
    assert capacity_reads(scrape(stack)) >= len(shards)


def test_metrics_answer_the_token_prometheus_reads_and_no_other(stack: Stack) -> None:
    url = stack.gw.admin_url + prometheus_job()["metrics_path"]
    assert "tierstore_s3_requests" in scrape(stack)
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401


def scrape(stack: Stack) -> str:
    """GET /metrics as Prometheus does with deploy/prometheus.yml."""
    job = prometheus_job()
    token = token_as_prometheus_reads_it(stack.parsed, stack.root)
    response = httpx.get(
        stack.gw.admin_url + job["metrics_path"],
        headers={"Authorization": f"{job['authorization'].get('type', 'Bearer')} {token}"},
    )
    assert response.status_code == 200, response.text
    return response.text


def capacity_reads(exposition: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "tierstore_object_reads_total" and sample.labels.get("tier") == "capacity"
    )


def test_the_cluster_layer_three_gateways_a_bucket_writer_and_a_shared_warm(
    moto_endpoint: str, proxy: Any, tmp_path: Path
) -> None:
    """docker-compose.cluster.yml's three services, each with the environment
    Compose gives it, over one bucket: the nodes find each other in the
    node registry (each advertising its service name, mapped to loopback as
    the compose network would resolve it), the node a bucket is created
    through writes it, the other two follow it and name it, and a
    cooperative warm started on one node, naming no nodes, leaves each
    segment's extents on their owners, read from the store once."""
    # Short registry intervals, set in .env as an operator may: the test
    # waits for the nodes to list each other live.
    shell = {**SHELL, "CAPACITY_BUCKET": f"cluster-{os.getpid()}", "TIERSTORE_HEARTBEAT_INTERVAL": "0.3",
             "TIERSTORE_MEMBERS_INTERVAL": "0.3"}
    parsed = compose(shell, cluster=True)
    create_bucket_like_minio_init(parsed["services"], moto_endpoint)
    names = ("tierstore", "tierstore-b", "tierstore-c")
    envs = {}
    for name in names:  # MinIO is the moto server behind a proxy that counts what the nodes ask it
        (tmp_path / name).mkdir()
        envs[name] = container_env(parsed["services"][name], proxy.endpoint, tmp_path / name)
        advertised = urlsplit(envs[name][env_name("advertise_url")])
        assert advertised.hostname == name and env_name("peers") not in envs[name]
        envs[name][env_name("advertise_url")] = f"http://127.0.0.1:{envs[name][env_name('port')]}"
    started: list[Gateway] = []
    try:
        for name in names:
            started.append(start(envs[name], tmp_path / name))
        nodes = {"node-a", "node-b", "node-c"}
        deadline = time.monotonic() + 30
        while any(_live(gw) != nodes for gw in started):
            assert time.monotonic() < deadline, [_live(gw) for gw in started]
            time.sleep(0.1)
        s3 = make_client(started[0].endpoint)
        s3.create_bucket(Bucket="train")  # node-a takes the bucket's write lease
        roles = [gw.admin("GET", "/tiers").json()["cluster"] for gw in started]
        assert [r["writing"] for r in roles] == [["train"], [], []]
        shards = {f"shards/{i:03d}.tar": os.urandom(200_000 + i) for i in range(12)}
        for key, body in shards.items():
            s3.put_object(Bucket="train", Key=key, Body=body)
        started[0].flush()
        deadline = time.monotonic() + 30
        for gw in started[1:]:
            while gw.admin("GET", "/tiers").json()["cluster"]["lag_segments"] or not _listed(gw, len(shards)):
                assert time.monotonic() < deadline, "a replica did not catch up"
                time.sleep(0.1)
        with pytest.raises(ClientError) as refused:
            make_client(started[2].endpoint).put_object(Bucket="train", Key="x", Body=b"x")
        assert refused.value.response["Error"]["Writer"] == "node-a"
        for gw in started:
            gw.evict()
        proxy.reset()
        view = started[1].admin("POST", "/jobs/warm?wait=true", json={"bucket": "train", "prefix": "shards/",
                                                                       "cooperative": True}).json()
        assert view["state"] == "succeeded", view
        result = view["result"]
        assert result["hot_objects"] == len(shards) and result["peer_fallbacks"] == 0, result
        assert 0 < result["owner_extents"] < len(shards), result  # the other nodes' share, asked of them
        # Each extent read from the store once, by the node that owns it.
        fetched = proxy.requests_to("GetObject", "/segments/")
        assert fetched <= len(shards), fetched
        assert all(gw.admin("GET", "/tiers").json()["hot_cached"] for gw in started)
        for gw in started:
            client = make_client(gw.endpoint)
            for key, body in shards.items():
                assert client.get_object(Bucket="train", Key=key)["Body"].read() == body
    finally:
        for gw in started:
            gw.stop()


def _live(gw: Gateway) -> set[str]:
    return {m["node"] for m in gw.admin("GET", "/tiers").json()["cluster"]["members"] or [] if m["live"]}


def _listed(gw: Gateway, count: int) -> bool:
    try:
        return make_client(gw.endpoint).list_objects_v2(Bucket="train").get("KeyCount") == count
    except ClientError:  # NoSuchBucket until the replica has applied the bucket
        return False
