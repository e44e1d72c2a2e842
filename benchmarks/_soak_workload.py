"""The soak's workload: what each client thread does and what it expects back.

A ``Plan`` (the data set, from the arguments) gives each thread its own keys
(``t007/...``); a ``Worker`` writes them from a shared ``Pool`` of random
bytes, then picks operations at random by ``WEIGHTS``, and keeps a model of
what every key holds (its ``Body``, ``None`` once deleted, ``UNKNOWN`` after a
failed write or delete). Every answer is checked against that model; a
difference raises ``Mismatch`` and is counted, with every failed request, in
the thread's ``Tally``. ``final_listing`` checks one listing of the whole
bucket against every thread's model, ``merge`` adds up the tallies.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from capacity import KiB, MiB

from gateway.client.batch import RequestFailed

BUCKET = "soak"
# Multipart through the transfer manager: parts of 8 MiB, 4 in flight per thread.
TRANSFER = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB,
                          max_concurrency=4)
READ_CHUNK = MiB
RANGE_MAX = 256 * KiB  # longest range GET of a small object; 16x that of a large one
MAX_ERRORS_KEPT = 20  # per thread, with their messages; all are counted

# Operation weights of a thread. The large kinds only for a thread that owns
# a large key (the others draw again).
WEIGHTS = {"get": 30, "get_range": 15, "head": 10, "write": 22, "delete": 6, "list": 5,
           "get_large": 2, "put_large": 1}
# --hostile adds these kinds to the mix (and the clients of _soak_hostile.py).
HOSTILE_WEIGHTS = {"batch": 8, "copy": 5, "abort_upload": 3}
KINDS = ("get", "get_large", "get_range", "head", "put", "overwrite", "put_large", "delete", "list",
         "batch", "copy", "abort_upload")
BATCH_MAX = 16  # keys in one GetBatch request
ABORTED_PART = 256 * KiB  # the one part an aborted multipart upload sends


class Mismatch(AssertionError):
    """A response that is not what the thread's model of its keys says."""


@dataclass(frozen=True, slots=True)
class Body:
    """What a key holds: ``size`` bytes of the payload pool from ``offset``."""

    offset: int
    size: int
    md5: str
    etag: str  # as S3 answers it, quotes included


UNKNOWN = object()  # a key whose last write or delete failed: its state is not known


class Pool:
    """Random bytes objects are cut from (so no body is generated per PUT)."""

    def __init__(self, size: int, seed: int) -> None:
        self.data = random.Random(seed).randbytes(size)
        self.view = memoryview(self.data)

    def body(self, rng: random.Random, size: int, multipart: bool) -> tuple[Body, memoryview]:
        offset = rng.randrange(len(self.data) - size + 1)
        data = self.view[offset:offset + size]
        md5 = hashlib.md5(data).hexdigest()
        etag = multipart_etag(data, TRANSFER.multipart_chunksize) if multipart else md5
        return Body(offset, size, md5, f'"{etag}"'), data


def multipart_etag(data: memoryview, part: int) -> str:
    """S3's ETag of a multipart upload in parts of ``part`` bytes: the MD5 of
    the parts' MD5s, a dash, the number of parts."""
    digests = [hashlib.md5(data[i:i + part]).digest() for i in range(0, len(data), part)]
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


def log_uniform(rng: random.Random, low: int, high: int) -> int:
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def log_uniform_mean(low: int, high: int) -> float:
    return (high - low) / math.log(high / low) if high > low else float(low)


@dataclass
class Plan:
    """The data set and the workload, from the arguments."""

    threads: int
    small_keys: int  # per thread
    large_keys: int  # in all, key j owned by thread j % threads
    small: tuple[int, int]
    large: tuple[int, int]

    @classmethod
    def of(cls, args: argparse.Namespace) -> Plan:
        large_bytes = args.large_objects * log_uniform_mean(args.large_min, args.large_max)
        small_bytes = args.dataset_size - large_bytes
        if small_bytes <= 0:
            raise SystemExit("the large objects alone exceed --dataset-size")
        per_thread = small_bytes / args.threads / log_uniform_mean(args.small_min, args.small_max)
        return cls(args.threads, max(1, round(per_thread)), args.large_objects,
                   (args.small_min, args.small_max), (args.large_min, args.large_max))

    def keys_of(self, slot: int) -> tuple[list[str], list[str]]:
        small = [f"t{slot:03d}/small/{i:05d}.bin" for i in range(self.small_keys)]
        owned = range(slot, self.large_keys, self.threads)
        large = [f"t{slot:03d}/large/{j:03d}.bin" for j in owned]
        return small, large


