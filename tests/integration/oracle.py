"""Helpers for the crash and recovery tests (imported by test modules, not a conftest).

``Oracle`` remembers what every acknowledged write left behind (bytes, or
None for a deleted key) and checks a gateway against it. The rest: kill a
gateway the hard way, call the admin API, count segment files in a
local-directory capacity store, and run ``tierstore recover`` (or the
library call it wraps).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.client import HTTPConnection
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from tests.conftest import assert_consistent, make_client
from tests.servers import ACCESS_KEY, ADMIN_TOKEN, SECRET_KEY, Gateway

MiB = 1024 * 1024
TMP_PREFIX = ".tmp-"  # tiering.capacity.TMP_PREFIX: a local store's half-written file


def blob(seed: int | str, size: int, compressible: bool = False) -> bytes:
    """Deterministic bytes of ``size``; random (zstd cannot shrink them)
    unless ``compressible``."""
    if compressible:
        unit = f"{seed}:".encode()
        return (unit * (size // len(unit) + 1))[:size]
    return random.Random(str(seed)).randbytes(size)


def s3_client(gw: Gateway, threads: int = 16):
    return make_client(gw.endpoint, max_pool_connections=max(10, threads))


_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class RawReader:
    """GETs and PUTs signed with a few lines of SigV4 over keep-alive
    http.client connections (one per thread): about a tenth of boto3's
    client CPU (~4 ms a request), which matters when thousands of objects
    are written and read back on a 2-CPU machine. The gateway verifies every
    signature (and the payload hash), so a signing mistake shows as a 403."""

    def __init__(self, gw: Gateway, region: str = "us-east-1", access_key: str = ACCESS_KEY,
                 secret_key: str = SECRET_KEY) -> None:
        self.host = f"127.0.0.1:{gw.port}"
        self.port = gw.port
        self.region = region
        self.access_key, self.secret_key = access_key, secret_key
        self._local = threading.local()
        self._keys: dict[str, bytes] = {}

    def _conn(self) -> HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = HTTPConnection("127.0.0.1", self.port, timeout=60)
        return conn

    def _signing_key(self, date: str) -> bytes:
        key = self._keys.get(date)
        if key is None:
            key = ("AWS4" + self.secret_key).encode()
            for part in (date, self.region, "s3", "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            self._keys[date] = key
        return key

    def get(self, bucket: str, key: str) -> tuple[int, bytes]:
        status, _, body = self.request("GET", bucket, key)
        return status, body

    def put(self, bucket: str, key: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
        return self.request("PUT", bucket, key, data)

    def request(
        self,
        method: str,
        bucket: str,
        key: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        query: str = "",
    ) -> tuple[int, dict[str, str], bytes]:
        """One signed request; ``key`` "" is the bucket itself. ``query``:
        names and values that need no escaping (``batch``, ``a=1&b``)."""
        path = "/" + bucket + ("/" + quote(key, safe="/-_.~") if key else "")
        params = sorted(p if "=" in p else p + "=" for p in query.split("&")) if query else []
        payload = _EMPTY_SHA256 if not body else hashlib.sha256(body).hexdigest()
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        scope = f"{amz_date[:8]}/{self.region}/s3/aws4_request"
        signed = "host;x-amz-content-sha256;x-amz-date"
        canonical = "\n".join(
            [
                method,
                path,
                "&".join(params),
                f"host:{self.host}\nx-amz-content-sha256:{payload}\nx-amz-date:{amz_date}\n",
                signed,
                payload,
            ]
        )
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        signature = hmac.new(
            self._signing_key(amz_date[:8]), to_sign.encode(), hashlib.sha256
        ).hexdigest()
        all_headers = {
            **(headers or {}),
            "Host": self.host,
            "x-amz-date": amz_date,
            "x-amz-content-sha256": payload,
            "Authorization": f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature}",
        }
        if method == "PUT":
            all_headers["Content-Length"] = str(len(body))
        for attempt in (1, 2):
            conn = self._conn()
            try:
                conn.request(method, path + ("?" + query if query else ""), body=body or None, headers=all_headers)
                resp = conn.getresponse()
                data = resp.read()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except (ConnectionError, OSError):  # a keep-alive connection the server closed
                conn.close()
                self._local.conn = None
                if attempt == 2 or method != "GET":
                    raise
        raise AssertionError("unreachable")


def error_code(body: bytes) -> str:
    start = body.find(b"<Code>")
    end = body.find(b"</Code>")
    return body[start + 6 : end].decode() if start >= 0 and end > start else "?"


@dataclass
class Entry:
    data: bytes | None  # None: deleted
    content_type: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    etag: str | None = None  # when not the MD5 of the data (multipart)

    def expected_etag(self) -> str:
        assert self.data is not None
        return self.etag or hashlib.md5(self.data).hexdigest()


class Oracle:
    """What every acknowledged write says each key holds now."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], Entry] = {}

    # -- writes (each records only after the gateway acknowledged) ---------

    def put(
        self,
        s3: Any,
        bucket: str,
        key: str,
        data: bytes,
        content_type: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {}
        if content_type is not None:
            kwargs["ContentType"] = content_type
        if metadata:
            kwargs["Metadata"] = metadata
        resp = s3.put_object(Bucket=bucket, Key=key, Body=data, **kwargs)
        assert resp["ETag"].strip('"') == hashlib.md5(data).hexdigest(), (key, resp["ETag"])
        self.entries[(bucket, key)] = Entry(data, content_type, dict(metadata or {}))

    def upload_multipart(self, s3: Any, bucket: str, key: str, data: bytes, part_size: int) -> None:
        """CreateMultipartUpload, UploadPart each ``part_size`` bytes, Complete."""
        upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        parts = []
        for number, start in enumerate(range(0, len(data), part_size), start=1):
            resp = s3.upload_part(
                Bucket=bucket,
                Key=key,
                UploadId=upload,
                PartNumber=number,
                Body=data[start : start + part_size],
            )
            parts.append({"PartNumber": number, "ETag": resp["ETag"]})
        resp = s3.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
        )
        etag = resp["ETag"].strip('"')
        assert etag.endswith(f"-{len(parts)}"), etag
        self.entries[(bucket, key)] = Entry(data, etag=etag)

    def put_raw(self, reader: RawReader, bucket: str, key: str, data: bytes) -> None:
        """The same, through the lean signer (bulk writes)."""
        status, headers, body = reader.put(bucket, key, data)
        assert status == 200, (key, status, body[:500])
        assert headers.get("etag", "").strip('"') == hashlib.md5(data).hexdigest(), (key, headers)
        self.entries[(bucket, key)] = Entry(data)

    def delete(self, s3: Any, bucket: str, key: str) -> None:
        s3.delete_object(Bucket=bucket, Key=key)
        self.entries[(bucket, key)] = Entry(None)

    def put_many(
        self, gw: Gateway, items: Iterable[tuple[str, str, bytes]], threads: int = 8, **kw: Any
    ) -> None:
        self._many(gw, threads, lambda s3, item: self.put(s3, *item, **kw), list(items))

    def put_many_raw(
        self, gw: Gateway, items: Iterable[tuple[str, str, bytes]], threads: int = 8
    ) -> None:
        reader = RawReader(gw)
        with ThreadPoolExecutor(threads) as pool:
            for future in [pool.submit(self.put_raw, reader, *item) for item in items]:
                future.result()

    def delete_many(self, gw: Gateway, items: Iterable[tuple[str, str]], threads: int = 8) -> None:
        self._many(gw, threads, lambda s3, item: self.delete(s3, *item), list(items))

    def delete_batch(self, s3: Any, bucket: str, keys: list[str]) -> None:
        """DeleteObjects, up to 1000 keys a request."""
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            resp = s3.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
            assert not resp.get("Errors"), resp["Errors"][:5]
            for key in batch:
                self.entries[(bucket, key)] = Entry(None)

    @staticmethod
    def _many(
        gw: Gateway, threads: int, call: Callable[[Any, Any], None], items: list[Any]
    ) -> None:
        s3 = s3_client(gw, threads)
        with ThreadPoolExecutor(threads) as pool:
            for future in [pool.submit(call, s3, item) for item in items]:
                future.result()

    # -- views -------------------------------------------------------------

    def live(self, bucket: str | None = None) -> dict[tuple[str, str], Entry]:
        return {
            k: e
            for k, e in self.entries.items()
            if e.data is not None and (bucket is None or k[0] == bucket)
        }

    def deleted(self) -> list[tuple[str, str]]:
        return [k for k, e in self.entries.items() if e.data is None]

    def buckets(self) -> set[str]:
        return {b for b, _ in self.entries}

    # -- checks ------------------------------------------------------------

    def verify(self, gw: Gateway, threads: int = 8, sample_meta: int = 0) -> None:
        """Every live key reads back byte-identical (and its ETag is its MD5);
        every deleted key is NoSuchKey; listings hold exactly the live keys
        with their sizes and ETags."""
        s3 = s3_client(gw, threads)
        reader = RawReader(gw)
        problems: list[str] = []

        def check(item: tuple[tuple[str, str], Entry]) -> None:
            (bucket, key), entry = item
            status, body = reader.get(bucket, key)
            if status != 200:
                code = error_code(body)
                if entry.data is not None or (status, code) != (404, "NoSuchKey"):
                    problems.append(
                        f"{bucket}/{key}: GET answered {status} {code}, expected "
                        + ("its bytes" if entry.data is not None else "404 NoSuchKey")
                    )
                return
            if entry.data is None:
                problems.append(f"{bucket}/{key}: deleted, but GET returned {len(body)} bytes")
            elif body != entry.data:
                problems.append(
                    f"{bucket}/{key}: {len(body)} bytes read back differ from the "
                    f"{len(entry.data)} acknowledged (md5 {hashlib.md5(body).hexdigest()} "
                    f"vs {hashlib.md5(entry.data).hexdigest()})"
                )

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(check, self.entries.items()))
        assert not problems, f"{len(problems)} object(s) wrong:\n" + "\n".join(
            sorted(problems)[:30]
        )
        for bucket in sorted(self.buckets()):
            self.verify_listing(s3, bucket)
        if sample_meta:
            self.verify_meta(s3, sample_meta)

    def verify_listing(self, s3: Any, bucket: str) -> None:
        listed = list_all(s3, bucket)
        want = {key: (len(e.data), e.expected_etag()) for (b, key), e in self.live(bucket).items()}  # type: ignore[arg-type]
        got = {o["Key"]: (o["Size"], o["ETag"].strip('"')) for o in listed}
        assert len(listed) == len(got), f"{bucket}: a key listed twice"
        missing = sorted(want.keys() - got.keys())
        extra = sorted(got.keys() - want.keys())
        wrong = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
        assert not (missing or extra or wrong), (
            f"{bucket}: listing differs: missing {missing[:10]} ({len(missing)}), "
            f"unexpected {extra[:10]} ({len(extra)}), wrong size/etag {wrong[:10]} ({len(wrong)})"
        )

    def verify_meta(self, s3: Any, sample: int) -> None:
        """Content-Type and user metadata survive, for keys written with them."""
        with_meta = [(k, e) for k, e in sorted(self.live().items()) if e.content_type or e.metadata]
        step = max(1, len(with_meta) // sample)
        for (bucket, key), entry in with_meta[::step][:sample]:
            head = s3.head_object(Bucket=bucket, Key=key)
            if entry.content_type:
                assert head["ContentType"] == entry.content_type, (key, head["ContentType"])
            assert head["Metadata"] == entry.metadata, (key, head["Metadata"])


def list_all(s3: Any, bucket: str) -> list[dict[str, Any]]:
    """Every object of ``bucket`` through paginated ListObjectsV2."""
    out: list[dict[str, Any]] = []
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, PaginationConfig={"PageSize": 1000}
    ):
        out.extend(page.get("Contents", []))
    return out


