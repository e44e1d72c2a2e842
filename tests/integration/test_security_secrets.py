"""Secrets of a real gateway process stay secret.

A gateway with distinctive secrets (S3 secret key, admin token, capacity
secret key, a mount's secret key), logging at debug level with a JSON access
log, serves good and failing requests; no secret appears in its log, in any
response seen, or in the CLI's output.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import httpx
import pytest
from typer.testing import CliRunner

from gateway.cli.app import app as cli_app
from tests.conftest import assert_consistent
from tests.integration.s3raw import REGION, sign
from tests.integration.security_common import (
    UNKNOWN_KEY,
    WRONG_SECRET,
    Call,
    v2_header,
    v2_presigned,
    v4_presigned,
)
from tests.servers import ACCESS_KEY, Gateway, free_port


@dataclass
class Secrets:
    s3: str = field(default_factory=lambda: "s3secret" + secrets.token_hex(12))
    admin: str = field(default_factory=lambda: "admintoken" + secrets.token_hex(12))
    capacity: str = field(default_factory=lambda: "capsecret" + secrets.token_hex(12))
    mount: str = field(default_factory=lambda: "mountsecret" + secrets.token_hex(12))

    def all(self) -> dict[str, str]:
        return {"S3 secret key": self.s3, "admin token": self.admin, "capacity secret key": self.capacity,
                "mount secret key": self.mount}

    def found_in(self, text: str) -> list[str]:
        return [name for name, value in self.all().items() if value in text]


class SecretGateway(Gateway):
    """A gateway whose secrets come from the environment, not its command line."""

    def __init__(self, data_dir: Path, keys: Secrets, extra_args: list[str]) -> None:
        super().__init__(data_dir, extra_args=extra_args)
        self.keys = keys

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(TIERSTORE_SECRET_KEY=self.keys.s3, TIERSTORE_ADMIN_TOKEN=self.keys.admin,
                   TIERSTORE_CAPACITY_SECRET_KEY=self.keys.capacity)
        return env


@dataclass
class Seen:
    """Every response body and header the test saw, and every CLI output."""

    texts: list[tuple[str, str]] = field(default_factory=list)

    def response(self, label: str, response: httpx.Response) -> httpx.Response:
        headers = "\n".join(f"{k}: {v}" for k, v in response.headers.items())
        self.texts.append((label, headers + "\n" + response.content.decode("utf-8", "replace")))
        return response

    def text(self, label: str, text: str) -> None:
        self.texts.append((label, text))


@pytest.fixture(scope="module")
def secret_gateway(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> Iterator[SecretGateway]:
    keys = Secrets()
    root = tmp_path_factory.mktemp("secrets")
    capacity = f"sec-cap-{os.getpid()}"
    source = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name=REGION)
    for name in (capacity, "sec-source"):
        source.create_bucket(Bucket=name)
    source.put_object(Bucket="sec-source", Key="data/a", Body=b"from the source")
    args = ["--access-log", "json", "--log-level", "debug", "--flush-delay", "3600",
            "--capacity", f"s3://{capacity}/tier", "--capacity-endpoint", moto_endpoint,
            "--capacity-access-key", "sec-capacity-access"]
    gw = SecretGateway(root / "data", keys, args).start()
    try:
        yield gw
    finally:
        gw.stop()
    assert_consistent(gw)


def _exercise_s3(gw: SecretGateway, seen: Seen) -> None:
    keys = gw.keys
    good = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=keys.s3, region_name=REGION)
    good.create_bucket(Bucket="sec-data")
    good.put_object(Bucket="sec-data", Key="a", Body=b"a" * 10_000)
    assert good.get_object(Bucket="sec-data", Key="a")["Body"].read() == b"a" * 10_000
    with httpx.Client(timeout=30) as client:
        for secret, access in ((WRONG_SECRET, ACCESS_KEY), (keys.s3, UNKNOWN_KEY)):
            for path in ("/sec-data/a", "/sec-data", "/"):
                headers, _, _ = sign("GET", gw.endpoint + path, access_key=access, secret_key=secret)
                seen.response(f"S3 GET {path} signed wrong", client.get(gw.endpoint + path, headers=headers))
        call = Call("GetObject", "GET", "/sec-data/a")
        seen.response("SigV2 wrong secret", client.get(gw.endpoint + call.path, headers=v2_header(
            call, gw.endpoint, ACCESS_KEY, WRONG_SECRET)))
        presigned = v2_presigned(call, gw.endpoint, ACCESS_KEY, keys.s3, 60)
        seen.response("SigV2 presigned", client.get(presigned))
        seen.response("SigV4 presigned, expired", client.get(v4_presigned(
            call, gw.endpoint, secret=keys.s3, when=datetime.now(UTC) - timedelta(hours=1), expires=60)))
        for path in ("/sec-data/missing", "/no-such-bucket-here/k", "/sec-data/a?partNumber=7"):
            headers, _, _ = sign("GET", gw.endpoint + path, secret_key=keys.s3)
            seen.response(f"S3 GET {path}", client.get(gw.endpoint + path, headers=headers))
        seen.response("unsigned", client.get(gw.endpoint + "/sec-data/a"))


def _exercise_admin(gw: SecretGateway, moto_endpoint: str, seen: Seen) -> None:
    keys = gw.keys
    auth = {"Authorization": f"Bearer {keys.admin}"}
    with httpx.Client(base_url=gw.admin_url, timeout=60) as admin:
        def call(method: str, path: str, **kwargs: object) -> httpx.Response:
            answer = admin.request(method, path, headers=auth, **kwargs)  # type: ignore[arg-type]
            return seen.response(f"admin {method} {path}", answer)

        mount = {"name": "sec-mounted", "source": "s3://sec-source/data", "endpoint": moto_endpoint,
                 "access_key": "sec-mount-access", "secret_key": keys.mount}
        assert call("POST", "/mounts", json=mount).status_code == 201
        refused = [mount | {"name": "sec-missing", "source": "s3://no-such-source-bucket"},
                   mount | {"name": "sec-refused", "endpoint": f"http://127.0.0.1:{free_port()}"},
                   mount | {"name": "sec-bad", "endpoint": f"http://user:{keys.mount}@127.0.0.1:1"},
                   mount | {"name": "Bad_Name"}]
        for body in refused:
            assert call("POST", "/mounts", json=body).status_code in (400, 502), body["name"]
        assert call("GET", "/mounts").json()["mounts"][0]["secret_key"] == "***"
        for request in ("GET /mounts/sec-mounted", "GET /config", "GET /metrics", "GET /stats", "GET /tiers",
                        "GET /buckets", "GET /jobs", "GET /buckets/nope", "DELETE /mounts/nope",
                        "GET /objects/sec-data/a", "POST /jobs/flush?wait=true", "POST /jobs/evict?wait=true",
                        "POST /buckets", "GET /openapi.json", "GET /docs", "GET /health", "GET /ready"):
            call(*request.split())
        call("POST", "/buckets", json={"name": "x", "part_size": "lots"})
        for token in ("wrong", keys.s3):
            answer = admin.get("/config", headers={"Authorization": f"Bearer {token}"})
            seen.response("admin with a wrong token", answer)
        config = call("GET", "/config").json()
        assert config["admin_token"] == config["capacity_secret_key"] == "***"
        assert config["credentials"] == {ACCESS_KEY: "***"}


def _exercise_cli(gw: SecretGateway, seen: Seen) -> None:
    runner = CliRunner()
    env = {"TIERSTORE_ADMIN_TOKEN": gw.keys.admin, "TIERSTORE_ADMIN_URL": gw.admin_url}
    for args in (["status"], ["stats"], ["mounts"], ["buckets"], ["jobs"], ["pins"], ["epochs"],
                 ["where", "sec-data", "a"], ["status", "--token", "wrong"], ["where", "nope", "k"]):
        result = runner.invoke(cli_app, args, env=env)
        seen.text(f"tierstore {' '.join(args)} (exit {result.exit_code})", result.output)
    result = runner.invoke(cli_app, ["status", "--token", gw.keys.admin],
                           env={"TIERSTORE_ADMIN_URL": gw.admin_url})
    assert result.exit_code == 0, result.output
    seen.text("tierstore status --token", result.output)


def test_no_secret_appears_in_logs_answers_or_cli_output(secret_gateway: SecretGateway,
                                                         moto_endpoint: str) -> None:
    seen = Seen()
    _exercise_s3(secret_gateway, seen)
    _exercise_admin(secret_gateway, moto_endpoint, seen)
    mounted = boto3.client("s3", endpoint_url=secret_gateway.endpoint, aws_access_key_id=ACCESS_KEY,
                           aws_secret_access_key=secret_gateway.keys.s3, region_name=REGION)
    assert mounted.get_object(Bucket="sec-mounted", Key="a")["Body"].read() == b"from the source"
    _exercise_cli(secret_gateway, seen)
    keys = secret_gateway.keys
    leaks = [f"{label}: {names}" for label, text in seen.texts if (names := keys.found_in(text))]
    assert not leaks, "secrets in answers or CLI output:\n" + "\n".join(leaks)
    assert len(seen.texts) > 50

    secret_gateway.stop()  # every line written
    log = secret_gateway.log()
    assert '"op": "GetObject"' in log or '"op":"GetObject"' in log, log[-2000:]  # the JSON access log
    assert "DEBUG" in log, log[-2000:]
    leaked = [line for line in log.splitlines() if secret_gateway.keys.found_in(line)]
    assert not leaked, "secrets in the gateway log:\n" + "\n".join(leaked[:20])
