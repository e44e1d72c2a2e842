"""A randomized crash loop: a mixed S3 workload against a gateway
subprocess, SIGKILLed at a random moment, restarted on the same data
directory and capacity store, and checked against an oracle of
acknowledged writes after every restart.

What a check after a restart holds the gateway to, key by key:

- an acknowledged write reads back byte-identical, and its HEAD answers the
  same length and ETag (the MD5, or the multipart ETag);
- an acknowledged delete stays deleted;
- a key whose write or delete was in flight at the kill holds its
  acknowledged value or the in-flight one, whole: never a truncation or a
  mix. A multipart upload is in flight only once its Complete was sent
  (before that its object cannot exist), and then it is all there or not;
- ListObjectsV2 lists exactly the keys that read back, with their sizes
  and ETags.

What the check saw then becomes the acknowledged state: an in-flight write
that landed is now as good as acknowledged. A multipart upload the kill
left open is still listed and is completed with the parts acknowledged
before the kill (an UploadPart answered is durable); uploads whose creation
was cut are aborted. Some cycles stop the gateway cleanly (SIGTERM) under
the same load instead; the data directory must then pass fsck at once.
At the end: a flush, a check, an evict and a check again (every object
comes back from the capacity store), a clean stop, fsck, no half-written
object in a local capacity store, and a data directory rebuilt from the
capacity store alone (``tierstore recover``) holding exactly the oracle's
state. Throughout, the gateway's log holds no Traceback and no ERROR line.

The workload: client threads (boto3, retries off) choosing from a seeded
stream small PUTs (packed), large PUTs (several extents), multipart
uploads, deletes, DeleteObjects and admin jobs (flush, compact, warm,
evict), over a small pool of keys so that writes and deletes hit existing
objects. A key is used by one operation at a time, so the oracle knows
what each key may hold.

A seed fixes every choice of the harness (operations, keys, sizes, kill
delays and moments); thread interleaving and where exactly the gateway was
when the kill came still vary, so a seed replays the same workload and kill
times, not the same schedule. The long mode, for release checks::

    python -m tests.crashloop --cycles 200 --seed 7 --capacity local
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.client import HTTPException
from pathlib import Path
from typing import Any

import httpx
from botocore.exceptions import BotoCoreError, ClientError

from tests.conftest import assert_consistent, make_client, moto_endpoint
from tests.integration.oracle import (
    Entry,
    MiB,
    Oracle,
    RawReader,
    admin,
    blob,
    error_code,
    flush,
    kill,
    list_all,
    rebuild_offline,
    segment_files,
    staged_files,
    temp_files,
)
from tests.integration.test_capacity import capacity_args
from tests.servers import ADMIN_TOKEN, Gateway, wait_http
from tiering.model.uploads import md5_of_parts

BUCKET = "crashloop"
SERVE_ARGS = [
    "--segment-size", "8M", "--part-size", "5M", "--small-object-size", "1M",
    "--flush-delay", "1", "--access-log", "off",
]
# A hot tier a few large objects fill: bodies that do not fit stream past
# it into segments of their own, and the cache gets evicted.
HOT_SIZE = "48M"
PART = 5 * MiB
# Operation kinds and how often a worker picks each.
KINDS: dict[str, int] = {
    "put-small": 30,
    "put-large": 8,
    "multipart": 5,
    "delete": 8,
    "delete-many": 4,
    "flush": 3,
    "compact": 2,
    "warm": 2,
    "evict": 2,
}
JOB_KINDS = ("flush", "compact", "warm", "evict")
THREADS = 4
MAX_DELAY = 2.0  # longest a cycle's workload runs before the kill, in seconds
START_WAIT = 120.0  # seconds a start-up may take beyond the usual 30 on a loaded machine
JOB_WAIT = 120.0  # seconds an admin job (waited for) may take


@dataclass(frozen=True, slots=True)
class LoopConfig:
    seed: int
    cycles: int
    capacity: str = "local"  # "local" (a directory) or "s3" (moto at moto_endpoint)
    moto_endpoint: str = ""
    threads: int = THREADS
    keys: int = 16
    max_delay: float = MAX_DELAY
    rebuild: bool = True  # at the end, check a data directory rebuilt from the capacity store
    hot_size: str = HOT_SIZE
    admin_at_stop: bool = False  # admin job requests in flight at a clean stop too

    def replay(self) -> str:
        """The command that runs this loop again."""
        extra = "" if self.threads == THREADS else f" --threads {self.threads}"
        extra += "" if self.hot_size == HOT_SIZE else f" --hot-size {self.hot_size}"
        extra += "" if self.max_delay == MAX_DELAY else f" --max-delay {self.max_delay}"
        extra += " --admin-at-stop" if self.admin_at_stop else ""
        return (f"python -m tests.crashloop --seed {self.seed} --capacity {self.capacity} "
                f"--cycles {self.cycles}{extra}")


Parts = list[tuple[int, str, bytes]]  # (part number, ETag, bytes) of UploadParts answered
Progress = Callable[[str], None]


class CrashLoopFailure(AssertionError):
    """The gateway broke a promise; the message says which, and how to replay."""


@dataclass(eq=False)
class Op:
    """One client operation: what it would leave in each key it touches."""

    kind: str
    candidates: dict[str, Entry] = field(default_factory=dict)
    sent: bool = True  # False: a multipart upload whose Complete was never sent
    upload: tuple[str, str] | None = None  # (key, upload id), once CreateMultipartUpload answered
    parts: Parts = field(default_factory=list)

    def __str__(self) -> str:
        keys = sorted(self.candidates) or ([self.upload[0]] if self.upload else [])
        return f"{self.kind} {' '.join(keys)}".strip()


@dataclass
class Summary:
    seed: int
    capacity: str
    cycles: int = 0
    kills: int = 0
    acknowledged: Counter[str] = field(default_factory=Counter)
    in_flight: Counter[str] = field(default_factory=Counter)  # cut by a kill or stop, by kind
    resolved: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, outcome)
    refused: Counter[str] = field(default_factory=Counter)  # 503 SlowDown answers
    moments: Counter[str] = field(default_factory=Counter)  # what each kill waited for
    uploads_completed: int = 0  # after a kill, with the parts acknowledged before it
    uploads_aborted: int = 0
    wall: float = 0.0

    def render(self) -> str:
        resolved = Counter({f"{kind} {outcome}": n for (kind, outcome), n in self.resolved.items()})
        lines = [
            f"crash loop: seed {self.seed}, capacity {self.capacity}, {self.cycles} cycles, "
            f"{self.kills} kills and {self.moments['term']} clean stops under load, "
            f"{self.wall:.1f} s",
            "stopped at: " + _counts(self.moments),
            "acknowledged: " + _counts(self.acknowledged),
            "cut by a kill or stop: " + _counts(self.in_flight),
            "how they resolved: " + _counts(resolved),
            "refused (SlowDown): " + _counts(self.refused),
            f"open uploads after a kill: {self.uploads_completed} completed, "
            f"{self.uploads_aborted} aborted",
        ]
        return "\n".join(lines)


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counter.items())) or "none"


class Ledger:
    """What the harness knows: acknowledged values (the Oracle), operations
    running or cut by a kill with the values they would leave, the key
    claims, counts and problems."""

    def __init__(self, keys: list[str], summary: Summary) -> None:
        self.oracle = Oracle()
        self.keys = keys
        self.summary = summary
        self.problems: list[str] = []
        self.pending: list[Op] = []  # cut by a kill: resolved by the next check
        self._claims = {key: threading.Lock() for key in keys}
        self._mutex = threading.Lock()
        self.stopping = threading.Event()
        self._jobs_running = 0
        self._admin_quiet = False

    def begin_cycle(self) -> None:
        self.stopping.clear()
        self._admin_quiet = False

    def begin_job(self) -> bool:
        """Count a job request about to be sent; False once the admin API
        is to stay quiet."""
        with self._mutex:
            if self._admin_quiet:
                return False
            self._jobs_running += 1
            return True

    def end_job(self) -> None:
        with self._mutex:
            self._jobs_running -= 1

    def quiet_admin(self, timeout: float) -> bool:
        """Send no more job requests; True once none is in flight."""
        with self._mutex:
            self._admin_quiet = True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._mutex:
                if not self._jobs_running:
                    return True
            time.sleep(0.01)
        return False

    def acknowledged(self, key: str) -> Entry:
        return self.oracle.entries.get((BUCKET, key), Entry(None))

    def allowed(self, key: str) -> list[Entry]:
        """What ``key`` may hold now: the acknowledged value first."""
        cut = [op.candidates[key] for op in self.pending if key in op.candidates]
        return [self.acknowledged(key), *cut]

    @contextlib.contextmanager
    def claim(self, rng: random.Random, count: int) -> Iterator[list[str]]:
        """``count`` keys no other operation is using (fewer if busy)."""
        taken = [k for k in rng.sample(self.keys, count) if self._claims[k].acquire(blocking=False)]
        try:
            yield taken
        finally:
            for key in taken:
                self._claims[key].release()

    def problem(self, text: str) -> None:
        with self._mutex:
            self.problems.append(text)

    @contextlib.contextmanager
    def running(self, op: Op) -> Iterator[Op]:
        """Run ``op``'s requests: acknowledged when the block ends, in
        flight when the kill cut it, a problem when the gateway refused or
        failed it otherwise."""
        try:
            yield op
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = exc.response.get("Error", {}).get("Code", "?")
            if code == "SlowDown":  # refused before any byte was staged
                with self._mutex:
                    self.summary.refused[op.kind] += 1
                return
            self.cut(op)
            self.problem(f"{op}: answered {status} {code}: {exc}")
        except (BotoCoreError, httpx.HTTPError, OSError) as exc:
            self.cut(op)
            if not self.stopping.is_set():
                self.problem(f"{op}: connection lost before the kill: {exc!r}")
        except Exception as exc:  # an assertion on the answer, or a harness bug: both stop the loop
            self.cut(op)
            self.problem(f"{op}: {exc!r}")
        else:
            if op not in self.pending:
                with self._mutex:
                    self.summary.acknowledged[op.kind] += 1

    def cut(self, op: Op) -> None:
        with self._mutex:
            self.pending.append(op)
            self.summary.in_flight[op.kind] += 1


@dataclass
class Cycle:
    """One gateway run under the workload."""

    gw: Gateway
    s3: Any
    ledger: Ledger
    label: str  # seed and cycle: seeds the workers, names the bytes each write sends
    max_delay: float
    admin_at_stop: bool = False


# -- the workload ------------------------------------------------------------


def _put(cycle: Cycle, rng: random.Random, name: str, large: bool) -> None:
    ledger = cycle.ledger
    if large:  # two or three extents
        size = rng.randint(MiB + 1, 2 * PART + MiB)
    else:  # packed; many small, a few empty
        size = rng.randint(0, MiB) // rng.choice([1, 16, 256])
    with ledger.claim(rng, 1) as keys:
        if keys:
            data = blob(name, size, compressible=rng.random() < 0.3)
            with ledger.running(Op("put-large" if large else "put-small", {keys[0]: Entry(data)})):
                ledger.oracle.put(cycle.s3, BUCKET, keys[0], data)


def _multipart(cycle: Cycle, rng: random.Random, name: str) -> None:
    """Create, upload one to three parts, Complete: the object appears whole
    at the Complete, or not at all."""
    ledger = cycle.ledger
    sizes = [PART] * rng.randint(0, 2) + [rng.randint(1, 3 * MiB)]
    with ledger.claim(rng, 1) as keys:
        if not keys:
            return
        key, s3 = keys[0], cycle.s3
        parts = [blob(f"{name}-{n}", size) for n, size in enumerate(sizes)]
        op = Op("multipart", sent=False)
        with ledger.running(op):
            upload = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
            op.upload = (key, upload)
            for number, body in enumerate(parts, start=1):
                answer = s3.upload_part(
                    Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=number, Body=body
                )
                op.parts.append((number, answer["ETag"], body))
            op.candidates[key], op.sent = _assembled(op.parts), True
            ledger.oracle.entries[(BUCKET, key)] = _complete(s3, key, upload, op.parts)


def _assembled(parts: Parts) -> Entry:
    """The object a Complete of ``parts`` makes."""
    bodies = [body for *_, body in parts]
    return Entry(b"".join(bodies), etag=md5_of_parts([hashlib.md5(b).hexdigest() for b in bodies]))


def _complete(s3: Any, key: str, upload: str, parts: Parts) -> Entry:
    chosen = [{"PartNumber": number, "ETag": etag} for number, etag, _ in parts]
    done = s3.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": chosen}
    )
    entry = _assembled(parts)
    assert done["ETag"].strip('"') == entry.etag, (key, done["ETag"], entry.etag)
    return entry


def _delete(cycle: Cycle, rng: random.Random, many: bool) -> None:
    ledger = cycle.ledger
    with ledger.claim(rng, rng.randint(2, 4) if many else 1) as keys:
        if not keys:
            return
        op = Op("delete-many" if many else "delete", {key: Entry(None) for key in keys})
        with ledger.running(op):
            if many:
                ledger.oracle.delete_batch(cycle.s3, BUCKET, keys)
            else:
                ledger.oracle.delete(cycle.s3, BUCKET, keys[0])


def _job(cycle: Cycle, rng: random.Random, kind: str) -> None:
    """An admin job, waited for; it must succeed (unless the kill cuts it)."""
    bodies: dict[str, Callable[[], dict[str, Any] | None]] = {
        "flush": lambda: None,
        "compact": lambda: {"threshold": rng.choice([0.5, 0.9])},
        "warm": lambda: {"bucket": BUCKET, "prefix": rng.choice(["", "k/0", "k/1"])},
        "evict": lambda: rng.choice([{}, {"bucket": BUCKET, "prefix": "k/1"}]),
    }
    body = bodies[kind]()
    if not cycle.ledger.begin_job():
        return
    try:
        with cycle.ledger.running(op := Op(kind)):
            resp = httpx.post(
                f"{cycle.gw.admin_url}/jobs/{kind}", params={"wait": "true"}, json=body,
                timeout=JOB_WAIT, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            )
            job = resp.json()
            stopped = resp.status_code == 503 or job.get("state") == "cancelled"
            if stopped and cycle.ledger.stopping.is_set():
                cycle.ledger.cut(op)  # a clean stop refuses new jobs and cancels running ones
                return
            assert resp.status_code == 200 and job["state"] == "succeeded", f"{kind} {body}: {job}"
    finally:
        cycle.ledger.end_job()


def _one(cycle: Cycle, rng: random.Random, name: str) -> None:
    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    if kind in JOB_KINDS:
        _job(cycle, rng, kind)
    elif kind == "multipart":
        _multipart(cycle, rng, name)
    elif kind.startswith("put"):
        _put(cycle, rng, name, large=kind == "put-large")
    else:
        _delete(cycle, rng, many=kind == "delete-many")


def _worker(cycle: Cycle, rng: random.Random, thread: int) -> None:
    count = 0
    try:
        while not cycle.ledger.stopping.is_set():
            _one(cycle, rng, f"{cycle.label}:{thread}:{count}")
            count += 1
    except Exception as exc:  # outside any request: a harness bug, which must not pass silently
        cycle.ledger.problem(f"worker {thread}: {exc!r}")


# When a kill lands after the delay: at once, or as soon as the local
# capacity store shows a segment being written, one newly published (its
# index commit may not have happened yet), or one deleted (a compaction's
# old segment or an unused one); each waits at most MOMENT_WAIT seconds for
# its event, then kills anyway. "term" is a clean stop (SIGTERM) under the
# same load instead: requests in flight end or are cut, and the data
# directory must then pass fsck as it is (the next start trusts it and
# skips the sweep). The admin API goes on answering while the node closes
# its index (the S3 port stops first), and a request reaching it then fails
# with 500, so a clean stop waits for admin jobs in flight and comes under
# S3 load only, unless ``admin_at_stop`` asks for both.
MOMENTS = ("delay", "delay", "upload", "new", "gone", "term")
MOMENT_WAIT = 1.5


def wait_for_moment(moment: str, cap: Path | None) -> None:
    if cap is None or moment in ("delay", "term"):
        return
    segments, temps = set(segment_files(cap)), set(temp_files(cap))
    changed: dict[str, Callable[[], bool]] = {
        "upload": lambda: bool(set(temp_files(cap)) - temps),
        "new": lambda: bool(set(segment_files(cap)) - segments),
        "gone": lambda: bool(segments - set(segment_files(cap))),
    }
    deadline = time.monotonic() + MOMENT_WAIT
    while not changed[moment]() and time.monotonic() < deadline:
        time.sleep(0.002)


def run_and_kill(cycle: Cycle, rng: random.Random, threads: int, cap: Path | None) -> str:
    """Run the workload for a random while, then SIGKILL the gateway under
    it (at a chosen moment) and wait for the clients to give up; the moment."""
    ledger = cycle.ledger
    delay, moment = rng.uniform(0.1, cycle.max_delay), rng.choice(MOMENTS)
    if cap is None and moment not in ("delay", "term"):
        moment = "delay"  # the store's events are watched in a local directory only
    ledger.begin_cycle()
    workers = [
        threading.Thread(
            target=_worker, args=(cycle, random.Random(f"{cycle.label}:{t}"), t),
            name=f"crashloop-{t}", daemon=True,
        )
        for t in range(threads)
    ]
    for worker in workers:
        worker.start()
    time.sleep(delay)
    wait_for_moment(moment, cap)
    if moment == "term" and not cycle.admin_at_stop and not ledger.quiet_admin(JOB_WAIT):
        ledger.problem(f"an admin job did not end within {JOB_WAIT:.0f} s")
    ledger.stopping.set()  # no new operation starts; the running ones are cut
    if moment == "term":
        _terminate(cycle.gw, ledger)
    else:
        kill(cycle.gw)
        ledger.summary.kills += 1
    for worker in workers:
        worker.join(120)
        if worker.is_alive():
            ledger.problem(f"{worker.name}: a client request did not end within 120 s of the kill")
    if moment == "term":
        try:
            assert_consistent(cycle.gw)
        except AssertionError as exc:
            ledger.problem(f"after a clean stop under load: {exc}")
    return moment


def _terminate(gw: Gateway, ledger: Ledger, grace: float = 60.0) -> None:
    """SIGTERM, and the process must end by itself within ``grace`` seconds."""
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGTERM)
    try:
        code = gw.proc.wait(grace)
    except subprocess.TimeoutExpired:
        ledger.problem(f"the gateway did not stop within {grace:.0f} s of SIGTERM")
        gw.proc.kill()
        code = gw.proc.wait()
    if code != 0:
        ledger.problem(f"the gateway exited with {code} after SIGTERM")
    gw.proc = None


# -- the check after a restart -----------------------------------------------


def _describe(status: int, body: bytes, allowed: list[Entry]) -> str:
    if status != 200:
        return f"read {status} {error_code(body)}; allowed: {_listed(allowed)}"
    seen = f"{len(body)} bytes (md5 {hashlib.md5(body).hexdigest()})"
    prefix_of = [len(e.data) for e in allowed if e.data is not None and e.data.startswith(body)]
    cut = f", a prefix of the {prefix_of[0]} allowed" if prefix_of else ""
    return f"read {seen}{cut}; allowed: {_listed(allowed)}"


def _listed(allowed: list[Entry]) -> str:
    return "; ".join(
        f"{len(e.data)} bytes (md5 {hashlib.md5(e.data).hexdigest()})" if e.data is not None
        else "absent"
        for e in allowed
    )


def _observe(reader: RawReader, ledger: Ledger, key: str) -> Entry | None:
    """What ``key`` holds, matched against what it may hold (None: nothing
    allowed matches, a problem is recorded)."""
    allowed = ledger.allowed(key)
    try:
        status, headers, body = reader.request("GET", BUCKET, key)
    except (OSError, HTTPException) as exc:  # e.g. a body shorter than its Content-Length
        ledger.problem(f"{key}: GET failed: {exc!r}; allowed: {_listed(allowed)}")
        return None
    if status == 404 and error_code(body) == "NoSuchKey":
        match = next((e for e in allowed if e.data is None), None)
    elif status == 200:
        match = next((e for e in allowed if e.data == body), None)
    else:
        match = None
    if match is None:
        ledger.problem(f"{key}: {_describe(status, body, allowed)}")
        return None
    if match.data is not None:
        etag = match.expected_etag()
        status, head, _ = reader.request("HEAD", BUCKET, key)
        got = (status, head.get("etag", "").strip('"'), head.get("content-length"))
        if got != (200, etag, str(len(match.data))) or headers.get("etag", "").strip('"') != etag:
            ledger.problem(f"{key}: HEAD answered {got}, GET ETag {headers.get('etag')}; "
                           f"the bytes are {len(match.data)} long with ETag {etag}")
    return match


def _check_listing(s3: Any, ledger: Ledger, seen: dict[str, Entry]) -> None:
    listed = {o["Key"]: (o["Size"], o["ETag"].strip('"')) for o in list_all(s3, BUCKET)}
    want = {k: (len(e.data), e.expected_etag()) for k, e in seen.items() if e.data is not None}
    for key in sorted(listed.keys() | want.keys()):
        if key in seen and listed.get(key) != want.get(key):
            ledger.problem(f"{key}: listed as {listed.get(key)}, read back as {want.get(key)}")
        elif key not in seen:
            ledger.problem(f"{key}: listed, but not a key the workload wrote")


def _resolve(ledger: Ledger, seen: dict[str, Entry]) -> None:
    """Fold what was seen into the oracle; count how each cut operation ended."""
    before = {key: ledger.acknowledged(key) for key in ledger.keys}
    for op in ledger.pending:
        ledger.summary.resolved[(op.kind, _outcome(op, seen, before))] += 1
    ledger.pending.clear()
    for key, entry in seen.items():
        ledger.oracle.entries[(BUCKET, key)] = entry


def _outcome(op: Op, seen: dict[str, Entry], before: dict[str, Entry]) -> str:
    if op.kind in JOB_KINDS:
        return "job"
    if not op.sent:
        return "not sent"
    changes = [seen[k] is new for k, new in op.candidates.items() if new.data != before[k].data]
    if not changes:
        return "no change"  # e.g. a delete of a key that was absent anyway
    if all(changes):
        return "landed"
    return "partly" if any(changes) else "not landed"


def check(gw: Gateway, s3: Any, ledger: Ledger) -> None:
    """Every key against the oracle and the cut operations, the listing
    against the keys; then the oracle takes what was seen."""
    reader = RawReader(gw)
    seen: dict[str, Entry] = {}
    for key in ledger.keys:
        match = _observe(reader, ledger, key)
        if match is not None:
            seen[key] = match
    if ledger.problems:
        return
    _check_listing(s3, ledger, seen)
    uploads = [op for op in ledger.pending if op.upload is not None]
    _resolve(ledger, seen)
    _finish_uploads(s3, ledger, uploads, seen)


def _finish_uploads(s3: Any, ledger: Ledger, cut: list[Op], seen: dict[str, Entry]) -> None:
    """Multipart uploads a kill cut: one whose Complete landed is gone; any
    other the gateway acknowledged is still listed, and completing it with
    the parts acknowledged before the kill gives exactly their bytes. The
    rest (creation cut, or no part answered) are aborted."""
    answer = s3.list_multipart_uploads(Bucket=BUCKET)
    listed = {(u["Key"], u["UploadId"]) for u in answer.get("Uploads", [])}
    for op in cut:
        key, upload = op.upload  # type: ignore[misc]
        if op.sent and seen[key] is op.candidates[key]:
            if (key, upload) in listed:
                ledger.problem(f"{key}: upload {upload} completed, but still listed")
        elif (key, upload) not in listed:
            ledger.problem(f"{key}: upload {upload}, acknowledged before the kill, is not listed")
        elif op.parts:
            listed.discard((key, upload))
            _resume(s3, ledger, key, upload, op.parts)
    for key, upload in sorted(listed):
        s3.abort_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload)
        ledger.summary.uploads_aborted += 1


def _resume(s3: Any, ledger: Ledger, key: str, upload: str, parts: Parts) -> None:
    try:
        ledger.oracle.entries[(BUCKET, key)] = _complete(s3, key, upload, parts)
        ledger.summary.uploads_completed += 1
    except (ClientError, AssertionError) as exc:
        ledger.problem(f"{key}: completing upload {upload} with the {len(parts)} part(s) "
                       f"acknowledged before the kill failed: {exc}")


# -- the loop ----------------------------------------------------------------


class Loop:
    """The gateway, its stores, the ledger; one run of the crash loop."""

    def __init__(self, config: LoopConfig, root: Path, progress: Progress | None = None) -> None:
        self.config = config
        self.progress = progress
        self.summary = Summary(config.seed, config.capacity)
        self.ledger = Ledger([f"k/{i:02d}" for i in range(config.keys)], self.summary)
        name = f"crashloop-{config.seed % 10**9}-{int(time.time() * 1000) % 10**9}"
        self.capacity = capacity_args(config.capacity, config.moto_endpoint, root, name)
        self.cap_dir = root / "capacity" if config.capacity == "local" else None
        self.root = root
        serve = [*self.capacity, *SERVE_ARGS, "--hot-size", config.hot_size]
        self.gw = Gateway(root / "data", extra_args=serve)
        self._log_seen = 0

    def fail(self, cycle: int | str, problems: list[str]) -> CrashLoopFailure:
        shown = "\n".join(problems[:30])
        return CrashLoopFailure(
            f"crash loop seed {self.config.seed} ({self.config.capacity}), cycle {cycle}: "
            f"{len(problems)} problem(s):\n{shown}\nreplay: {self.config.replay()}\n"
            f"--- gateway log (end) ---\n{self.gw.log()[-4000:]}"
        )

    def start(self, cycle: int | str) -> Any:
        try:
            try:
                self.gw.start()
            except TimeoutError:  # a loaded machine: give it longer before calling it a failure
                wait_http(f"{self.gw.admin_url}/health", timeout=START_WAIT, proc=self.gw.proc)
        except (RuntimeError, TimeoutError) as exc:
            raise self.fail(cycle, [f"the gateway did not start: {exc}"]) from None
        return make_client(self.gw.endpoint, max_pool_connections=2 * self.config.threads)

    def verify(self, cycle: int | str, s3: Any) -> None:
        check(self.gw, s3, self.ledger)
        self._scan_log()
        if self.ledger.problems:
            raise self.fail(cycle, self.ledger.problems)

    def _scan_log(self) -> None:
        """A Traceback or an ERROR line in the gateway's log is a problem:
        crashes and restarts are the normal case here, not an alarm."""
        text = self.gw.log()
        new = text[self._log_seen:]
        self._log_seen = len(text)
        if "Traceback" in new:
            self.ledger.problem("the gateway logged a Traceback")
        errors = [ln for ln in new.splitlines() if " ERROR " in ln or ln.startswith("ERROR:")]
        if errors:
            self.ledger.problem(f"the gateway logged {len(errors)} error(s); first: {errors[0]}")

    def cycle(self, number: int) -> None:
        s3 = self.start(number)
        if number == 0:
            s3.create_bucket(Bucket=BUCKET)
        else:
            self.verify(number, s3)
        config = self.config
        cycle = Cycle(self.gw, s3, self.ledger, f"{config.seed}:{number}", config.max_delay,
                      config.admin_at_stop)
        rng = random.Random(f"{config.seed}:kill:{number}")
        moment = run_and_kill(cycle, rng, config.threads, self.cap_dir)
        self.summary.cycles += 1
        self.summary.moments[moment] += 1
        if self.progress is not None and (number + 1) % 10 == 0:
            cut = sum(self.summary.in_flight.values())
            self.progress(f"cycle {number + 1}/{config.cycles}: {cut} operations cut so far")
        if self.ledger.problems:
            raise self.fail(number, self.ledger.problems)

    def finish(self) -> None:
        """The last restart: check, flush and check, evict and check (every
        object read from the capacity store), stop cleanly, fsck."""
        s3 = self.start("end")
        self.verify("end", s3)
        status = flush(self.gw)
        problems = [f"staged file left after a flush: {p}" for p in staged_files(self.gw.data_dir)]
        if status["flush_queue"] or status["hot_staged"]:
            problems.append(f"after a flush: {status}")
        self.verify("end, flushed", s3)
        admin(self.gw, "POST", "/jobs/evict", params={"wait": "true"})
        self.verify("end, evicted", s3)
        if self.cap_dir is not None and status["segments"] != len(segment_files(self.cap_dir)):
            problems.append(f"the index knows {status['segments']} segments, the store holds "
                            f"{len(segment_files(self.cap_dir))}")
        problems += self.stop()
        if self.cap_dir is not None:
            problems += [f"half-written capacity object: {p}" for p in temp_files(self.cap_dir)]
        if problems or self.ledger.problems:
            raise self.fail("end", problems + self.ledger.problems)

    def stop(self) -> list[str]:
        """Stop the gateway cleanly; what fsck and its log say is wrong."""
        self.gw.stop()
        self._scan_log()
        try:
            assert_consistent(self.gw)
        except AssertionError as exc:
            return [str(exc)]
        return []

    def rebuild(self) -> None:
        """What the node's disk loss would leave: a data directory rebuilt
        from the capacity store alone (``tierstore recover``) holds exactly
        what the oracle says, every deleted key still deleted."""
        self.gw, self._log_seen = Gateway(self.root / "rebuilt", extra_args=self.gw.extra_args), 0
        report = rebuild_offline(self.gw.data_dir, self.capacity)
        if report["incomplete"]:
            raise self.fail("rebuilt", [f"manifests name segments that do not exist: {report}"])
        self.verify("rebuilt", self.start("rebuilt"))
        problems = self.stop()
        if problems:
            raise self.fail("rebuilt", problems)

    def run(self) -> Summary:
        started = time.monotonic()
        where: int | str = 0
        try:
            for where in range(self.config.cycles):
                self.cycle(where)
            where = "end"
            self.finish()
            if self.config.rebuild:
                where = "rebuilt"
                self.rebuild()
        except CrashLoopFailure:
            raise
        except Exception as exc:  # still a failure to replay: say which seed
            raise self.fail(where, [f"{type(exc).__name__}: {exc}"]) from exc
        finally:
            self.gw.stop()
            self.summary.wall = time.monotonic() - started
        return self.summary


def run(config: LoopConfig, root: Path, progress: Progress | None = None) -> Summary:
    """Run the crash loop in ``root``; raise CrashLoopFailure on a broken
    promise. ``progress`` gets a line every ten cycles."""
    return Loop(config, root, progress).run()


# -- the command line ----------------------------------------------------------


def _moto() -> contextlib.AbstractContextManager[str]:
    """The tests' moto server (the ``moto_endpoint`` fixture), outside pytest."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    return contextlib.contextmanager(moto_endpoint.__wrapped__)()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.crashloop", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cycles", type=int, default=200, help="kills (or clean stops)")
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(10**6),
                        help="default: a random one (printed)")
    parser.add_argument("--capacity", choices=["local", "s3"], default="local",
                        help="a local directory, or S3 (moto, started here)")
    parser.add_argument("--threads", type=int, default=THREADS, help="client threads")
    parser.add_argument("--hot-size", default=HOT_SIZE, help="the gateway's --hot-size")
    parser.add_argument("--max-delay", type=float, default=MAX_DELAY,
                        help="longest a cycle's workload runs before the kill, in seconds")
    parser.add_argument("--admin-at-stop", action="store_true",
                        help="send admin jobs during clean stops too")
    parser.add_argument("--keep", action="store_true", help="keep the data directory (printed)")
    args = parser.parse_args(argv)
    print(f"crash loop: seed {args.seed}, {args.cycles} cycles, {args.capacity}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="crashloop-"))
    with contextlib.ExitStack() as stack:
        endpoint = stack.enter_context(_moto()) if args.capacity == "s3" else ""
        config = LoopConfig(
            args.seed, args.cycles, args.capacity, endpoint, threads=args.threads,
            max_delay=args.max_delay, hot_size=args.hot_size, admin_at_stop=args.admin_at_stop,
        )
        try:
            summary = run(config, root, lambda line: print(line, flush=True))
        except CrashLoopFailure as exc:
            print(exc, file=sys.stderr)
            print(f"data directory kept: {root}", file=sys.stderr)
            return 1
    print(summary.render())
    if args.keep:
        print(f"data directory: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