@dataclass
class Tally:
    """One thread's results (merged at the end; no locks while it runs)."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    errors: Counter[str] = field(default_factory=Counter)
    first_errors: list[dict] = field(default_factory=list)
    bytes_up: int = 0
    bytes_down: int = 0
    verified_bytes: int = 0
    slowed: int = 0  # batch requests answered 503 SlowDown and retried

    def error(self, kind: str, key: str, exc: BaseException) -> None:
        self.errors[kind] += 1
        # At the wall clock's time, to find it in the gateway's log.
        if len(self.first_errors) < MAX_ERRORS_KEPT:
            self.first_errors.append({"at": time.strftime("%H:%M:%S"), "kind": kind, "key": key,
                                      "error": repr(exc)[:500]})

    @property
    def ops(self) -> int:
        return sum(len(v) for v in self.latencies.values())


class Worker:
    """One client thread: its keys, what they hold, and the operations on them."""

    def __init__(self, slot: int, s3: Any, plan: Plan, pool: Pool, seed: int,
                 hostile: bool = False, rate: float = 0.0, batch: Any = None, retries: int = 1) -> None:
        self.s3, self.batch_client = s3, batch
        self.retries = retries  # of a batch answered 503 SlowDown, as botocore retries the others
        self.interval = 1.0 / rate if rate > 0 else 0.0  # this thread's share of --rate
        self.plan, self.pool = plan, pool
        self.rng = random.Random(f"{seed}/{slot}")
        self.prefix = f"t{slot:03d}/"
        self.small, self.large = plan.keys_of(slot)
        self.keys = self.small + self.large
        self.model: dict[str, object] = dict.fromkeys(self.keys)
        self.ops: dict[str, Callable[[str], None]] = {
            "put": self.write, "overwrite": self.write, "put_large": self.write,
            "delete": self.delete, "get": self.get, "get_large": self.get,
            "head": self.head, "get_range": self.get_range, "batch": self.batch,
            "copy": self.copy, "abort_upload": self.abort_upload,
        }
        self.tally = Tally()
        weights = WEIGHTS | (HOSTILE_WEIGHTS if hostile else {})
        self.kinds = [k for k in weights if self.large or not k.endswith("_large")]
        self.weights = [weights[k] for k in self.kinds]

    # -- the loop -------------------------------------------------------------

    def fill(self, stop: threading.Event) -> None:
        """Write every key once (not counted as timed operations)."""
        for key in self.keys:
            if stop.is_set():
                return
            self.timed("fill", key, self.write)

    def run(self, deadline: float, stop: threading.Event) -> None:
        """Operations until ``deadline``: back to back, or one every
        ``interval`` seconds on a fixed schedule (a late one does not
        shorten the next wait below zero, so a slow gateway is not hit by
        a burst to catch up)."""
        tick = time.perf_counter()
        while time.perf_counter() < deadline and not stop.is_set():
            self.step()
            if self.interval:
                tick = max(tick + self.interval, time.perf_counter() - self.interval)
                stop.wait(max(0.0, tick - time.perf_counter()))

    def step(self) -> None:
        kind = self.rng.choices(self.kinds, self.weights)[0]
        if kind == "list":
            self.timed("list", self.prefix, lambda _: self.list())
            return
        if kind in ("batch", "abort_upload"):
            self.timed(kind, self.prefix, self.ops[kind])
            return
        if kind == "get_range":
            key = self.rng.choice(self.keys)
        else:
            key = self.rng.choice(self.large if kind.endswith("_large") else self.small)
        state = self.model[key]
        if (kind in ("write", "put_large") or state is UNKNOWN
                or (state is None and kind in ("delete", "get_range", "get_large", "copy"))):
            kind = ("put_large" if key in self.large
                    else "overwrite" if isinstance(state, Body) else "put")
        self.timed(kind, key, self.ops[kind])

    def timed(self, kind: str, key: str, op: Callable[[str], None]) -> None:
        t0 = time.perf_counter()
        try:
            op(key)
        except Exception as exc:  # noqa: BLE001  (every failure is counted; the run goes on)
            self.tally.error(kind, key, exc)
            return
        if kind != "fill":
            self.tally.latencies[kind].append(time.perf_counter() - t0)

    # -- operations -------------------------------------------------------------

    def write(self, key: str) -> None:
        large = key in self.large
        low, high = self.plan.large if large else self.plan.small
        body, data = self.pool.body(self.rng, log_uniform(self.rng, low, high), multipart=large)
        self.model[key] = UNKNOWN  # until acknowledged
        if large:
            self.s3.upload_fileobj(io.BytesIO(data), BUCKET, key, Config=TRANSFER)
        else:
            self.s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(data))
        self.model[key] = body
        self.tally.bytes_up += body.size

    def delete(self, key: str) -> None:
        self.model[key] = UNKNOWN
        self.s3.delete_object(Bucket=BUCKET, Key=key)
        self.model[key] = None

    def get(self, key: str) -> None:
        expected = self.model[key]
        if expected is None:
            self.expect_missing(key, lambda: self.s3.get_object(Bucket=BUCKET, Key=key),
                                "NoSuchKey")
            return
        digest, size = hashlib.md5(), 0
        stream = self.s3.get_object(Bucket=BUCKET, Key=key)["Body"]
        for chunk in stream.iter_chunks(READ_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        self.tally.bytes_down += size
        if (size, digest.hexdigest()) != (expected.size, expected.md5):
            raise Mismatch(f"{key}: GET answered {size} bytes, MD5 {digest.hexdigest()}; "
                           f"expected {expected.size}, {expected.md5}")
        self.tally.verified_bytes += size

    def get_range(self, key: str) -> None:
        expected = self.model[key]
        longest = RANGE_MAX * (16 if key in self.large else 1)
        start = self.rng.randrange(expected.size)
        end = min(expected.size, start + self.rng.randint(1, longest))  # exclusive
        answer = self.s3.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={start}-{end - 1}")
        got = answer["Body"].read()
        self.tally.bytes_down += len(got)
        if got != self.pool.view[expected.offset + start:expected.offset + end]:
            raise Mismatch(f"{key}: bytes {start}-{end - 1} differ ({len(got)} bytes answered)")
        self.tally.verified_bytes += len(got)

    def _batch_members(self, keys: list[str]) -> list[tuple[str, Any]]:
        """The batch's members, retried as an SDK retries a 503 SlowDown:
        up to ``retries`` times, after a jittered, doubling wait."""
        attempt = 0
        while True:
            try:
                return list(self.batch_client.get_batch(BUCKET, keys))
            except RequestFailed as exc:
                if exc.status != 503 or attempt >= self.retries:
                    raise
            self.tally.slowed += 1
            time.sleep(self.rng.uniform(0, min(5.0, 0.1 * 2 ** attempt)))
            attempt += 1

    def batch(self, _prefix: str) -> None:
        """GetBatch of a few of the thread's small keys: each member's bytes
        checked, a deleted key answered as an error member."""
        keys = self.rng.sample(self.small, min(len(self.small), self.rng.randint(2, BATCH_MAX)))
        expected = {k: self.model[k] for k in keys}
        got = self._batch_members(keys)
        if [k for k, _ in got] != keys:
            raise Mismatch(f"batch of {len(keys)} keys answered {len(got)} members")
        for key, data in got:
            want = expected[key]
            if want is UNKNOWN:
                continue
            if want is None:
                if isinstance(data, bytes):
                    raise Mismatch(f"{key}: deleted, yet in a batch")
                continue
            if not isinstance(data, bytes) or hashlib.md5(data).hexdigest() != want.md5:
                raise Mismatch(f"{key}: batch member differs ({data!r:.80})")
            self.tally.bytes_down += len(data)
            self.tally.verified_bytes += len(data)

    def copy(self, key: str) -> None:
        """CopyObject from ``key`` onto another of the thread's small keys."""
        source = self.model[key]
        target = self.rng.choice(self.small)
        if target == key or key in self.large:
            self.write(key)
            return
        self.model[target] = UNKNOWN
        self.s3.copy_object(Bucket=BUCKET, Key=target, CopySource={"Bucket": BUCKET, "Key": key})
        self.model[target] = source

    def abort_upload(self, prefix: str) -> None:
        """A multipart upload of a new key given up after one part."""
        key = f"{prefix}aborted/{self.rng.getrandbits(64):016x}.bin"
        _body, data = self.pool.body(self.rng, ABORTED_PART, multipart=False)
        upload = self.s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
        try:
            self.s3.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=1,
                                Body=bytes(data))
            self.tally.bytes_up += len(data)
        finally:
            self.s3.abort_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload)

    def head(self, key: str) -> None:
        expected = self.model[key]
        if expected is None:
            self.expect_missing(key, lambda: self.s3.head_object(Bucket=BUCKET, Key=key), "404")
            return
        got = self.s3.head_object(Bucket=BUCKET, Key=key)
        if (got["ContentLength"], got["ETag"]) != (expected.size, expected.etag):
            raise Mismatch(f"{key}: HEAD answered {got['ContentLength']} bytes, "
                           f"ETag {got['ETag']}; "
                           f"expected {expected.size}, {expected.etag}")

    def list(self) -> None:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=self.prefix)
        check_listing(((o["Key"], o["Size"], o["ETag"]) for page in pages
                       for o in page.get("Contents", ())), [self.model], self.prefix)

    @staticmethod
    def expect_missing(key: str, request: Callable[[], object], code: str) -> None:
        try:
            request()
        except ClientError as exc:
            if exc.response["Error"]["Code"] == code:
                return
            raise
        raise Mismatch(f"{key}: deleted, yet found")


