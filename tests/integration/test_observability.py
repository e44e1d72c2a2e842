"""The access log of a real gateway process: one line per S3 request.

Each gateway here is the module's own (the session gateway's log holds every
other test's requests too). Lines are found by the request id boto3 got back
in x-amz-request-id; they are written just after the response went out, so
the log is polled briefly.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.conftest import make_client, running_gateway
from tests.servers import ACCESS_KEY, Gateway

_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


@pytest.fixture(scope="module")
def text_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("access-text") / "data") as gw:  # text is the default
        yield gw


def _configured(factory: pytest.TempPathFactory, access_log: str) -> Iterator[Gateway]:
    """A gateway whose access log format comes from its config file."""
    root = factory.mktemp(f"access-{access_log}")
    config = root / "tierstore.toml"
    config.write_text(f'access_log = "{access_log}"\n')
    with running_gateway(root / "data", "--config", str(config)) as gw:
        yield gw


@pytest.fixture(scope="module")
def json_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    yield from _configured(tmp_path_factory, "json")


@pytest.fixture(scope="module")
def off_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    yield from _configured(tmp_path_factory, "off")


def _text_fields(line: str) -> dict[str, str]:
    """Parse a text-format line; quoted values are JSON-compatible escapes
    except \\xNN, which the tests here do not produce."""
    out = {}
    for name, raw in _PAIR.findall(line):
        out[name] = json.loads(raw) if raw.startswith('"') else raw
    return out


def _lines(gw: Gateway, request_id: str, timeout: float = 5.0) -> list[str]:
    """The log lines naming ``request_id``, once at least one is there."""
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in gw.log().splitlines() if request_id in line]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def _entry(gw: Gateway, response: dict) -> dict[str, str]:
    request_id = response["ResponseMetadata"]["RequestId"]
    lines = _lines(gw, request_id)
    assert len(lines) == 1, f"expected one access-log line for {request_id}, got {lines}"
    fields = _text_fields(lines[0])
    assert fields["request_id"] == request_id
    return fields


def _error_entry(gw: Gateway, err: ClientError) -> dict[str, str]:
    return _entry(gw, err.response)


def test_each_request_logs_one_line(text_gateway: Gateway) -> None:
    s3 = make_client(text_gateway.endpoint)
    created = _entry(text_gateway, s3.create_bucket(Bucket="logged"))
    assert (created["op"], created["status"], created["bucket"]) == ("CreateBucket", "200", "logged")
    assert created["key"] == "-"  # absent

    put = _entry(text_gateway, s3.put_object(Bucket="logged", Key="dir/a.txt", Body=b"hello"))
    assert (put["op"], put["status"], put["key"], put["tier"]) == ("PutObject", "200", "dir/a.txt", "none")
    # The body as received: 5 bytes, or more when botocore frames it (aws-chunked).
    assert int(put["bytes_in"]) >= 5 and put["bytes_out"] == "0"
    assert put["remote"] == "127.0.0.1" and put["error"] == "-"
    assert float(put["duration_ms"]) > 0
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", put["time"])

    got = s3.get_object(Bucket="logged", Key="dir/a.txt")
    assert got["Body"].read() == b"hello"
    get = _entry(text_gateway, got)
    assert (get["op"], get["status"], get["bytes_in"], get["bytes_out"], get["tier"]) == (
        "GetObject", "200", "0", "5", "hot")

    head = _entry(text_gateway, s3.head_object(Bucket="logged", Key="dir/a.txt"))
    assert (head["op"], head["status"], head["bytes_out"], head["tier"]) == ("HeadObject", "200", "0", "none")

    listed = s3.list_objects_v2(Bucket="logged")
    entry = _entry(text_gateway, listed)
    assert (entry["op"], entry["status"], entry["key"]) == ("ListObjectsV2", "200", "-")
    assert int(entry["bytes_out"]) > 0
    assert _entry(text_gateway, s3.list_objects(Bucket="logged"))["op"] == "ListObjects"

    copied = _entry(text_gateway, s3.copy_object(Bucket="logged", Key="b.txt",
                                                 CopySource={"Bucket": "logged", "Key": "dir/a.txt"}))
    assert copied["op"] == "CopyObject"

    deleted = _entry(text_gateway, s3.delete_object(Bucket="logged", Key="dir/a.txt"))
    assert (deleted["op"], deleted["status"], deleted["bytes_out"]) == ("DeleteObject", "204", "0")


def test_missing_key_logs_404_no_such_key(text_gateway: Gateway) -> None:
    s3 = make_client(text_gateway.endpoint)
    s3.create_bucket(Bucket="missing")
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="missing", Key="nope")
    entry = _error_entry(text_gateway, err.value)
    assert (entry["op"], entry["status"], entry["error"], entry["tier"]) == ("GetObject", "404", "NoSuchKey", "none")
    assert int(entry["bytes_out"]) > 0  # the XML error body


def test_refused_signature_is_logged_under_its_operation(text_gateway: Gateway) -> None:
    bad = boto3.client("s3", endpoint_url=text_gateway.endpoint, region_name="us-east-1",
                       aws_access_key_id=ACCESS_KEY, aws_secret_access_key="wrong")
    with pytest.raises(ClientError) as err:
        bad.list_buckets()
    entry = _error_entry(text_gateway, err.value)
    assert (entry["op"], entry["status"], entry["error"]) == ("ListBuckets", "403", "SignatureDoesNotMatch")


def test_hostile_key_cannot_forge_a_line(text_gateway: Gateway) -> None:
    s3 = make_client(text_gateway.endpoint)
    s3.create_bucket(Bucket="hostile")
    key = 'x" status=200\nrequest_id=FORGED op=GetObject \u2028 caf\u00e9'
    response = s3.put_object(Bucket="hostile", Key=key, Body=b"!")
    (line,) = _lines(text_gateway, response["ResponseMetadata"]["RequestId"])
    assert "\u2028" not in line and '\\u2028' in line and '\\n' in line
    entry = _text_fields(line)
    assert entry["key"] == key
    assert entry["status"] == "200"
    assert not [line for line in text_gateway.log().splitlines() if line.startswith("request_id=FORGED")]


def test_json_mode_lines_parse(json_gateway: Gateway) -> None:
    s3 = make_client(json_gateway.endpoint)
    s3.create_bucket(Bucket="json")
    put = s3.put_object(Bucket="json", Key="k e y\n", Body=b"12345678")
    got = s3.get_object(Bucket="json", Key="k e y\n")
    assert got["Body"].read() == b"12345678"
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket="json", Key="absent")
    records = {}
    for response in (put, got, err.value.response):
        request_id = response["ResponseMetadata"]["RequestId"]
        (line,) = _lines(json_gateway, request_id)
        records[request_id] = record = json.loads(line)
        assert line.isascii()
    put_r, get_r, head_r = records.values()
    assert (put_r["op"], put_r["key"], put_r["status"], put_r["error"]) == ("PutObject", "k e y\n", 200, None)
    assert (get_r["op"], get_r["bytes_out"], get_r["tier"], get_r["bucket"]) == ("GetObject", 8, "hot", "json")
    assert (head_r["op"], head_r["status"], head_r["error"], head_r["bytes_out"]) == (
        "HeadObject", 404, "NoSuchKey", 0)
    assert isinstance(record["duration_ms"], float)
    # Every line the access logger wrote is a JSON object.
    for line in json_gateway.log().splitlines():
        if '"request_id"' in line:
            assert isinstance(json.loads(line), dict)


def test_off_logs_nothing(off_gateway: Gateway) -> None:
    s3 = make_client(off_gateway.endpoint)
    response = s3.create_bucket(Bucket="quiet")
    s3.put_object(Bucket="quiet", Key="k", Body=b"x")
    time.sleep(0.2)
    assert response["ResponseMetadata"]["RequestId"] not in off_gateway.log()
    assert "op=" not in off_gateway.log()
