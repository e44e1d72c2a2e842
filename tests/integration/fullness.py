"""Writers against a gateway whose disk fills: the workload of the full-disk
tests (imported by test modules, not a conftest).

``Writers`` runs threads of signed raw requests (``RawReader``: a tenth of
boto3's CPU) sending small objects, large objects (past the small-object
size: they stream to the capacity store when the disk has no room) and
multipart uploads, until they have sent a given number of bytes. Every
answer is counted by (operation, status, S3 code); a refusal (503 with
Retry-After) is retried after the time it asks for, up to a bound; what was
acknowledged is remembered by key (a seed and a size: ``blob`` makes the
bytes again) for the checks after restarts. A reader thread GETs
acknowledged keys meanwhile: every read must be answered.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tests.integration.oracle import MiB, RawReader, blob, error_code
from tests.servers import Gateway

PART = 5 * MiB
RETRIES = 60  # tries of one request while it is refused; ~30 s at most


@dataclass
class Tally:
    """Every answer, by (operation, status, S3 code or "")."""

    answers: Counter[tuple[str, int, str]] = field(default_factory=Counter)
    retry_after: Counter[str] = field(default_factory=Counter)  # refusals' Retry-After values
    reads: Counter[int] = field(default_factory=Counter)  # GET statuses
    wrong_reads: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, op: str, status: int, headers: dict[str, str], body: bytes) -> None:
        code = error_code(body) if status >= 300 else ""
        with self.lock:
            self.answers[(op, status, code)] += 1
            if status == 503:
                self.retry_after[headers.get("retry-after", "")] += 1

    def count(self, status: int) -> int:
        return sum(n for (_, s, _), n in self.answers.items() if s == status)

    def refusals(self) -> Counter[tuple[int, str]]:
        return Counter({(s, c): n for (_, s, c), n in self.answers.items() if s >= 500})

    def summary(self) -> str:
        return ", ".join(f"{op} {status}{' ' + code if code else ''}: {n}"
                         for (op, status, code), n in sorted(self.answers.items()))


class Writers:
    """``threads`` writers sending ``total`` bytes to ``bucket`` (see the
    module's docstring); ``acked`` maps each acknowledged key to the
    (seed, size) of its bytes."""

    def __init__(self, gw: Gateway, bucket: str, total: int, threads: int = 8, seed: int = 0,
                 small: tuple[int, int] = (64 * 1024, 512 * 1024), large: int = 6 * MiB) -> None:
        self.reader = RawReader(gw)
        self.bucket = bucket
        self.total = total
        self.threads = threads
        self.seed = seed
        self.small = small
        self.large = large
        self.tally = Tally()
        self.acked: dict[str, tuple[str, int]] = {}
        self.sent = 0
        self.given_up = 0  # requests still refused after RETRIES tries
        self._lock = threading.Lock()
        self._stop = threading.Event()

    # -- requests -------------------------------------------------------------

    def _call(self, op: str, method: str, key: str, body: bytes = b"", query: str = "") -> tuple[int, dict, bytes]:
        """One request, retried while it is refused with a retryable 503."""
        for _ in range(RETRIES):
            status, headers, data = self.reader.request(method, self.bucket, key, body, query=query)
            self.tally.add(op, status, headers, data)
            if status != 503:
                return status, headers, data
            time.sleep(min(float(headers.get("retry-after") or 1), 0.5))
        with self._lock:
            self.given_up += 1
        return status, headers, data

    def _put(self, key: str, seed: str, size: int) -> None:
        status, _, _ = self._call("PutObject", "PUT", key, blob(seed, size))
        if status == 200:
            with self._lock:
                self.acked[key] = (seed, size)

    def _multipart(self, key: str, seed: str, size: int) -> None:
        status, _, data = self._call("CreateMultipartUpload", "POST", key, query="uploads")
        if status != 200:
            return
        upload = re.search(rb"<UploadId>([^<]+)</UploadId>", data).group(1).decode()  # type: ignore[union-attr]
        body = blob(seed, size)
        etags = []
        for number, start in enumerate(range(0, size, PART), 1):
            status, headers, _ = self._call("UploadPart", "PUT", key, body[start:start + PART],
                                            query=f"partNumber={number}&uploadId={upload}")
            if status != 200:
                self._call("AbortMultipartUpload", "DELETE", key, query=f"uploadId={upload}")
                return
            etags.append(headers["etag"])
        parts = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for n, e in enumerate(etags, 1))
        status, _, _ = self._call("CompleteMultipartUpload", "POST", key,
                                  f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode(),
                                  query=f"uploadId={upload}")
        if status == 200:
            with self._lock:
                self.acked[key] = (seed, size)

    # -- threads --------------------------------------------------------------

    def _writer(self, thread: int) -> None:
        rng = random.Random(f"{self.seed}:{thread}")
        n = 0
        while not self._stop.is_set():
            with self._lock:
                if self.sent >= self.total:
                    return
            roll = rng.random()
            key = f"w{thread}/{n}"
            seed = f"{self.seed}:{key}"
            n += 1
            if roll < 0.7:
                size = rng.randrange(*self.small)
                self._put(key, seed, size)
            elif roll < 0.9:
                size = self.large
                self._put(key, seed, size)
            else:
                size = 2 * PART + rng.randrange(MiB)
                self._multipart(key, seed, size)
            with self._lock:
                self.sent += size

    def _read(self) -> None:
        """GETs of acknowledged keys while the writers run: all answered."""
        rng = random.Random(f"{self.seed}:reader")
        while not self._stop.is_set():
            with self._lock:
                keys = list(self.acked)
            if not keys:
                time.sleep(0.05)
                continue
            key = rng.choice(keys)
            status, _, data = self.reader.request("GET", self.bucket, key)
            seed, size = self.acked[key]
            with self.tally.lock:
                self.tally.reads[status] += 1
                if status == 200 and data != blob(seed, size):
                    self.tally.wrong_reads += 1

    def run(self, during: Any = None) -> None:
        """Run the writers to the end (and the reader beside them); call
        ``during()`` once, in its own thread, when a third is sent."""
        workers = [threading.Thread(target=self._writer, args=(t,), daemon=True) for t in range(self.threads)]
        reader = threading.Thread(target=self._read, daemon=True)
        for t in [*workers, reader]:
            t.start()
        if during is not None:
            while any(t.is_alive() for t in workers) and self.sent < self.total // 3:
                time.sleep(0.05)
            during()
        for t in workers:
            t.join(timeout=300)
            assert not t.is_alive(), "a writer did not finish"
        self._stop.set()
        reader.join(timeout=60)

    def verify(self, gw: Gateway, threads: int = 8) -> None:
        """Every acknowledged object reads back byte-identical."""
        reader = RawReader(gw)

        def check(item: tuple[str, tuple[str, int]]) -> str | None:
            key, (seed, size) = item
            status, data = reader.get(self.bucket, key)
            if status != 200 or data != blob(seed, size):
                return f"{key}: {status}, {len(data)} of {size} bytes"
            return None

        with ThreadPoolExecutor(threads) as pool:
            wrong = [w for w in pool.map(check, sorted(self.acked.items())) if w is not None]
        assert not wrong, f"{len(wrong)} acknowledged objects wrong: " + "; ".join(wrong[:5])
