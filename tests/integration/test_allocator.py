"""The gateway on jemalloc (its default where the library is installed, or
``TIERSTORE_MALLOC=jemalloc``): ``serve`` runs itself again with the
library preloaded (gateway/config/allocator.py), and serves S3 from that
process, which says so in ``GET /stats``; ``TIERSTORE_MALLOC=glibc`` keeps
glibc's malloc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config.allocator import jemalloc_library
from tests.conftest import make_client
from tests.servers import Gateway

JEMALLOC = jemalloc_library()


@pytest.mark.skipif(JEMALLOC is None, reason="libjemalloc2 is not installed (scripts/test installs it as root)")
def test_a_gateway_asked_for_jemalloc_serves_on_it(tmp_path: Path) -> None:
    gw = Gateway(tmp_path / "data", extra_env={"TIERSTORE_MALLOC": "jemalloc"}).start()
    try:
        pid = gw.proc.pid  # type: ignore[union-attr]  # the same process after the execve
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "libjemalloc" in maps
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert any(item.startswith(b"MALLOC_CONF=background_thread:true") for item in environ)
        s3 = make_client(gw.endpoint)
        s3.create_bucket(Bucket="onjemalloc")
        body = os.urandom(3 * 1024 * 1024 + 17)
        s3.put_object(Bucket="onjemalloc", Key="k", Body=body)
        assert s3.get_object(Bucket="onjemalloc", Key="k")["Body"].read() == body
        assert gw.admin("GET", "/stats").json()["memory"]["allocator"] == "jemalloc"
    finally:
        gw.stop()


def test_a_gateway_on_its_default_runs_on_jemalloc_where_it_is_installed(gateway: Gateway) -> None:
    assert gateway.admin("GET", "/stats").json()["memory"]["allocator"] == ("glibc" if JEMALLOC is None else "jemalloc")


def test_a_gateway_asked_for_glibc_runs_on_it(tmp_path: Path) -> None:
    gw = Gateway(tmp_path / "data", extra_env={"TIERSTORE_MALLOC": "glibc"}).start()
    try:
        assert "libjemalloc" not in Path(f"/proc/{gw.proc.pid}/maps").read_text()  # type: ignore[union-attr]
        assert gw.admin("GET", "/stats").json()["memory"]["allocator"] == "glibc"
    finally:
        gw.stop()


def test_an_unknown_allocator_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--data-dir", str(tmp_path / "data"), "--port", "0"],
        env={**os.environ, "TIERSTORE_MALLOC": "tcmalloc"}, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "TIERSTORE_MALLOC='tcmalloc'" in done.stderr and "jemalloc" in done.stderr
