"""SIGKILL at the worst moments: mid PUT body, after the ack but before the
flush, mid flush, mid compaction.

After every restart: each acknowledged write reads back byte-identical,
deleted keys stay deleted, nothing half-written is visible, the flush queue
drains, no uploaded-but-uncommitted segment survives the start-up, and
after the final clean stop the data directory passes fsck (no staged file
leaks). The capacity store is a local directory (fast); sizes are small so
that several segments exist.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path

import httpx
import pytest

from tests import smallfs
from tests.conftest import assert_consistent
from tests.integration.oracle import (
    Entry,
    MiB,
    Oracle,
    RawReader,
    blob,
    error_code,
    flush,
    kill,
    rebuild_offline,
    s3_client,
    segment_files,
    staged_files,
    temp_files,
    tiers,
)
from tests.integration.s3raw import sign
from tests.servers import ADMIN_TOKEN, Gateway

SMALL = ["--segment-size", "8M", "--part-size", "5M", "--small-object-size", "1M"]
NEVER = [
    "--flush-delay",
    "3600",
]  # no timed flush; a segment's worth of staged data still starts one
HOLD = [
    "--segment-size",
    "1G",
    "--part-size",
    "5M",
    "--small-object-size",
    "1M",
    *NEVER,
]  # no flush at all


class Node:
    """One gateway's data dir and capacity dir, restarted at will."""

    def __init__(self, tmp: Path, name: str = "data") -> None:
        self.cap = tmp / "cap"
        self.gw = Gateway(tmp / name)
        self.oracle = Oracle()

    def capacity_args(self) -> list[str]:
        return ["--capacity", self.cap.as_uri()]

    def start(self, *args: str) -> Gateway:
        assert self.gw.proc is None
        self.gw.extra_args = [*self.capacity_args(), *args]
        return self.gw.start()

    def crash(self) -> None:
        kill(self.gw)

    def check_restart(self) -> dict:
        """What every start after a crash must show: no segment the index does
        not know is left in the store, and the oracle holds."""
        status = tiers(self.gw)
        files = segment_files(self.cap)
        assert status["segments"] == len(files), (
            f"after start-up the index knows {status['segments']} segments but the store holds "
            f"{len(files)}: {files}"
        )
        self.oracle.verify(self.gw)
        return status

    def finish(self) -> None:
        """Drain the flush queue, stop cleanly, fsck."""
        status = flush(self.gw)
        assert status["flush_queue"] == 0, status
        assert status["hot_staged"] == 0, status
        assert tiers(self.gw)["flush_queue"] == 0
        assert status["segments"] == len(segment_files(self.cap))
        self.oracle.verify(self.gw)
        self.gw.stop()
        assert_consistent(self.gw)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    try:
        yield n
    finally:
        n.gw.stop()


class LeakedTempFile(AssertionError):
    """A half-written capacity object outlived the restarts."""


def assert_no_temp_files(cap: Path) -> None:
    """Checked last, after everything else held: a separate product bug."""
    leftovers = temp_files(cap)
    if leftovers:
        raise LeakedTempFile(
            f"{len(leftovers)} half-written capacity object(s) survived the restarts: "
            f"{[(str(p.relative_to(cap)), p.stat().st_size) for p in leftovers]}"
        )


