"""The admin API's door for bodies (gateway/admin/bodies.py): limits on
size, depth and element count, text that UTF-8 cannot encode, and job
listings that never fail on what a job holds."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest
from pydantic import ValidationError

from gateway.admin import build_admin_app
from gateway.admin.bodies import MAX_BODY, MAX_DEPTH, MAX_ELEMENTS, parse_body, printable
from gateway.admin.epochs import NewEpoch
from gateway.admin.errors import AdminError
from gateway.admin.models import EvictRequest, NewMount, Pin, WarmRequest, plain
from gateway.config.values import Config
from gateway.observability.metrics import Metrics
from tiering.jobs import Job, JobState


def _refused(body: bytes) -> AdminError:
    with pytest.raises(AdminError) as caught:
        parse_body(body)
    return caught.value


def test_bodies_within_the_limits_parse() -> None:
    assert parse_body(b'{"bucket": "b", "keys": ["a", "b,c", "{0..9}"]}') == {
        "bucket": "b", "keys": ["a", "b,c", "{0..9}"]}
    nested: object = 1
    for _ in range(MAX_DEPTH - 1):
        nested = [nested]
    assert parse_body(json.dumps(nested).encode()) == nested


@pytest.mark.parametrize("body", [
    b"[" * 100_000,
    b"[" * 900 + b"]" * 900,
    b"{" + b'"a": {' * 40 + b"}" * 41,
    b"[" * (MAX_DEPTH + 1) + b"1" + b"]" * (MAX_DEPTH + 1),
])
def test_deep_nesting_is_a_400(body: bytes) -> None:
    refused = _refused(body)
    assert refused.status == 400 and refused.code == "InvalidRequest"


def test_too_many_values_are_a_400_before_they_are_built() -> None:
    refused = _refused(b"[" + b"0," * MAX_ELEMENTS + b"0]")
    assert refused.status == 400 and "JSON values" in refused.message
    # Commas inside strings are not values: a few keys full of commas pass.
    assert parse_body(json.dumps({"keys": ["," * (MAX_ELEMENTS + 5)]}).encode())


def test_a_body_over_the_size_limit_is_a_413() -> None:
    refused = _refused(b" " * (MAX_BODY + 1))
    assert refused.status == 413 and refused.code == "EntityTooLarge"


@pytest.mark.parametrize("body", [b"{", b"nope", b'{"a": 1} x', b'"\xff"', b'{"a": ' + b"9" * 5000 + b"}"])
def test_what_is_not_json_is_a_400(body: bytes) -> None:
    assert _refused(body).status == 400


def test_a_member_name_utf8_cannot_encode_is_a_400() -> None:
    refused = _refused(b'{"bucket": "b", "\\ud800": 1}')
    assert refused.status == 400 and "\\ud800" in refused.message


@pytest.mark.parametrize(("model", "fields"), [
    (EvictRequest, {"prefix": "\ud800"}),
    (EvictRequest, {"bucket": "a\udfffb"}),
    (Pin, {"bucket": "b", "prefix": "x\ud800"}),
    (WarmRequest, {"bucket": "b", "keys": ["ok", "\ud800"]}),
    (WarmRequest, {"bucket": "b", "manifest": "\ud800"}),
    (WarmRequest, {"bucket": "b", "keys": ["k"], "peers": {"\ud800": "http://x"}}),
    (NewEpoch, {"bucket": "b", "keys": ["\ud800"]}),
    (NewEpoch, {"bucket": "b", "prefix": "\ud800"}),
    (NewMount, {"name": "abc", "source": "s3://src", "access_key": "a", "secret_key": "\ud800"}),
])
def test_text_utf8_cannot_encode_is_refused_by_the_model(model: type, fields: dict) -> None:
    with pytest.raises(ValidationError, match="cannot be encoded as UTF-8"):
        model.model_validate(fields)


def test_printable_text_is_unchanged_and_the_rest_is_escaped() -> None:
    assert printable("train/é漢") == "train/é漢"
    assert printable("a\ud800b") == "a\\ud800b"
    assert plain({"k\udfff": ["\ud800", 1, 2.5, float("nan"), (1, 2), ValueError("k\ud800")]}) == {
        "k\\udfff": ["\\ud800", 1, 2.5, None, [1, 2], "k\\ud800"]}


class _Jobs:
    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = jobs

    def list(self) -> list[Job]:
        return self.jobs

    def get(self, job_id: str) -> Job | None:
        return next((j for j in self.jobs if j.id == job_id), None)


def test_a_job_that_cannot_be_serialised_does_not_hide_the_others() -> None:
    bad = Job("0002-bad", "evict", {"bucket": "b", "prefix": "\ud800", "odd": {1, 2}})
    bad.state, bad.result = JobState.SUCCEEDED, {"skipped": "\udfff", "when": object()}
    bad.error("key \ud800 failed")
    good = Job("0001-good", "flush", {})
    node = SimpleNamespace(started=True, metrics=Metrics(), tiering=SimpleNamespace(jobs=_Jobs([bad, good])))
    app = build_admin_app(Config(admin_token="t"), node)  # type: ignore[arg-type]

    async def ask(path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            return await client.get(path, headers={"Authorization": "Bearer t"})

    listing = asyncio.run(ask("/jobs"))
    assert listing.status_code == 200, listing.text
    jobs = listing.json()["jobs"]
    assert [j["id"] for j in jobs] == ["0002-bad", "0001-good"]
    assert jobs[0]["params"]["prefix"] == "\\ud800" and jobs[0]["result"]["skipped"] == "\\udfff"
    assert jobs[0]["errors"] == ["key \\ud800 failed"]
    one = asyncio.run(ask("/jobs/0002-bad"))
    assert one.status_code == 200 and one.json()["params"]["prefix"] == "\\ud800"
