"""The admin commands of the ``tierstore`` CLI against a real gateway.

Every command runs as ``python -m gateway ...`` in a subprocess, as a user
would run it; the gateway's state is set up with boto3 and checked both
through the CLI's ``--json`` output and directly through the admin API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gateway.cli import browser as cli_browser
from gateway.cli.app import app as cli_app
from tests.conftest import make_client, running_gateway
from tests.servers import ADMIN_TOKEN, Gateway

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway of this module's own: its jobs flush and evict the whole node.

    The long flush delay lets the tests decide when staged data moves.
    """
    with running_gateway(tmp_path_factory.mktemp("cli") / "data", "--flush-delay", "3600") as gw:
        yield gw


@pytest.fixture(scope="module")
def s3(gw: Gateway) -> Any:
    return make_client(gw.endpoint)


def _env(gw: Gateway) -> dict[str, str]:
    """The caller's environment without TIERSTORE_*, plus the gateway's address and token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERSTORE_")}
    env.update(TIERSTORE_ADMIN_URL=gw.admin_url, TIERSTORE_ADMIN_TOKEN=ADMIN_TOKEN)
    return env


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def cli(gw: Gateway, *args: str, ok: bool = True, process: bool = False) -> Ran:
    """``tierstore <args>`` against ``gw``; fails the test on a non-zero exit
    if ``ok``. In-process through click's runner (a new interpreter per
    command costs a second of imports), or as a real process with ``process``."""
    if process:
        done = subprocess.run(
            [sys.executable, "-m", "gateway", *args],
            env=_env(gw), capture_output=True, text=True, timeout=120, check=False,
        )
        ran = Ran(done.returncode, done.stdout, done.stderr)
    else:
        result = CliRunner().invoke(cli_app, list(args), env=_env(gw), catch_exceptions=False)
        ran = Ran(result.exit_code, result.stdout, result.stderr)
    if ok:
        assert ran.returncode == 0, (
            f"tierstore {' '.join(args)} exited {ran.returncode}\n"
            f"stdout:\n{ran.stdout}\nstderr:\n{ran.stderr}"
        )
    assert "Traceback" not in ran.stderr, ran.stderr
    return ran


def cli_json(gw: Gateway, *args: str) -> Any:
    """``tierstore <args> --json``: stdout must be exactly one JSON document."""
    return json.loads(cli(gw, *args, "--json").stdout)


def _upload(s3: Any, bucket: str, count: int, size: int = 64 * 1024) -> None:
    s3.create_bucket(Bucket=bucket)
    for i in range(count):
        s3.put_object(Bucket=bucket, Key=f"data/{i:03}", Body=os.urandom(size))


def test_status_and_stats(gw: Gateway, s3: Any) -> None:
    _upload(s3, "cli-status", 3)
    s3.get_object(Bucket="cli-status", Key="data/000")["Body"].read()

    status = cli(gw, "status", process=True).stdout  # the real command, once
    for section in ("hot tier", "capacity tier", "hit ratio", "jobs running", "watermarks"):
        assert section in status
    document = cli_json(gw, "status")
    assert set(document) == {"tiers", "stats", "jobs"}
    assert document["tiers"]["hot_budget"] > 0

    table = cli(gw, "stats").stdout
    assert "PutObject" in table and "GetObject" in table and "p99 ms" in table
    stats = cli_json(gw, "stats")
    assert stats["requests"]["PutObject"]["count"] >= 3
    assert stats["hit_ratio"]["objects"] is not None  # one read so far


def test_buckets_create_list_show_set_delete(gw: Gateway, s3: Any) -> None:
    created = cli_json(
        gw, "buckets", "create", "cli-policy", "--write-through", "--no-compression",
        "--part-size", "16M", "--small-object-size", "1M",
    )
    assert created["name"] == "cli-policy"
    assert (created["write_through"], created["compression"]) == (True, False)
    assert (created["part_size"], created["small_object_size"]) == (16 * MiB, 1 * MiB)

    assert "cli-policy" in cli(gw, "buckets").stdout
    assert "cli-policy" in cli(gw, "buckets", "list").stdout
    assert "cli-policy" in {b["name"] for b in cli_json(gw, "buckets")["buckets"]}
    shown = cli(gw, "buckets", "show", "cli-policy").stdout
    assert "16.0 MiB" in shown and "through" in shown

    changed = cli_json(gw, "buckets", "set", "cli-policy", "--write-back", "--pinned")
    assert (changed["write_through"], changed["pinned"], changed["compression"]) == (
        False, True, False,  # compression was not given: unchanged
    )
    assert gw.admin("GET", "/buckets/cli-policy").json() == changed

    s3.put_object(Bucket="cli-policy", Key="k", Body=b"x")
    not_empty = cli(gw, "buckets", "delete", "cli-policy", ok=False)
    assert not_empty.returncode == 1
    assert not_empty.stderr.startswith("tierstore: ") and not_empty.stderr.count("\n") == 1
    s3.delete_object(Bucket="cli-policy", Key="k")
    assert cli(gw, "buckets", "delete", "cli-policy").stdout == "deleted bucket cli-policy\n"

    missing = cli(gw, "buckets", "show", "cli-policy", ok=False)
    assert missing.returncode == 1 and missing.stderr.startswith("tierstore: ")


def test_flush_and_compact_run_to_completion(gw: Gateway, s3: Any) -> None:
    _upload(s3, "cli-flush", 8)
    assert gw.admin("GET", "/tiers").json()["hot_staged"] > 0

    flushed = cli(gw, "flush")
    assert "flush job" in flushed.stdout and "succeeded" in flushed.stdout
    tiers = gw.admin("GET", "/tiers").json()
    assert (tiers["hot_staged"], tiers["flush_queue"]) == (0, 0)
    assert tiers["segments"] > 0

    for i in range(6):  # make garbage in the segments just written
        s3.delete_object(Bucket="cli-flush", Key=f"data/{i:03}")
    final = cli_json(gw, "flush")
    assert final["kind"] == "flush" and final["state"] == "succeeded"

    compacted = cli(gw, "compact", "--threshold", "0.9")
    assert "compact job" in compacted.stdout and "succeeded" in compacted.stdout
    job = cli_json(gw, "compact", "--threshold", "0.9")
    assert (job["kind"], job["state"]) == ("compact", "succeeded")
    assert job["params"].get("threshold") == 0.9
    for i in (6, 7):  # what stayed live still reads back
        assert len(s3.get_object(Bucket="cli-flush", Key=f"data/{i:03}")["Body"].read()) == 65536


def test_no_wait_then_jobs_wait_list_show(gw: Gateway, s3: Any) -> None:
    _upload(s3, "cli-jobs", 2)
    started = cli(gw, "flush", "--no-wait")
    job_id = started.stdout.strip()
    assert job_id and "\n" not in job_id  # only the id on stdout
    assert f"tierstore jobs wait {job_id}" in started.stderr

    waited = cli(gw, "jobs", "wait", job_id)
    assert "succeeded" in waited.stdout

    assert job_id in cli(gw, "jobs").stdout
    assert job_id in cli(gw, "jobs", "list").stdout
    assert job_id in {j["id"] for j in cli_json(gw, "jobs")["jobs"]}
    assert job_id in cli(gw, "jobs", "show", job_id).stdout
    shown = cli_json(gw, "jobs", "show", job_id)
    assert (shown["id"], shown["state"]) == (job_id, "succeeded")

    no_wait_json = cli_json(gw, "flush", "--no-wait")
    assert no_wait_json["kind"] == "flush"
    cli(gw, "jobs", "wait", no_wait_json["id"])

    finished = cli(gw, "jobs", "cancel", job_id, ok=False)  # 409 JobFinished
    assert finished.returncode == 1 and finished.stderr.startswith("tierstore: ")
    unknown = cli(gw, "jobs", "show", "no-such-job", ok=False)
    assert unknown.returncode == 1 and unknown.stderr.startswith("tierstore: ")


def test_evict_pin_pins_unpin_where(gw: Gateway, s3: Any) -> None:
    _upload(s3, "cli-pin", 4, size=256 * 1024)
    cli(gw, "flush")

    evicted = cli_json(gw, "evict", "s3://cli-pin")
    assert (evicted["kind"], evicted["state"]) == ("evict", "succeeded")
    where = cli_json(gw, "where", "s3://cli-pin/data/001")
    assert (where["bucket"], where["key"], where["size"]) == ("cli-pin", "data/001", 256 * 1024)
    assert where["where"] == "capacity"
    assert all(chunk["state"] == "capacity" for chunk in where["chunks"])
    table = cli(gw, "where", "s3://cli-pin/data/001").stdout
    assert "s3://cli-pin/data/001" in table and "capacity" in table

    pinned = cli(gw, "pin", "s3://cli-pin/data/")
    assert "pin job" in pinned.stdout and "succeeded" in pinned.stdout
    assert "s3://cli-pin/data/" in cli(gw, "pins").stdout
    assert {"bucket": "cli-pin", "prefix": "data/"} in cli_json(gw, "pins")["pins"]
    hot = cli_json(gw, "where", "s3://cli-pin/data/001")
    assert hot["pinned"] is True and hot["where"] == "hot"

    whole_cache = cli_json(gw, "evict")  # pinned data stays
    assert whole_cache["state"] == "succeeded"
    assert cli_json(gw, "where", "s3://cli-pin/data/001")["where"] == "hot"

    assert cli(gw, "unpin", "s3://cli-pin/data/").stdout.startswith("unpinned s3://cli-pin/data/")
    assert {"bucket": "cli-pin", "prefix": "data/"} not in cli_json(gw, "pins")["pins"]
    again = cli(gw, "unpin", "s3://cli-pin/data/", ok=False)
    assert again.returncode == 1 and again.stderr.startswith("tierstore: ")
    cli(gw, "evict", "s3://cli-pin/data/")
    assert cli_json(gw, "where", "s3://cli-pin/data/001")["where"] == "capacity"


def test_where_a_missing_key(gw: Gateway, s3: Any) -> None:
    s3.create_bucket(Bucket="cli-where")
    missing = cli(gw, "where", "s3://cli-where/nope", ok=False)
    assert missing.returncode == 1 and missing.stderr.startswith("tierstore: ")


def test_wrong_token_exits_1_with_the_reason(gw: Gateway) -> None:
    refused = cli(gw, "status", "--token", "not-the-token", ok=False)
    assert refused.returncode == 1
    assert refused.stderr.startswith("tierstore: the admin API refused the token from --token")
    assert refused.stdout == ""



def test_status_url_points_at_the_page_and_open_needs_a_browser(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = cli(gw, "status", "--url", process=True).stdout.strip()
    assert plain == f"{gw.admin_url}/status" and ADMIN_TOKEN not in plain
    page = httpx.get(plain)  # the page itself needs no token (its data does)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    signed = cli(gw, "status", "--url", "--with-token").stdout.strip()
    assert signed == f"{gw.admin_url}/status#token={ADMIN_TOKEN}"

    alone = cli(gw, "status", "--with-token", ok=False)
    assert alone.returncode == 2 and "--with-token goes with --url" in alone.stderr
    # The token is checked before an address is given out.
    refused = cli(gw, "status", "--url", "--token", "not-the-token", ok=False)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "refused the token" in refused.stderr

    given: list[str] = []
    monkeypatch.setattr(cli_browser.webbrowser, "open", lambda url: given.append(url) or False)
    headless = cli(gw, "status", "--open", ok=False)
    assert headless.returncode == 1
    assert f"no browser found here: open {gw.admin_url}/status" in headless.stderr
    assert ADMIN_TOKEN not in headless.stderr + headless.stdout
    (url,) = given
    assert url.startswith("file://") and not os.path.exists(url.removeprefix("file://"))
