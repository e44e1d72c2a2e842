"""Hot reads keep their files' descriptors open (tiering/hot/open_files.py): a
real gateway read by boto3 keeps them, answers the same bytes from them,
and lets go of an evicted file's descriptor (its disk space comes back)
though the eviction ran on another thread."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.conftest import make_client
from tests.servers import Gateway


def _hot_files_held(gw: Gateway) -> list[str]:
    """Where the gateway's descriptors into its hot tier point."""
    assert gw.proc is not None
    held = []
    fd_dir = Path(f"/proc/{gw.proc.pid}/fd")
    for entry in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / entry)
        except OSError:  # closed meanwhile
            continue
        if "/hot/" in target:
            held.append(target)
    return held


def test_hot_reads_keep_descriptors_and_evictions_release_them(fresh_gateway: Gateway) -> None:
    gw = fresh_gateway
    s3 = make_client(gw.endpoint)
    s3.create_bucket(Bucket="kept")
    bodies = {f"k{i}": os.urandom(20_000 + i) for i in range(8)}
    for key, body in bodies.items():
        s3.put_object(Bucket="kept", Key=key, Body=body)
    assert gw.admin("POST", "/jobs/flush", params={"wait": "true"}).json()["state"] == "succeeded"
    for _ in range(2):  # the second read of each is from its kept descriptor
        for key, body in bodies.items():
            assert s3.get_object(Bucket="kept", Key=key)["Body"].read() == body
    held = _hot_files_held(gw)
    assert len([t for t in held if "/cache/" in t and "(deleted)" not in t]) >= 1, held

    evicted = gw.admin("POST", "/jobs/evict", params={"wait": "true"}, json={"bucket": "kept"}).json()
    assert evicted["state"] == "succeeded" and evicted["result"]["evicted_bytes"] > 0
    deadline = time.monotonic() + 10
    while [t for t in _hot_files_held(gw) if "(deleted)" in t]:
        assert time.monotonic() < deadline, f"evicted files still held: {_hot_files_held(gw)}"
        time.sleep(0.05)
    for key, body in bodies.items():  # read again through the store, then kept again
        assert s3.get_object(Bucket="kept", Key=key)["Body"].read() == body
