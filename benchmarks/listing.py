"""Listing a bucket of 1,000,000 keys through the gateway.

Setup writes the keys straight into the index of a fresh data directory
(rocksdict write batches, no per-key fsync, no object bytes: listing never
opens them) before the gateway starts on it. Then, through boto3:

  (a) full ListObjectsV2 pagination of every key, 1000 per page;
  (b) one delimiter listing of "train/" (its 1000 common prefixes);
  (c) one page of 1000 keys from the middle (StartAfter), p50 of 20 runs.

And where the time of (a) goes:

  - wall time, and the CPU time of the gateway process (from /proc) and of
    the client process, over the whole pagination;
  - the same pages as raw SigV4-signed GETs over one keep-alive httpx
    connection, bodies not parsed: the gateway's own throughput (SigV4,
    routing, index scan, XML build, HTTP) with a near-free client;
  - in the benchmark process, before the gateway starts: the index scan
    (Index.list_objects) and the XML builder (xml.list_objects_v2) alone;
  - botocore's parse of one 1000-key page, with its default timestamp
    parser (dateutil) and with datetime.fromisoformat, times the page count.

Run:  .venv/bin/python benchmarks/listing.py [--keys 1000000] [--runs 1]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Self
from urllib.parse import quote

import _common  # first: puts the repo root on sys.path
import httpx
import msgpack
from _common import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    client,
    fast_timestamp,
    gateway,
    machine,
    percentile,
    process_cpu,
    table,
    temp_dir,
)
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from rocksdict import WriteBatch, WriteOptions

from gateway.s3 import xml
from tiering.index.db import Index
from tiering.meta import BucketInfo, Chunk, ObjectMeta, now_ms

BUCKET = "bench"
DIRS_PREFIX = "train/"
TARGET_S = 10.0


def key_of(i: int, per_dir: int) -> str:
    return f"train/shard-{i // per_dir:05d}/sample-{i:07d}.jpg"


# -- setup -------------------------------------------------------------------


def populate(data_dir: Path, n_keys: int, per_dir: int, batch_size: int = 50_000) -> float:
    """Write ``n_keys`` object records into the index at data_dir/index
    (where tiering.objects.ObjectService keeps it). Returns seconds taken.

    Records are ObjectMeta's own encoding: one template ObjectMeta is turned
    into its msgpack map once, and each key changes the fields that differ
    (checked byte for byte against ObjectMeta.to_bytes on the first keys).
    Timestamps are 3 ms apart, as if the dataset had been uploaded at ~330
    objects/s over the last hour or so.
    """
    t0 = time.perf_counter()
    index = Index(data_dir / "index")
    try:
        index.create_bucket(BucketInfo(name=BUCKET, created_ms=now_ms()))
        db = index._db  # the Rdict; one unsynced batch per 50k keys, one sync at the end
        no_sync = WriteOptions()
        base = b"O" + BUCKET.encode() + b"\x00"  # key layout: tiering/index/db.py docstring
        first_ms = now_ms() - 3 * n_keys
        template = ObjectMeta(bucket=BUCKET, key="", size=0, etag="", last_modified_ms=0, seq=0,
                              content_type="image/jpeg", chunks=(Chunk(file_id="", size=0),))
        plain = template.to_plain()
        chunk = plain["chunks"][0]
        pack = msgpack.Packer(use_bin_type=True).pack
        md5 = hashlib.md5
        batch = WriteBatch(raw_mode=True)
        for i in range(n_keys):
            key = key_of(i, per_dir)
            size = 60_000 + (i * 7919) % 140_000  # 60-200 kB, like JPEG samples
            plain["key"] = key
            plain["size"] = chunk["size"] = size
            plain["etag"] = md5(key.encode()).hexdigest()
            plain["last_modified_ms"] = first_ms + 3 * i
            plain["seq"] = i + 1
            chunk["file_id"] = f"bench{i:019x}"  # no such file: listing never opens it
            record = pack(plain)
            if i < 3:
                meta = ObjectMeta(bucket=BUCKET, key=key, size=size, etag=plain["etag"],
                                  last_modified_ms=plain["last_modified_ms"], seq=i + 1,
                                  content_type="image/jpeg", chunks=(Chunk(chunk["file_id"], size),))
                assert record == meta.to_bytes(), "ObjectMeta encoding changed; update populate()"
            batch.put(base + key.encode(), record)
            if len(batch) >= batch_size:
                db.write(batch, no_sync)
                batch = WriteBatch(raw_mode=True)
        batch.put(b"Sseq", n_keys.to_bytes(8, "big"))
        synced = WriteOptions()
        synced.sync = True
        db.write(batch, synced)
        db.flush(True)
        # Compact to the layout a long-lived index settles into, so that the
        # in-process measurements and the gateway see the same SST files
        # rather than whatever background compaction has reached.
        db.compact_range(None, None)
    finally:
        index.close()
    return time.perf_counter() - t0


def in_process_costs(data_dir: Path, marker: str, n_pages: int = 100, repeat: int = 3) -> dict[str, float]:
    """Server-side costs without HTTP: index scan and XML build per page.

    CPU time of this thread (less disturbed by other load on a shared
    machine than wall time), best of ``repeat`` walks of ``n_pages`` pages
    after ``marker``, per page. Run before the gateway opens the index
    (rocksdict allows one opener).
    """
    index = Index(data_dir / "index")
    try:
        scans, builds = [], []
        for _ in range(repeat):
            pages, after = [], marker
            t0 = time.thread_time()
            for _ in range(n_pages):
                page = index.list_objects(BUCKET, "", "", after, 1000)
                pages.append((after, page))
                if not page.truncated:
                    break
                after = page.last
            scans.append((time.thread_time() - t0) / len(pages))
            t0 = time.thread_time()
            for after, page in pages:
                xml.list_objects_v2(
                    BUCKET, page, prefix="", delimiter="", max_keys=1000, encoding_type=None,
                    start_after=None, continuation_token=after or None,
                    next_token=page.last, owner=None,
                )
            builds.append((time.thread_time() - t0) / len(pages))
    finally:
        index.close()
    return {"scan_s_per_page": min(scans), "xml_s_per_page": min(builds)}


# -- raw signed GETs -----------------------------------------------------------


class RawLister:
    """ListObjectsV2 pages as SigV4-signed GETs through httpx, unparsed."""

    _TOKEN = re.compile(rb"<NextContinuationToken>([^<]*)</NextContinuationToken>")

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.http = httpx.Client(timeout=60.0)
        self.signer = S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION)

    def close(self) -> None:
        self.http.close()

    def get(self, **params: str) -> bytes:
        query = "&".join(
            f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items())
        )
        url = f"{self.endpoint}/{BUCKET}?{query}"
        request = AWSRequest(method="GET", url=url)
        self.signer.add_auth(request)
        response = self.http.get(url, headers=dict(request.headers.items()))
        if response.status_code != 200:
            raise RuntimeError(f"GET {url}: {response.status_code} {response.text[:300]}")
        return response.content

    def paginate(self) -> tuple[int, int]:
        """Every page, following NextContinuationToken; returns (pages, body bytes)."""
        pages = size = 0
        params = {"list-type": "2", "max-keys": "1000"}
        while True:
            body = self.get(**params)
            pages += 1
            size += len(body)
            m = self._TOKEN.search(body)
            if m is None:
                return pages, size
            params["continuation-token"] = m.group(1).decode()


def botocore_parse_seconds(s3, body: bytes, fast_timestamps: bool, repeat: int = 10) -> float:
    """CPU seconds botocore takes to parse one ListObjectsV2 body (1000 keys
    unless the bucket is smaller).

    ``fast_timestamps`` swaps botocore's default timestamp parser (dateutil)
    for _common.fast_timestamp (datetime.fromisoformat first), as a client
    can with ``botocore_session.get_component("response_parser_factory")
    .set_parser_defaults(timestamp_parser=...)``.
    """
    from botocore.parsers import create_parser

    model = s3.meta.service_model.operation_model("ListObjectsV2")
    parser = create_parser("rest-xml")
    if fast_timestamps:
        parser = type(parser)(timestamp_parser=fast_timestamp)
    response = {"status_code": 200, "headers": {}, "body": body}
    parsed = parser.parse(response, model.output_shape)  # warm up
    assert parsed.get("Contents"), "no keys in the page to parse"
    t0 = time.thread_time()
    for _ in range(repeat):
        parser.parse(response, model.output_shape)
    return (time.thread_time() - t0) / repeat


# -- the benchmark -------------------------------------------------------------


def full_pagination(s3) -> tuple[int, int]:
    keys = pages = 0
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=BUCKET, PaginationConfig={"PageSize": 1000}):
        keys += len(page.get("Contents", ()))
        pages += 1
    return keys, pages


class Meter:
    """Wall time, and CPU time of this process and of the gateway process."""

    def __init__(self, server_pid: int) -> None:
        self.pid = server_pid

    def __enter__(self) -> Self:
        self._t = (time.perf_counter(), time.process_time(), process_cpu(self.pid))
        return self

    def __exit__(self, *exc: object) -> None:
        wall, client_cpu, server_cpu = self._t
        self.wall = time.perf_counter() - wall
        self.client_cpu = time.process_time() - client_cpu
        self.server_cpu = process_cpu(self.pid) - server_cpu

    def as_dict(self) -> dict[str, float]:
        return {"wall_s": self.wall, "client_cpu_s": self.client_cpu, "server_cpu_s": self.server_cpu}


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000, help="keys in the bucket (default 1,000,000)")
    ap.add_argument("--per-dir", type=int, default=1000, help="keys per 'directory' (default 1000)")
    ap.add_argument("--runs", type=int, default=1, help="full boto3 paginations to time (default 1)")
    ap.add_argument("--samples", type=int, default=20, help="runs of (b) and (c) (default 20)")
    ap.add_argument("--fast-timestamps", action="store_true",
                    help="also time (a) with a boto3 client whose timestamp parser is "
                         "datetime.fromisoformat (a client-side fix; adds a minute or so)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    _common.begin()
    n, per_dir = args.keys, args.per_dir
    n_dirs = -(-n // per_dir)
    middle = key_of(n // 2, per_dir)
    results: dict[str, object] = {"keys": n, "per_dir": per_dir, "machine": machine()}

    with temp_dir("listing") as tmp:
        data_dir = tmp / "data"
        say(f"populating {n:,} keys ...")
        results["populate_s"] = populate(data_dir, n, per_dir)
        results.update(in_process_costs(data_dir, middle))

        say("starting the gateway ...")
        t0 = time.perf_counter()
        with gateway(data_dir) as gw:
            results["startup_s"] = time.perf_counter() - t0
            s3 = client(gw.endpoint)
            pid = gw.proc.pid

            # (a) full pagination through boto3
            full = []
            for r in range(args.runs):
                say(f"(a) boto3 full pagination, run {r + 1} ...")
                with Meter(pid) as m:
                    keys, pages = full_pagination(s3)
                if keys != n:
                    raise SystemExit(f"listed {keys} keys, expected {n}")
                full.append(m.as_dict())
            results["boto3_full"] = full
            results["pages"] = pages
            if args.fast_timestamps:
                say("(a'') boto3 full pagination, fast timestamp parser ...")
                with Meter(pid) as m:
                    keys, _ = full_pagination(client(gw.endpoint, fast_timestamps=True))
                if keys != n:
                    raise SystemExit(f"listed {keys} keys, expected {n}")
                results["boto3_fast_ts_full"] = m.as_dict()

            # (a') the same pages, signed raw GETs, no parsing
            say("(a') raw signed GETs ...")
            raw = RawLister(gw.endpoint)
            try:
                with Meter(pid) as m:
                    raw_pages, raw_bytes = raw.paginate()
                if raw_pages != pages:
                    raise SystemExit(f"raw pagination saw {raw_pages} pages, boto3 {pages}")
                results["raw_full"] = m.as_dict()
                results["raw_bytes"] = raw_bytes
                middle_params = {"list-type": "2", "max-keys": "1000", "start-after": middle}
                results["raw_page_s"] = timed(lambda: raw.get(**middle_params), args.samples)
                body = raw.get(**{"list-type": "2", "max-keys": "1000"})  # a full first page
            finally:
                raw.close()
            results["parse_s_per_page"] = botocore_parse_seconds(s3, body, fast_timestamps=False)
            results["parse_fast_ts_s_per_page"] = botocore_parse_seconds(s3, body, fast_timestamps=True)

            # (b) delimiter listing
            say("(b) delimiter listing ...")
            want = min(n_dirs, 1000)

            def delimited() -> None:
                resp = s3.list_objects_v2(Bucket=BUCKET, Prefix=DIRS_PREFIX, Delimiter="/", MaxKeys=1000)
                got = len(resp.get("CommonPrefixes", ()))
                if got != want:
                    raise SystemExit(f"delimiter listing returned {got} prefixes, expected {want}")

            delimited()  # warm up
            results["delimiter_s"] = timed(delimited, args.samples)

            # (c) one page from the middle
            say("(c) StartAfter page ...")

            def middle_page() -> None:
                resp = s3.list_objects_v2(Bucket=BUCKET, StartAfter=middle, MaxKeys=1000)
                if resp["KeyCount"] != min(1000, n - n // 2 - 1):
                    raise SystemExit(f"middle page returned {resp['KeyCount']} keys")

            results["middle_s"] = timed(middle_page, args.samples)
        say("gateway stopped; restarting it after its clean shutdown ...")
        t0 = time.perf_counter()
        with gateway(data_dir):
            results["restart_clean_s"] = time.perf_counter() - t0

    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def report(r: dict) -> str:
    n, pages = r["keys"], r["pages"]
    best = min(r["boto3_full"], key=lambda x: x["wall_s"])
    raw = r["raw_full"]
    verdict = "under" if best["wall_s"] < TARGET_S else "OVER"
    runs = ""
    if len(r["boto3_full"]) > 1:
        runs = " (runs: " + ", ".join(f"{x['wall_s']:.1f}" for x in r["boto3_full"]) + " s)"
    n_prefixes = min(-(-n // r["per_dir"]), 1000)
    rows = [
        [
            f"(a) full ListObjectsV2 pagination, boto3 paginator, {pages:,} pages of 1000",
            f"{best['wall_s']:.1f} s{runs}",
            f"{n / best['wall_s']:,.0f} keys/s; {verdict} the {TARGET_S:.0f} s target",
        ],
        [
            "(a') same pages as raw signed GETs (httpx, XML not parsed)",
            f"{raw['wall_s']:.1f} s",
            (f"{n / raw['wall_s']:,.0f} keys/s; "
            f"{r['raw_bytes'] / raw['wall_s'] / 1e6:.1f} MB/s of XML"),
        ],
    ]
    if "boto3_fast_ts_full" in r:
        fast = r["boto3_fast_ts_full"]
        rows.append([
            "(a'') as (a), boto3's timestamp parser swapped for fromisoformat (client side)",
            f"{fast['wall_s']:.1f} s",
            f"{n / fast['wall_s']:,.0f} keys/s; client CPU {fast['client_cpu_s']:.1f} s",
        ])
    rows += [
        [
            (f"(b) delimiter listing of '{DIRS_PREFIX}' -> {n_prefixes} common prefixes, "
            f"p50 of {len(r['delimiter_s'])}"),
            _ms(statistics.median(r["delimiter_s"])),
            f"p99 {_ms(percentile(r['delimiter_s'], 99))}",
        ],
        [
            f"(c) 1000 keys after a StartAfter in the middle, p50 of {len(r['middle_s'])}",
            _ms(statistics.median(r["middle_s"])),
            (f"p99 {_ms(percentile(r['middle_s'], 99))}; raw GET of the same page: "
            f"p50 {_ms(statistics.median(r['raw_page_s']))}"),
        ],
    ]

    def line(label: str, seconds_per_page: float) -> list[str]:
        return [label, _ms(seconds_per_page), f"{seconds_per_page * pages:.1f} s"]

    rest_s = raw["server_cpu_s"] / pages - r["scan_s_per_page"] - r["xml_s_per_page"]
    rest_label = "in the gateway: the rest (HTTP, SigV4, routing, pool hand-off)"
    # A difference of two noisy measurements (gateway CPU from /proc, the
    # parts timed in this process): below half a millisecond it is noise.
    rest = line(rest_label, rest_s) if rest_s >= 0.0005 else [rest_label, "< 0.5 ms (noise)", "-"]
    split = [
        line("(a) boto3: wall time", best["wall_s"] / pages),
        line("(a) boto3: gateway process CPU", best["server_cpu_s"] / pages),
        line("(a) boto3: client process CPU (boto3)", best["client_cpu_s"] / pages),
        line("(a') raw: wall time", raw["wall_s"] / pages),
        line("(a') raw: gateway process CPU", raw["server_cpu_s"] / pages),
        line("(a') raw: client process CPU (httpx + signing)", raw["client_cpu_s"] / pages),
        line("in the gateway: index scan (Index.list_objects), CPU", r["scan_s_per_page"]),
        line("in the gateway: XML build (xml.list_objects_v2), CPU", r["xml_s_per_page"]),
        rest,
        line("in boto3: botocore parse of a 1000-key page, CPU", r["parse_s_per_page"]),
        line("in boto3: same, timestamps by datetime.fromisoformat", r["parse_fast_ts_s_per_page"]),
    ]
    setup = (
        f"Setup: {n:,} index records written in {r['populate_s']:.1f} s. Gateway start-up on "
        f"them, until /health answers 200: {r['startup_s']:.1f} s the first time (no "
        f"clean-shutdown marker, so the crash-recovery sweep reads every record), "
        f"{r['restart_clean_s']:.1f} s after a clean shutdown."
    )
    return "\n".join([
        f"### Listing {n:,} keys in one bucket",
        "",
        f"Machine: {r['machine']}",
        "",
        setup,
        "",
        table(["measurement", "result", "notes"], rows),
        "",
        "Where the time of (a) goes (per 1000-key page, and over all pages):",
        "",
        table(["component", "per page", f"x {pages:,} pages"], split),
        "",
    ])


if __name__ == "__main__":
    sys.exit(main())
