"""Hostile admin bodies through a real gateway (issue 42, the admin side).

Every body is read, bounded and validated before any work starts or any job
exists (gateway/admin/bodies.py, docs/admin-api.md "Request bodies"): text
UTF-8 cannot encode (lone surrogates, spelled ``\\ud800`` in JSON), deep
nesting, huge arrays and bodies, and key patterns whose counts hide in
their grammar are 4xx in the one error shape. Afterwards the job list still
answers with every job and nothing else, and the gateway's log holds no
traceback for any of them. A bug (a 500) is logged once, with its request
id, and uvicorn does not log it a second time.
"""

from __future__ import annotations

import re
import socket
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_client, running_gateway
from tests.integration.test_admin import call, error_of
from tests.servers import ADMIN_TOKEN, Gateway

MiB = 1024 * 1024
BUCKET = "hostile"
KEYS = [f"k{i}" for i in range(4)]
SURROGATE = "\\ud800"  # as JSON text: the escape of a lone surrogate


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("hostile") / "data") as gw:
        call(gw, "POST", "/buckets", json={"name": BUCKET}).raise_for_status()
        s3 = make_client(gw.endpoint)
        for key in KEYS:
            s3.put_object(Bucket=BUCKET, Key=key, Body=key.encode() * 100)
        yield gw


@pytest.fixture(scope="module")
def jobs_before(gw: Gateway) -> list[str]:
    """Jobs run before the hostile requests: the list must keep exactly these."""
    for kind, body in (("flush", None), ("warm", {"bucket": BUCKET, "keys": KEYS[:2]}),
                       ("evict", {"bucket": BUCKET, "prefix": "k"})):
        job = call(gw, "POST", f"/jobs/{kind}", params={"wait": "true"}, json=body).json()
        assert job["state"] == "succeeded", job
    return [j["id"] for j in call(gw, "GET", "/jobs").json()["jobs"]]


def raw(gw: Gateway, method: str, path: str, body: str | bytes) -> httpx.Response:
    """``body`` sent as it is, as JSON."""
    content = body.encode() if isinstance(body, str) else body
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    return httpx.request(method, gw.admin_url + path, content=content, headers=headers, timeout=120)


def assert_clean(log: str) -> None:
    assert "Traceback" not in log, log[-5000:]
    assert "Exception in ASGI application" not in log, log[-5000:]
    assert "InternalError" not in log, log[-5000:]


def assert_jobs_unchanged(gw: Gateway, before: list[str]) -> None:
    listing = call(gw, "GET", "/jobs")
    assert listing.status_code == 200, listing.text
    assert [j["id"] for j in listing.json()["jobs"]] == before
    assert call(gw, "GET", "/epochs").json()["epochs"] == []


S = SURROGATE
UNENCODABLE = [
    # (method, path, body, field the message names)
    ("POST", "/epochs", f'{{"bucket": "{BUCKET}", "keys": ["{S}"]}}', "keys"),
    ("POST", "/epochs", f'{{"bucket": "{BUCKET}", "keys": ["train-{{0..9}}{S}"], "patterns": true}}', "keys"),
    ("POST", "/epochs", f'{{"bucket": "{BUCKET}", "prefix": "{S}"}}', "prefix"),
    ("POST", "/epochs", f'{{"bucket": "{S}", "prefix": ""}}', "bucket"),
    ("POST", "/jobs/evict", f'{{"bucket": "{BUCKET}", "prefix": "{S}"}}', "prefix"),
    ("POST", "/jobs/evict", f'{{"bucket": "a{S}"}}', "bucket"),
    ("POST", "/jobs/pin", f'{{"bucket": "{BUCKET}", "prefix": "{S}"}}', "prefix"),
    ("POST", "/jobs/pin", f'{{"bucket": "{S}"}}', "bucket"),
    ("POST", "/jobs/warm", f'{{"bucket": "{BUCKET}", "keys": ["{S}"]}}', "keys"),
    ("POST", "/jobs/warm", f'{{"bucket": "{BUCKET}", "keys": ["k0", "k1\\udfff"]}}', "keys"),
    ("POST", "/jobs/warm", f'{{"bucket": "{BUCKET}", "prefix": "{S}"}}', "prefix"),
    ("POST", "/jobs/warm", f'{{"bucket": "{BUCKET}", "manifest": "{S}"}}', "manifest"),
    ("POST", "/jobs/warm", f'{{"bucket": "{BUCKET}", "keys": ["k0"], "peers": {{"n": "http://{S}"}}}}', "peers"),
    ("POST", "/buckets", f'{{"name": "{S}"}}', "name"),
    ("POST", "/mounts", f'{{"name": "m{S}", "source": "s3://src"}}', "name"),
    ("POST", "/mounts", f'{{"name": "mnt", "source": "s3://src/{S}"}}', "source"),
    ("POST", "/mounts", f'{{"name": "mnt", "source": "s3://src", "endpoint": "http://{S}"}}', "endpoint"),
    ("POST", "/mounts", f'{{"name": "mnt", "source": "s3://src", "access_key": "a", "secret_key": "{S}"}}',
     "secret_key"),
    # A member name: no field to name, the message quotes it escaped.
    ("POST", "/jobs/warm", f'{{"bucket": "{BUCKET}", "keys": ["k0"], "{S}": 1}}', "member name"),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), UNENCODABLE,
                         ids=[f"{c[1]}-{c[3]}-{i}" for i, c in enumerate(UNENCODABLE)])
