"""Several gateway key pairs from a config file, each usable by a real client."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from tests.conftest import assert_consistent
from tests.servers import ACCESS_KEY, Gateway


def client(gw: Gateway, access_key: str, secret_key: str):
    return boto3.client(
        "s3", endpoint_url=gw.endpoint, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        region_name="us-east-1", config=BotoConfig(retries={"max_attempts": 1}),
    )


def test_every_configured_pair_works_and_others_do_not(tmp_path) -> None:
    config = tmp_path / "tierstore.toml"
    config.write_text('[credentials]\ntrainer = "trainer-secret"\netl = "etl-secret"\n')
    gw = Gateway(tmp_path / "data", extra_args=["--config", str(config)]).start()
    try:
        trainer = client(gw, "trainer", "trainer-secret")
        etl = client(gw, "etl", "etl-secret")
        trainer.create_bucket(Bucket="shared")
        etl.put_object(Bucket="shared", Key="written-by-etl", Body=b"rows")
        assert trainer.get_object(Bucket="shared", Key="written-by-etl")["Body"].read() == b"rows"
        # The environment's pair (the test harness sets one) works alongside.
        assert any(b["Name"] == "shared" for b in client(gw, ACCESS_KEY, gw.env()["TIERSTORE_SECRET_KEY"]).list_buckets()["Buckets"])
        with pytest.raises(ClientError) as err:
            client(gw, "trainer", "etl-secret").list_buckets()
        assert err.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
        with pytest.raises(ClientError) as err:
            client(gw, "intruder", "whatever").list_buckets()
        assert err.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    finally:
        gw.stop()
    assert_consistent(gw)