# -- the process -------------------------------------------------------------


def kill(gw: Gateway) -> None:
    """SIGKILL: no shutdown code runs, exactly like a power cut of the process."""
    assert gw.proc is not None and gw.proc.poll() is None, (
        "gateway not running:\n" + gw.log()[-3000:]
    )
    gw.proc.send_signal(signal.SIGKILL)
    gw.proc.wait()
    gw.proc = None


def admin(gw: Gateway, method: str, path: str, timeout: float = 120.0, **kw: Any) -> httpx.Response:
    resp = httpx.request(
        method,
        gw.admin_url + path,
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=timeout,
        **kw,
    )
    assert resp.status_code == 200, (method, path, resp.status_code, resp.text)
    return resp


def tiers(gw: Gateway) -> dict[str, Any]:
    return admin(gw, "GET", "/tiers").json()


def flush(gw: Gateway) -> dict[str, Any]:
    """Flush everything staged; the /tiers status after it."""
    job = admin(gw, "POST", "/jobs/flush", params={"wait": "true"}).json()
    assert job["state"] == "succeeded", job
    return tiers(gw)


# -- a local-directory capacity store ----------------------------------------


def segment_files(cap: Path) -> list[str]:
    """Committed-looking segment objects (temp files excluded, as ``list`` does)."""
    root = cap / "segments"
    if not root.exists():
        return []
    return sorted(
        p.name for p in root.rglob("*") if p.is_file() and not p.name.startswith(TMP_PREFIX)
    )