def check_listing(listed: Iterable[tuple[str, int, str]], models: list[dict[str, object]],
                  where: str) -> int:
    """Compare listed (key, size, ETag) with the models; keys of unknown
    state are left out. The number of keys listed."""
    expected = {k: (b.size, b.etag) for m in models for k, b in m.items() if isinstance(b, Body)}
    unknown = {k for m in models for k, b in m.items() if b is UNKNOWN}
    got = {key: (size, etag) for key, size, etag in listed if key not in unknown}
    if got != expected:
        missing = sorted(expected.keys() - got.keys())[:5]
        extra = sorted(got.keys() - expected.keys())[:5]
        changed = sorted(k for k in expected.keys() & got.keys() if expected[k] != got[k])[:5]
        raise Mismatch(f"listing of {where!r}: missing {missing}, unexpected {extra}, "
                       f"other size or ETag {changed}")
    return len(got)


def final_listing(workers: list[Worker]) -> dict:
    """One listing of the whole bucket, checked against every thread's keys."""
    pages = workers[0].s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    try:
        keys = check_listing(((o["Key"], o["Size"], o["ETag"]) for page in pages
                              for o in page.get("Contents", ())), [w.model for w in workers], "")
    except Exception as exc:  # noqa: BLE001  (reported as an error of the run)
        return {"ok": False, "error": repr(exc)[:1000]}
    return {"ok": True, "keys": keys}


def merge(tallies: list[Tally], fill_errors: int) -> dict:
    """Every thread's tally added up, latencies pooled by kind."""
    latencies = {k: [x for t in tallies for x in t.latencies[k]] for k in KINDS}
    errors = sum((t.errors for t in tallies), Counter())
    first = sorted((e for t in tallies for e in t.first_errors), key=lambda e: e["at"])
    return {"latencies": latencies, "errors_by_kind": dict(errors),
            "errors": errors.total(), "fill_errors": fill_errors,
            "first_errors": first[:MAX_ERRORS_KEPT],
            "bytes_up": sum(t.bytes_up for t in tallies),
            "bytes_down": sum(t.bytes_down for t in tallies),
            "verified_bytes": sum(t.verified_bytes for t in tallies),
            "batches_slowed": sum(t.slowed for t in tallies)}
