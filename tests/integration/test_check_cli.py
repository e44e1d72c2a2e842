"""`tierstore check` on a data dir a real gateway wrote."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import make_client
from tests.servers import Gateway


def run_check(gw: Gateway) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--data-dir", str(gw.data_dir)],
        capture_output=True, text=True, timeout=60,
    )


def test_check_passes_then_finds_a_lost_file(fresh_gateway: Gateway) -> None:
    s3 = make_client(fresh_gateway.endpoint)
    s3.create_bucket(Bucket="chk")
    s3.put_object(Bucket="chk", Key="a", Body=b"abc")
    fresh_gateway.stop()
    ok = run_check(fresh_gateway)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "consistent" in ok.stdout
    hot = fresh_gateway.data_dir / "hot"
    victim = next(p for p in hot.rglob("*") if p.is_file() and p.parent != hot)  # an object's file
    content = victim.read_bytes()
    victim.unlink()
    bad = run_check(fresh_gateway)
    assert bad.returncode == 1
    assert "is missing" in bad.stdout
    victim.write_bytes(content)  # the fixture checks the directory again