def in_thread(call) -> tuple[threading.Thread, list]:  # type: ignore[no-untyped-def]
    """Run ``call`` in a thread; the list gets ("ok", result) or ("error", exc)."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(("ok", call()))
        except httpx.HTTPError as exc:  # the gateway was killed under the request
            outcome.append(("error", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def admin_post(gw: Gateway, path: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(
        gw.admin_url + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=120,
        params={"wait": "true"}, json=body,
    )


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# ---------------------------------------------------------------------------
# 1. mid PUT body


def _half_put(gw: Gateway, bucket: str, key: str, size: int) -> HTTPConnection:
    """Start a signed PUT announcing ``size`` bytes and send only half of them."""
    url = f"{gw.endpoint}/{bucket}/{key}"
    headers, _, _ = sign("PUT", url, {"Content-Length": str(size)}, payload_hash="UNSIGNED-PAYLOAD")
    conn = HTTPConnection("127.0.0.1", gw.port, timeout=30)
    conn.putrequest("PUT", f"/{bucket}/{key}", skip_accept_encoding=True)
    for name, value in headers.items():
        conn.putheader(name, value)
    if "content-length" not in {n.lower() for n in headers}:
        conn.putheader("Content-Length", str(size))
    conn.endheaders()
    conn.send(blob(f"half-{key}", size // 2))
    return conn


@pytest.mark.parametrize("where", ["staged", "streamed"])
def test_kill_during_put_body(node: Node, where: str) -> None:
    """A body cut short by the crash leaves nothing: the new key does not
    exist, an overwritten key keeps its old bytes, and the staged files (or
    the half-streamed segment) of the half-received bodies are gone."""
    size = 20 * MiB
    # "streamed": a hot tier too small for the body, which streams past it into its own segment.
    extra = ["--hot-size", "12M"] if where == "streamed" else []
    gw = node.start(*SMALL, *NEVER, *extra)
    s3 = s3_client(gw)
    s3.create_bucket(Bucket="crash-put")
    node.oracle.put(s3, "crash-put", "overwritten", blob("old", 1000))
    flush(gw)
    conns = [
        _half_put(gw, "crash-put", "fresh", size),
        _half_put(gw, "crash-put", "overwritten", size),
    ]

    def arrived() -> bool:
        """Both bodies are being taken in: over 5 MiB of each is on disk."""
        if where == "staged":
            return sum(p.stat().st_size for p in staged_files(gw.data_dir)) > 2 * 5 * MiB
        return sum(1 for p in temp_files(node.cap) if p.stat().st_size > 5 * MiB) == 2

    wait_for(arrived, what=f"both half bodies to arrive ({where})")
    node.crash()
    for conn in conns:
        conn.close()

    node.start(*SMALL, *extra)
    status = tiers(gw)
    assert status["hot_staged"] == 0 and status["flush_queue"] == 0, status
    assert staged_files(gw.data_dir) == [], (
        "the start-up sweep left staged files of unfinished bodies"
    )
    node.oracle.entries[("crash-put", "fresh")] = Entry(None)  # never acknowledged: must not exist
    node.check_restart()  # "overwritten" still holds the old bytes, "fresh" is NoSuchKey
    listing = s3_client(gw).list_objects_v2(Bucket="crash-put")
    assert [o["Key"] for o in listing["Contents"]] == ["overwritten"]
    # The key takes a new write as if nothing had happened.
    node.oracle.put(s3_client(gw), "crash-put", "fresh", blob("new", 3 * MiB))
    node.finish()
    assert_no_temp_files(node.cap)


# ---------------------------------------------------------------------------
# 2. acknowledged, not yet flushed


def test_kill_after_ack_before_flush(node: Node) -> None:
    """Acknowledged write-back data lives only in the hot tier until the
    flush: a crash right after the acks loses none of it, and the restarted
    gateway flushes it."""
    gw = node.start(*HOLD)
    s3 = s3_client(gw)
    s3.create_bucket(Bucket="acked")
    small = [
        ("acked", f"small/{i:03d}", blob(f"s{i}", (i * 7919) % 40_000, compressible=i % 3 == 0))
        for i in range(200)
    ]
    node.oracle.put_many(gw, small)
    large = [
        ("acked", f"large/{i}", blob(f"l{i}", size))
        for i, size in enumerate([1 * MiB + 1, 6 * MiB + 123, 11 * MiB])
    ]  # 1, 2 and 3 parts of 5M
    node.oracle.put_many(gw, large, threads=3)
    node.oracle.put(
        s3, "acked", "meta", b"with metadata", content_type="text/x-test", metadata={"a": "b"}
    )
    # Some overwrites and deletes, acknowledged too.
    node.oracle.put_many(
        gw, [("acked", f"small/{i:03d}", blob(f"s{i}-v2", 5000)) for i in range(0, 200, 10)]
    )
    node.oracle.delete_many(gw, [("acked", f"small/{i:03d}") for i in range(5, 200, 10)])
    status = tiers(gw)
    assert status["segments"] == 0 and status["flush_queue"] > 0, status  # nothing flushed yet
    node.crash()

    node.start(*SMALL)  # default flush delay from here on
    node.check_restart()
    node.oracle.verify_meta(s3_client(gw), 1)
    node.finish()
    assert len(segment_files(node.cap)) >= 4, segment_files(
        node.cap
    )  # 3 large ones alone, the small packed


# ---------------------------------------------------------------------------
# 3. mid flush


def kill_when(node: Node, moment: str, before: set[str], timeout: float = 10.0) -> None:
    """SIGKILL the gateway at ``moment`` of a running flush or compaction:
    "upload" while a segment is being written, "new+N" right after the N-th
    new segment is published, "gone+N" right after the N-th of the segments
    in ``before`` is deleted, or a delay in seconds."""
    kind, _, count = moment.partition("+")
    temps = set(temp_files(node.cap))  # left by the last kill, removed at the next start
    if kind == "new":
        predicate = lambda: len(set(segment_files(node.cap)) - before) >= int(count)
    elif kind == "gone":
        predicate = lambda: len(before - set(segment_files(node.cap))) >= int(count)
    elif kind == "upload":
        predicate = lambda: bool(set(temp_files(node.cap)) - temps)
    else:
        time.sleep(float(moment))
        predicate = lambda: True
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.0005)
    node.crash()


def _batch(round_: int, count: int) -> list[tuple[str, str, bytes]]:
    """About 7 MiB: small objects packed together, three large ones alone
    (under a segment's worth, so only the operator's flush starts a round)."""
    items = [
        ("flushed", f"r{round_}/small/{i:03d}", blob(f"{round_}-{i}", 2_000 + (i * 7919) % 36_000))
        for i in range(count)
    ]
    items += [
        ("flushed", f"r{round_}/large/{i}", blob(f"{round_}-L{i}", 1 * MiB + 1 + i * 150_000))
        for i in range(3)
    ]
    return items


MOMENTS = ["upload", "new+1", "new+2", "0.05"]


def test_kill_during_flush(node: Node, tmp_path: Path) -> None:
    """A flush writes segment after segment and commits each one's extents
    (and the queued tombstones) in one batch. Killed anywhere in that, the
    restarted gateway serves every acknowledged write, has removed the
    uploaded-but-uncommitted segment and flushes the rest later; nothing is
    lost or duplicated, and a rebuild from the store keeps deleted keys deleted."""
    interrupted = 0
    for round_, moment in enumerate(MOMENTS):
        gw = node.start(*SMALL, *NEVER)
        if round_ == 0:
            s3_client(gw).create_bucket(Bucket="flushed")
        else:
            node.check_restart()
        node.oracle.put_many(gw, _batch(round_, 120))
        if round_:  # overwrite and delete some of the previous round's keys
            prev = round_ - 1
            node.oracle.put_many(
                gw,
                [
                    ("flushed", f"r{prev}/small/{i:03d}", blob(f"{round_}-over-{i}", 3000))
                    for i in range(0, 120, 7)
                ],
            )
            node.oracle.delete_many(
                gw,
                [("flushed", f"r{prev}/small/{i:03d}") for i in range(3, 120, 7)]
                + [("flushed", f"r{prev}/large/1")],
            )
        before = set(segment_files(node.cap))
        thread, outcome = in_thread(lambda gw=gw: admin_post(gw, "/jobs/flush"))
        kill_when(node, moment, before)
        thread.join(30)
        interrupted += not (outcome and outcome[0][0] == "ok")
    assert interrupted >= 2, f"only {interrupted} of {len(MOMENTS)} kills interrupted a flush"
    node.start(*SMALL)
    node.check_restart()
    node.finish()
    _check_rebuild(node, tmp_path, "rebuilt")
    # A kill mid-upload may also leave a .tmp-* file; the next start removes it.


# ---------------------------------------------------------------------------
# 4. mid compaction


def _garbage(node: Node, gw: Gateway, round_: int, keys: list[str]) -> None:
    """Delete about half of ``keys``, overwrite a quarter, flush: sparse segments."""
    live = [k for k in keys if node.oracle.entries[("compacted", k)].data is not None]
    node.oracle.delete_many(gw, [("compacted", k) for k in live[::2]])
    node.oracle.put_many(
        gw, [("compacted", k, blob(f"{round_}-{k}", 1000 + len(k) * 100)) for k in live[1::4]]
    )
    flush(gw)


COMPACT_MOMENTS = ["upload", "new+1", "gone+1"]


def test_kill_during_compaction(node: Node, tmp_path: Path) -> None:
    """Compaction copies live extents into a new segment, switches the index,
    then deletes the old one. Killed anywhere in that, the restarted gateway
    shows the same namespace and collects the leftover segment; a rebuild
    from the capacity store alone (right after a kill, and at the end) shows
    it too: deleted keys do not come back, overwritten ones hold the new bytes."""
    gw = node.start(*SMALL, *NEVER)
    s3_client(gw).create_bucket(Bucket="compacted")
    keys: list[str] = []
    for part in range(2):
        items = [
            ("compacted", f"p{part}/{i:03d}", blob(f"c{part}-{i}", 4_000 + (i * 7919) % 40_000))
            for i in range(200)
        ]
        items += [
            ("compacted", f"p{part}/large/{i}", blob(f"c{part}-L{i}", 1 * MiB + 7 + i * 200_000))
            for i in range(2)
        ]
        node.oracle.put_many(gw, items)
        keys += [k for _, k, _ in items]
        flush(gw)
    _garbage(node, gw, 0, keys)
    interrupted = 0
    for round_, moment in enumerate(COMPACT_MOMENTS, start=1):
        before = set(segment_files(node.cap))
        thread, outcome = in_thread(lambda gw=gw: admin_post(gw, "/jobs/compact", {"threshold": 0.99}))
        kill_when(node, moment, before)
        thread.join(30)
        interrupted += not (outcome and outcome[0][0] == "ok")
        if moment == "new+1":
            # The disk is lost right now, with old and new copies both in the store.
            _check_rebuild(node, tmp_path, "between")
        gw = node.start(*SMALL, *NEVER)
        node.check_restart()
        _garbage(node, gw, round_, keys)
    assert interrupted >= 2, (
        f"only {interrupted} of {len(COMPACT_MOMENTS)} kills interrupted a compaction"
    )

    report = admin_post(gw, "/jobs/compact", {"threshold": 0.99}).json()["result"]
    assert report["rewritten"] + report["deleted"] > 0, report
    node.finish()
    _check_rebuild(node, tmp_path, "rebuilt", write=True)  # the node's disk is lost after all that


def _check_rebuild(node: Node, tmp_path: Path, name: str, write: bool = False) -> None:
    """Rebuild a new data dir from the capacity store alone; it must show
    exactly what the oracle says. (Through the library: the ``recover``
    command line itself is exercised in test_recover.py.) With ``write``,
    the rebuilt node then takes new writes: its new segments must not reuse
    the name of one already in the store."""
    rebuilt = Node(tmp_path, name)
    rebuilt.oracle = node.oracle
    report = rebuild_offline(rebuilt.gw.data_dir, rebuilt.capacity_args())
    assert report["incomplete"] == 0, report
    gw = rebuilt.start(*SMALL, *NEVER)
    try:
        rebuilt.check_restart()
        if write:
            root = node.cap / "segments"
            old = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.iterdir()}
            rebuilt.oracle.put_many(
                gw,
                [("compacted", f"after/{i}", blob(f"after{i}", 20_000)) for i in range(30)]
                + [("compacted", "after/large", blob("after-large", 2 * MiB))],
            )
            flush(gw)
            now = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.iterdir()}
            assert {k: now.get(k) for k in old} == old, "the rebuilt node rewrote existing segments"
            assert len(now) > len(old)
            rebuilt.check_restart()
    finally:
        gw.stop()
    assert_consistent(gw)


# ---------------------------------------------------------------------------
# 6. a full disk: ENOSPC at the index, at the hot tier

FULL_FS = {"index": 16 * MiB, "hot": 48 * MiB}  # a filesystem of its own, mounted there
FLOOR = ["--free-floor", "8M"]


def _writes_on_a_full_disk(node: Node, gw: Gateway, prefix: str, count: int) -> Counter[tuple[int, str]]:
    """Small and large PUTs while the disk is full: each is acknowledged
    (the oracle has it from then on) or refused with a 503 or 507, never
    a 500."""
    reader = RawReader(gw)
    answers: Counter[tuple[int, str]] = Counter()
    for i in range(count):
        key = f"{prefix}/{i:03d}"
        data = blob(key, 2 * MiB + i if i % 8 == 0 else 20_000 + i * 4_001)
        status, _, body = reader.put("full", key, data)
        answers[(status, error_code(body) if status != 200 else "")] += 1
        if status == 200:
            node.oracle.entries[("full", key)] = Entry(data)
    assert set(answers) <= {(200, ""), (503, "SlowDown"), (503, "ServiceUnavailable"),
                            (507, "InsufficientStorage")}, answers
    return answers


@pytest.mark.parametrize("where", ["index", "hot"])
def test_kill_and_stop_on_a_full_disk(node: Node, where: str) -> None:
    """ENOSPC where the index or the hot tier writes (a small filesystem
    mounted there, which another tenant fills): writes meanwhile are taken
    or refused as S3 refuses, never a 500; a SIGKILL and then a SIGTERM
    (exit 0), each with that filesystem full, are followed by starts that
    succeed and hold every acknowledged write; once the room comes back,
    the flush, the clean stop and fsck as always."""
    fs = node.gw.data_dir / where
    with smallfs.tmpfs(fs, FULL_FS[where]):
        gw = node.start(*SMALL, *FLOOR)
        s3_client(gw).create_bucket(Bucket="full")
        node.oracle.put_many(gw, [("full", f"before/{i:03d}", blob(f"b{i}", 30_000 + i)) for i in range(40)])
        wait_for(lambda: tiers(gw)["disk"]["reserve_held"], what="the index's reserve")
        smallfs.fill(fs)
        answers = _writes_on_a_full_disk(node, gw, "during", 40)
        print(f"\n{where} full: {dict(answers)}")
        node.crash()
        node.start(*SMALL, *FLOOR)  # on the full filesystem
        node.check_restart()
        smallfs.fill(fs, name="ballast-2")
        proc = node.gw.proc
        node.gw.stop()
        assert proc is not None and proc.returncode == 0, node.gw.log()[-3000:]
        node.start(*SMALL, *FLOOR)
        node.check_restart()
        smallfs.empty(fs)
        smallfs.empty(fs, "ballast-2")
        wait_for(lambda: tiers(node.gw)["disk"]["index_writable"], 30, "the index taking writes again")
        node.finish()
