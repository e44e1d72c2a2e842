"""What the recipes in this folder share: where the gateway is, sample bytes
that can be made again from a seed, and failing loudly on a mismatch.

The gateway is found through the standard AWS environment, as
``eval "$(tierstore env)"`` sets it: ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION`` (or
``AWS_REGION``), and
for the admin API (epoch hints, ``GET /epochs``) ``TIERSTORE_ADMIN_URL`` and
``TIERSTORE_ADMIN_TOKEN``. Nothing else is read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any, NoReturn

KiB = 1024
MiB = 1024 * KiB


def endpoint() -> str:
    """The gateway's S3 endpoint, for clients that do not read it themselves."""
    url = os.environ.get("AWS_ENDPOINT_URL")
    if not url:
        fail('AWS_ENDPOINT_URL is not set: run  eval "$(tierstore env)"  first')
    return url


def region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def arguments(doc: str | None, bucket: str, **extra: Any) -> argparse.Namespace:
    """``--bucket`` (default ``bucket``) and the recipe's own flags, given as
    ``name=(default, help)``; fails at once if the environment names no
    gateway, rather than let a client fall back to AWS."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--bucket", default=bucket,
                        help=f"bucket to use (default {bucket}); created if missing")
    for name, (default, text) in extra.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true", help=text)
        else:
            parser.add_argument(flag, type=type(default), default=default, help=text)
    args = parser.parse_args()
    endpoint()
    return args


def create_bucket(s3: Any, bucket: str) -> None:
    """``s3.create_bucket`` with a boto3 client; a second run finds it there."""
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass


class RandomIndices:
    """A sampler without torch: a new permutation of ``range(n)`` each epoch."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.rng = n, random.Random(seed)

    def __iter__(self) -> Iterator[int]:
        return iter(self.rng.sample(range(self.n), self.n))

    def __len__(self) -> int:
        return self.n


def payload(name: str, size: int, seed: int = 0) -> bytes:
    """``size`` pseudo-random bytes, the same for the same name and seed."""
    return random.Random(f"{seed}:{name}").randbytes(size)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fail(message: str) -> NoReturn:
    print(f"FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def check(condition: object, message: str) -> None:
    if not condition:
        fail(message)


def same_bytes(what: str, got: bytes, want: bytes) -> None:
    """Fail with both sizes and digests unless ``got`` is ``want``."""
    if got != want:
        fail(f"{what}: read {len(got)} bytes sha256 {sha256(got)[:16]}, "
             f"wrote {len(want)} bytes sha256 {sha256(want)[:16]}")


def mib(size: int) -> str:
    return f"{size / MiB:.1f} MiB"


def rate(count: int, size: int, seconds: float) -> str:
    seconds = max(seconds, 1e-9)
    return f"{count / seconds:,.0f} samples/s, {size / MiB / seconds:.1f} MiB/s"


def admin(path: str) -> Any:
    """GET from the gateway's admin API (``TIERSTORE_ADMIN_URL``, bearer
    ``TIERSTORE_ADMIN_TOKEN``); the decoded JSON."""
    url = os.environ.get("TIERSTORE_ADMIN_URL", "http://127.0.0.1:9101").rstrip("/") + path
    token = os.environ.get("TIERSTORE_ADMIN_TOKEN", "")
    try:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)
    except OSError as exc:
        fail(f"admin API {url}: {exc}")


def last_epoch(bucket: str, epoch_id: str | None = None, wait: float = 5.0) -> dict[str, Any]:
    """The epoch ``epoch_id`` (else the bucket's newest) from ``GET /epochs``,
    waiting up to ``wait`` seconds while it is still active."""
    deadline = time.monotonic() + wait
    while True:
        epochs = [e for e in admin("/epochs")["epochs"]
                  if e["bucket"] == bucket and (epoch_id is None or e["id"] == epoch_id)]
        check(epochs, f"no epoch of bucket {bucket} in GET /epochs: was the hint registered?")
        if epochs[0]["state"] != "active" or time.monotonic() > deadline:
            return epochs[0]
        time.sleep(0.1)


def epoch_line(epoch: dict[str, Any]) -> str:
    ratio = "n/a" if epoch["hit_ratio"] is None else f"{epoch['hit_ratio']:.2f}"
    return (f"epoch {epoch['id']}: {epoch['state']}, "
            f"{epoch['consumed']}/{epoch['objects']} objects read, "
            f"hit ratio {ratio}, {epoch['prefetched_objects']} prefetched")