def temp_files(cap: Path) -> list[Path]:
    return sorted(p for p in cap.rglob(TMP_PREFIX + "*") if p.is_file()) if cap.exists() else []


def staged_files(data_dir: Path) -> list[Path]:
    """Staged (dirty) files of a hot tier: ``hot/<xx>/<id>``, cache excluded."""
    hot = data_dir / "hot"
    if not hot.exists():
        return []
    return [
        p for sub in hot.iterdir() if sub.is_dir() and sub.name != "cache" for p in sub.iterdir()
    ]


# -- tierstore recover -------------------------------------------------------


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("TIERSTORE_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def recover(data_dir: Path, capacity_args: list[str]) -> subprocess.CompletedProcess:
    """``tierstore recover --data-dir DIR <capacity flags>``; the caller checks the outcome."""
    return run_cli("recover", "--data-dir", str(data_dir), *capacity_args)


_OFFLINE = """
import asyncio, json, sys
from gateway.config.values import load_config
from gateway.storage import run_recover
flags = json.loads(sys.argv[1])
report = asyncio.run(run_recover(load_config(flags)))
print(json.dumps({name: getattr(report, name) for name in report.__slots__}))
"""


def rebuild_offline(data_dir: Path, capacity_args: list[str]) -> dict[str, int]:
    """What ``tierstore recover`` does, minus the command-line glue: the
    library's rebuild (``gateway.storage.run_recover``) in a subprocess."""
    import json

    flags: dict[str, object] = {"data_dir": str(data_dir)}
    for name, value in zip(capacity_args[::2], capacity_args[1::2], strict=True):
        flags[name.removeprefix("--").replace("-", "_")] = value
    env = dict(os.environ)
    env.pop("TIERSTORE_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-c", _OFFLINE, json.dumps(flags)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (
        f"offline rebuild failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-3000:]}"
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def crash_then_lose_the_disk(gw: Gateway, capacity_args: list[str], check: Callable[[str], None]) -> None:
    """What a node must survive, checked by ``check(where)`` at each step:
    a SIGKILL with writes acknowledged but not flushed (restarted), then the
    loss of its data dir (flushed and stopped first; rebuilt by
    ``tierstore recover`` from the segments of ``capacity_args``' store).
    Leaves the recovered gateway running; the caller stops it."""
    kill(gw)
    gw.start()
    check("after a crash")
    gw.flush()
    gw.stop()
    assert_consistent(gw)
    shutil.rmtree(gw.data_dir)
    done = recover(gw.data_dir, capacity_args)
    assert done.returncode == 0, done.stdout + done.stderr
    gw.start()
    try:
        check("after recover")
    except BaseException:
        gw.stop()
        raise