def test_text_utf8_cannot_encode_is_a_400_before_any_job(
    gw: Gateway, jobs_before: list[str], method: str, path: str, body: str, field: str
) -> None:
    start = len(gw.log())
    answer = raw(gw, method, path, body)
    assert answer.status_code == 400, answer.text
    assert error_of(answer) == "InvalidRequest"
    message = answer.json()["error"]["message"]
    assert field in message and "UTF-8" in message, message
    assert_jobs_unchanged(gw, jobs_before)
    assert_clean(gw.log()[start:])


def test_surrogates_as_raw_bytes_are_a_400_too(gw: Gateway, jobs_before: list[str]) -> None:
    # UTF-8's encoding of a surrogate (invalid UTF-8, which Python's JSON reader lets through).
    start = len(gw.log())
    for path, body in (("/jobs/warm", b'{"bucket": "hostile", "keys": ["\xed\xa0\x80"]}'),
                       ("/epochs", b'{"bucket": "hostile", "keys": ["\xed\xa0\x80"]}'),
                       ("/jobs/pin", b'{"bucket": "hostile", "prefix": "\xed\xa0\x80"}')):
        answer = raw(gw, "POST", path, body)
        assert answer.status_code == 400 and error_of(answer) == "InvalidRequest", answer.text
    assert_jobs_unchanged(gw, jobs_before)
    assert_clean(gw.log()[start:])


SHAPES = [
    "[" * 100_000,
    "{" * 100_000,
    '{"bucket": ' + "[" * 100_000,
    '{"bucket": "hostile", "keys": ' + "[" * 5_000 + "]" * 5_000 + "}",
    '{"bucket": "hostile", "keys": [' + '"k0",' * 64 + "[" * 40 + "]" * 40 + "]}",
    "[" + "0," * 10_100_000 + "0]",  # more values than any body may hold
    '{"bucket": "hostile", "keys": [' + "1," * 10_100_000 + "1]}",
    '{"bucket": "hostile", "keys": [' + '"k",' * 1_000_001 + '"k"]}',  # warm: at most 1,000,000 keys
    '{"bucket": "hostile", "keys": ["k0"], "concurrency": ' + "9" * 5_000 + "}",  # past Python's 4300 digits
    "nope",
    '{"bucket": "hostile", "keys": ["k0"]',
    "",
]


@pytest.mark.parametrize("path", ["/jobs/warm", "/epochs", "/jobs/evict", "/jobs/pin", "/buckets", "/mounts"])
def test_deep_huge_and_broken_bodies_are_a_400(gw: Gateway, jobs_before: list[str], path: str) -> None:
    start = len(gw.log())
    for body in SHAPES:
        if path == "/jobs/evict" and body == "":
            continue  # evict's body is optional: none is the whole cache (a job): not hostile
        if path == "/epochs" and body.endswith('"k"]}'):
            continue  # an epoch may name 10,000,000 keys
        answer = raw(gw, "POST", path, body)
        assert answer.status_code == 400, (body[:80], answer.text)
        assert error_of(answer) == "InvalidRequest"
    assert_jobs_unchanged(gw, jobs_before)
    assert_clean(gw.log()[start:])


