"""Fixtures for the client-compatibility tests (s3fs and the AWS CLI), and
a fault proxy in front of moto for the modules that do not define their own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults import FaultProxy
from tests.integration.s3raw import http, s3r  # noqa: F401  (fixtures shared by the test modules)
from tests.servers import ACCESS_KEY, SECRET_KEY, Gateway

AWS_BIN = Path(sys.executable).with_name("aws")


@pytest.fixture(scope="module")
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    """A proxy in front of moto that injects nothing unless a test tells it
    to (``proxy.rates``), one per module; it counts what it forwards."""
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


@pytest.fixture
def fs(gateway: Gateway):
    """An s3fs filesystem on the session gateway, without listing cache."""
    import s3fs

    return s3fs.S3FileSystem(
        key=ACCESS_KEY,
        secret=SECRET_KEY,
        endpoint_url=gateway.endpoint,
        use_listings_cache=False,
        skip_instance_cache=True,
        client_kwargs={"region_name": "us-east-1"},
    )


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without the caller's AWS_* and TIERSTORE_*,
    with a HOME of its own, no AWS config files and no instance metadata,
    plus ``extra``: what a client subprocess of a test starts from."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIERSTORE_"))}
    env.update(
        HOME=str(home),
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
        AWS_EC2_METADATA_DISABLED="true",
        **extra,
    )
    return env


def aws_env(home: Path) -> dict[str, str]:
    """:func:`clean_env` with the test gateway's key pair and region."""
    return clean_env(
        home, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION="us-east-1"
    )


class AwsRunner:
    """Runs ``aws <args> --endpoint-url <gateway>`` with a clean environment."""

    def __init__(self, endpoint: str, env: dict[str, str]) -> None:
        self.endpoint = endpoint
        self.env = env

    def _start(self, args: tuple[str, ...]) -> subprocess.Popen:
        cmd = [str(AWS_BIN), *args, "--endpoint-url", self.endpoint]
        return subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @staticmethod
    def _finish(args: tuple[str, ...], proc: subprocess.Popen, check: bool, timeout: float) -> subprocess.CompletedProcess:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"aws {' '.join(args)} timed out\nstdout:\n{out}\nstderr:\n{err}") from None
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"aws {' '.join(args)} exited {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
            )
        return done

    def __call__(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """One command; fails the test on a non-zero exit unless check=False."""
        return self._finish(args, self._start(args), check, timeout)

    def parallel(self, *commands: tuple[str, ...], timeout: float = 120) -> list[subprocess.CompletedProcess]:
        """Independent commands at once (each CLI start costs ~1 s of CPU)."""
        procs = [(args, self._start(args)) for args in commands]
        return [self._finish(args, proc, True, timeout) for args, proc in procs]


@pytest.fixture
def aws(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> AwsRunner:
    assert AWS_BIN.exists(), f"AWS CLI not found at {AWS_BIN}"
    return AwsRunner(gateway.endpoint, aws_env(tmp_path_factory.mktemp("aws-home")))
