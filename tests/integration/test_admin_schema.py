"""The admin API against its own OpenAPI schema, fuzzed with schemathesis.

The schema is loaded from a live gateway (``GET /openapi.json``) and
schemathesis runs its phases on it, as ``st run`` would: the schema's
examples, boundary values of every parameter (coverage), generated valid
and invalid requests (fuzzing) and chains of calls that follow the links it
infers (stateful: create a bucket, read it, delete it, read it again). A
response must never be a 5xx, must carry a documented status code, content
type and headers, its body must match the documented schema for that
status, an invalid request must be refused, a 405 must name the allowed
methods, an operation that declares the bearer token must refuse a request
without it, and a deleted resource must be gone.

The gateway is the module's own, so the destructive operations (deleting
buckets and mounts, evicting, compacting, ending epochs) run too, and its
data directory is checked afterwards. Mounts point at the session's moto
server: a generated ``s3://`` source keeps its prefix but names a bucket
that exists there, and a generated endpoint is replaced by moto's, so no
request leaves the machine.

Not checked: ``positive_data_acceptance``. It flags any 4xx to a request
the schema allows, but some rules cannot be said in JSON Schema: S3 bucket
naming (no IP address form, no ``xn--`` prefix, ...) and "exactly one of
prefix, keys or manifest". Those answers are 400s with the one error body,
which the other checks verify.

``TIERSTORE_SCHEMA_EXAMPLES`` sets the generated cases per operation and
phase (10 by default, for CI, with a fixed seed); a long run sets it to,
say, 1000, and gets a random seed. What the runs found stays below as plain
tests, so that CI sees it whatever the seed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import boto3
import httpx
import pytest
import schemathesis
from schemathesis.engine import Status, events, from_schema

from tests.conftest import assert_consistent
from tests.integration.s3raw import Sender
from tests.servers import ADMIN_TOKEN, Gateway

EXAMPLES = int(os.environ.get("TIERSTORE_SCHEMA_EXAMPLES", "10"))
LONG_RUN = "TIERSTORE_SCHEMA_EXAMPLES" in os.environ
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SOURCE_BUCKET = "schema-mount-source"
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "allow_header_conformance",
    "unsupported_method",
    "ignored_auth",
    "use_after_free",
    "ensure_resource_availability",
)


class IsolatedGateway(Gateway):
    """A gateway that finds no AWS credentials of the machine's and asks no
    instance metadata service: a mount without keys fails at once."""

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in super().env().items()
               if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")}
        env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
                   AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        return env


@pytest.fixture(scope="module")
def admin_gateway(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> Iterator[Gateway]:
    boto3.client(
        "s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
        aws_secret_access_key="testing", region_name="us-east-1",
    ).create_bucket(Bucket=SOURCE_BUCKET)
    gw = IsolatedGateway(tmp_path_factory.mktemp("admin-schema") / "data").start()
    try:
        yield gw
    finally:
        gw.stop()
    assert_consistent(gw)


def _config() -> schemathesis.Config:
    checks: dict[str, Any] = {name: {"enabled": True} for name in CHECKS}
    # 502 SourceUnavailable is how POST /mounts says the source refused (no
    # keys, no such bucket); status_code_conformance refuses it anywhere else.
    checks["not_a_server_error"]["expected-statuses"] = ["2XX", "3XX", "4XX", "502"]
    checks["positive_data_acceptance"] = {"enabled": False}  # see the module docstring
    checks["missing_required_header"] = {"enabled": False}  # no header parameters but the token
    settings: dict[str, Any] = {
        "headers": AUTH,
        "workers": 1,
        "request-timeout": 60,
        "suppress-health-check": ["all"],
        "generation": {"mode": "all", "max-examples": EXAMPLES, "database": "none"},
        "checks": checks,
    }
    if not LONG_RUN:
        settings["seed"] = 20_261_203
    return schemathesis.Config.from_dict(settings)


def _reachable(url: object) -> bool:
    """Whether the gateway would try to connect to ``url`` (a mount endpoint):
    an http(s) URL with a host, a valid port and no credentials."""
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError when out of range)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and "@" not in parts.netloc


@contextlib.contextmanager
def mounts_kept_local(endpoint: str) -> Iterator[None]:
    """While it lasts, every generated mount (in any phase) points at moto;
    values the gateway refuses before connecting anywhere stay as generated."""

    def before_call(context: schemathesis.HookContext, case: schemathesis.Case, kwargs: dict[str, Any]) -> None:
        body = case.body
        if (case.method.upper(), case.path) != ("POST", "/mounts") or not isinstance(body, dict):
            return
        if body.get("endpoint") is None or _reachable(body["endpoint"]):
            body["endpoint"] = endpoint
        source = body.get("source")
        if isinstance(source, str) and source.startswith("s3://"):
            body["source"] = f"s3://{SOURCE_BUCKET}{urlsplit(source).path}"

    schemathesis.hook("before_call")(before_call)
    try:
        yield
    finally:
        schemathesis.hooks.unregister(before_call)


def _describe(event: events.ScenarioFinished) -> list[str]:
    """Each failed check of a scenario, with the request that reproduces it."""
    out = []
    for checks in event.recorder.checks.values():
        for check in checks:
            if check.status == Status.FAILURE and check.failure_info is not None:
                failure = check.failure_info.failure
                out.append(f"{failure.operation}: {check.name}: {failure.title}\n{failure.message}\n"
                           f"{check.failure_info.code_sample}")
    return out


def test_admin_api_conforms_to_its_schema(admin_gateway: Gateway, moto_endpoint: str) -> None:
    schema = schemathesis.openapi.from_url(
        f"{admin_gateway.admin_url}/openapi.json", config=_config(), headers=AUTH, timeout=30)
    assert len(list(schema.get_all_operations())) >= 25
    problems: list[str] = []
    phases: set[str] = set()
    with mounts_kept_local(moto_endpoint):
        for event in from_schema(schema).execute():
            if isinstance(event, events.ScenarioFinished):
                phases.add(event.phase.value)
                problems += _describe(event)
            elif isinstance(event, (events.NonFatalError, events.FatalError)):
                error = event.value if isinstance(event, events.NonFatalError) else event.exception
                problems.append(f"{getattr(event, 'label', 'engine')}: {type(error).__name__}: {error}")
    assert {"coverage", "fuzzing", "stateful"} <= phases, f"phases that ran: {sorted(phases)}"
    assert not problems, f"{len(problems)} failures:\n\n" + "\n\n".join(dict.fromkeys(problems))


@pytest.mark.parametrize("change", [
    {"access_key": "", "secret_key": ""},  # was a 500: the signer refuses empty keys
    {"endpoint": "https://[::1"},  # was a 500: urlsplit raises on it
    {"endpoint": "http://127.0.0.1:99999"},  # was a 502 after three attempts
    {"endpoint": "http://user:pw1234@127.0.0.1:1"},  # was shown back, password and all
    {"source": "S3://schema-mount-source"},
], ids=["empty keys", "broken IPv6 endpoint", "port out of range", "credentials in the endpoint", "S3://"])
def test_mount_bodies_refused_before_any_connection(admin_gateway: Gateway, moto_endpoint: str,
                                                    change: dict[str, str]) -> None:
    """Cases the generated requests found, kept as plain regressions."""
    body = {"name": "refused-mount", "source": f"s3://{SOURCE_BUCKET}", "endpoint": moto_endpoint,
            "access_key": "testing", "secret_key": "testing"} | change
    response = httpx.post(f"{admin_gateway.admin_url}/mounts", json=body, headers=AUTH)
    assert (response.status_code, response.json()["error"]["code"]) == (400, "InvalidRequest"), response.text
    assert "pw1234" not in response.text


def test_a_bucket_name_ending_in_a_newline_is_refused(admin_gateway: Gateway) -> None:
    """A pattern anchored with ``$`` also matches before a final newline in
    Python (JSON Schema validators read it as the end of the string), so the
    gateway's check matches whole names. ``abc\\n`` must not become a bucket, through the admin
    API or S3 (``PUT /def%0A``)."""
    response = httpx.post(f"{admin_gateway.admin_url}/buckets", json={"name": "abc\n"}, headers=AUTH)
    assert (response.status_code, response.json()["error"]["code"]) == (400, "InvalidBucketName")
    refused = Sender(admin_gateway).signed("PUT", "/def%0A")
    assert (refused.status_code, b"<Code>InvalidBucketName</Code>" in refused.content) == (400, True)