def test_a_body_over_the_size_limit_is_a_413_before_it_is_read(gw: Gateway, jobs_before: list[str]) -> None:
    start = len(gw.log())
    with socket.create_connection(("127.0.0.1", gw.admin_port), timeout=30) as sock:
        sock.sendall(
            f"POST /jobs/warm HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {300 * MiB}\r\n\r\n".encode()
            + b'{"bucket": "hostile", "keys": ["')
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer[:500]
    assert b'"code":"EntityTooLarge"' in body, body
    assert_jobs_unchanged(gw, jobs_before)
    assert_clean(gw.log()[start:])


# Patterns that name far more keys than they show (tests/unit/tiering/test_order.py):
# each is refused by its count, before any key is built.
HIDDEN_COUNTS = [
    "a{0..99999}{0..99999}",
    "a{0..9999}{0..9999}{0..9999}",
    "x{{0..999},{0..999}}{{0..999999},{1..9}}{0..99}",
    "{" + ",".join(["{0..99999}"] * 90) + "}{a,b}",
    "{{{{{{{0..99999}}}}}}}{{{{{{0..99999}}}}}}",
    "".join("{0..9}" for _ in range(150)),
    f"{{0..{10 ** 900}}}",
    "{a,{b,{c,{0..9999999}}}}{0..9}",
]


def rss(gw: Gateway) -> int:
    assert gw.proc is not None
    status = Path(f"/proc/{gw.proc.pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)[1]) * 1024  # type: ignore[index]


def test_patterns_that_hide_their_counts_are_refused_without_the_memory(
    gw: Gateway, jobs_before: list[str]
) -> None:
    def refused(path: str, pattern: str) -> None:
        answer = call(gw, "POST", path, json={"bucket": BUCKET, "keys": [pattern], "patterns": True})
        assert answer.status_code == 400, (pattern, answer.text)
        assert error_of(answer) == "InvalidRequest"
        assert "At most" in answer.json()["error"]["message"], answer.text

    # What the first refusals allocate for good (code paths, the pool's threads) is not counted.
    for path in ("/jobs/warm", "/epochs"):
        refused(path, HIDDEN_COUNTS[0])
    start, before = len(gw.log()), rss(gw)
    for pattern in HIDDEN_COUNTS:
        for path in ("/jobs/warm", "/epochs"):
            refused(path, pattern)
    grown = rss(gw) - before
    assert grown < 20 * MiB, f"the gateway grew by {grown / MiB:.1f} MiB refusing the patterns"
    assert_jobs_unchanged(gw, jobs_before)
    assert_clean(gw.log()[start:])


def test_a_fine_pattern_still_works(gw: Gateway, jobs_before: list[str]) -> None:
    job = call(gw, "POST", "/jobs/warm", params={"wait": "true"},
               json={"bucket": BUCKET, "keys": ["k{0..3}"], "patterns": True}).json()
    assert job["state"] == "succeeded" and job["params"]["keys"] == 1, job
    listing = call(gw, "GET", "/jobs").json()["jobs"]
    assert [j["id"] for j in listing] == [job["id"], *jobs_before]
    jobs_before.insert(0, job["id"])  # the list the later tests expect


# -- a bug is logged once ----------------------------------------------------------------

# Loaded by the gateway's interpreter (sitecustomize): GET /stats fails as a bug would.
_INJECT = textwrap.dedent("""
    import gateway.observability.metrics

    def _broken(self):
        raise RuntimeError("injected admin bug")

    gateway.observability.metrics.Metrics.stats = _broken
""")


def test_a_500_is_logged_once_with_its_request_id(tmp_path: Path) -> None:
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_INJECT)
    gw = Gateway(tmp_path / "data", extra_env={"PYTHONPATH": str(inject)}).start()
    try:
        answer = call(gw, "GET", "/stats")
        assert answer.status_code == 500, answer.text
        assert error_of(answer) == "InternalError"
        request_id = answer.headers["x-request-id"]
        assert re.fullmatch(r"[0-9A-F]{16}", request_id)
        assert request_id in answer.json()["error"]["message"]
        assert "injected" not in answer.text
        assert call(gw, "GET", "/jobs").status_code == 200  # the app goes on
        deadline = time.monotonic() + 10
        while "injected admin bug" not in gw.log() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        gw.stop()
    log = gw.log()
    assert log.count("admin request failed") == 1, log[-5000:]
    assert f"request_id={request_id} GET /stats" in log, log[-5000:]
    assert log.count("Traceback") == 1, log[-5000:]
    assert log.count("RuntimeError: injected admin bug") == 1, log[-5000:]
    assert "Exception in ASGI application" not in log, log[-5000:]
