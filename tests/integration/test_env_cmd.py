"""`tierstore env`: the exports a training job's shell evals to reach the gateway.

The clients are real: the AWS CLI and boto3 get nothing but the environment
the command printed, and the admin CLI finds the API from it too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import clean_env
from tests.servers import Gateway

BIN = Path(sys.executable).parent
# The gateway generates its own keys and token: nothing configured.
GENERATED = {"TIERSTORE_ACCESS_KEY": "", "TIERSTORE_SECRET_KEY": "", "TIERSTORE_ADMIN_TOKEN": ""}


def _clean_env(home: Path, **extra: str) -> dict[str, str]:
    return clean_env(home, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra)


@pytest.fixture
def generated_gateway(tmp_path: Path) -> Iterator[Gateway]:
    gw = Gateway(tmp_path / "data", extra_env=GENERATED).start()
    try:
        yield gw
    finally:
        gw.stop()


def test_eval_env_points_the_aws_cli_boto3_and_the_admin_cli_at_the_gateway(
    generated_gateway: Gateway, tmp_path: Path
) -> None:
    gw = generated_gateway
    script = f"""
        set -euo pipefail
        eval "$(tierstore env --data-dir {gw.data_dir})"
        aws s3 mb s3://from-env
        echo hello > hello.txt
        aws s3 cp hello.txt s3://from-env/greeting.txt
        aws s3 ls s3://from-env/
        python -c 'import boto3; print(boto3.client("s3").get_object(Bucket="from-env", Key="greeting.txt")["Body"].read().decode())'
        tierstore status
    """
    env = _clean_env(tmp_path, TIERSTORE_PORT=str(gw.port), TIERSTORE_ADMIN_PORT=str(gw.admin_port))
    done = subprocess.run(
        ["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "greeting.txt" in done.stdout
    assert "\nhello\n" in done.stdout
    assert "hot tier" in done.stdout.lower()


def test_configured_keys_win_and_are_quoted(tmp_path: Path) -> None:
    env = _clean_env(
        tmp_path,
        TIERSTORE_ACCESS_KEY="AKCONFIGURED",
        TIERSTORE_SECRET_KEY="it's a $ecret",
        TIERSTORE_ADMIN_TOKEN="tok",
        TIERSTORE_HOST="0.0.0.0",
        TIERSTORE_PORT="9400",
    )
    done = subprocess.run(
        ["bash", "-c", 'eval "$(tierstore env)"; printf "%s|" "$AWS_ENDPOINT_URL" '
         '"$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" "$TIERSTORE_ADMIN_TOKEN"'],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "http://127.0.0.1:9400|AKCONFIGURED|it's a $ecret|tok|"

