"""When staged data fills the hot tier (the capacity store is unreachable,
so nothing can be flushed), PUTs slow down with 503 SlowDown: none fails
silently, the disk never fills past the budget, and once the store is back
the backlog flushes and writes are accepted again."""

from __future__ import annotations

import time
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.conftest import assert_consistent, make_client
from tests.servers import Gateway, free_port

MiB = 1024 * 1024


def _moto(port: int):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server


def test_full_hot_tier_slows_writes_down_and_recovers(tmp_path: Path) -> None:
    port = free_port()
    moto = _moto(port)
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="cap")
    gw = Gateway(tmp_path / "data", extra_args=[
        "--hot-size", "16M", "--capacity", "s3://cap", "--capacity-endpoint", endpoint,
        "--capacity-access-key", "testing", "--capacity-secret-key", "testing", "--flush-delay", "1",
    ]).start()
    try:
        s3 = make_client(gw.endpoint)
        s3.create_bucket(Bucket="full")
        moto.stop()  # the capacity store goes away: nothing can be flushed
        moto = None
        acknowledged = {}
        with pytest.raises(ClientError) as refused:
            for i in range(40):
                s3.put_object(Bucket="full", Key=f"k{i}", Body=bytes([i]) * MiB)
                acknowledged[f"k{i}"] = bytes([i]) * MiB
        error = refused.value.response
        assert error["Error"]["Code"] == "SlowDown"
        assert error["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert 8 <= len(acknowledged) <= 16
        status = gw.admin("GET", "/tiers").json()
        assert status["hot_staged"] + status["hot_reserved"] <= 16 * MiB
        assert status["last_flush_error"]

        moto = _moto(port)  # back (empty: a new store at the same address)
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket="cap")
        deadline = time.monotonic() + 60
        while gw.admin("GET", "/tiers").json()["hot_staged"] > 0:
            assert time.monotonic() < deadline, "the backlog never flushed"
            time.sleep(0.2)
        s3.put_object(Bucket="full", Key="after", Body=b"accepted again")
        for key, data in acknowledged.items():
            assert s3.get_object(Bucket="full", Key=key)["Body"].read() == data
    finally:
        gw.stop()
        if moto is not None:
            moto.stop()
    assert_consistent(gw)
