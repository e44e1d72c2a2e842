"""The soak's hostile clients and its operator (``soak.py --hostile``).

``Hostile`` threads speak raw HTTP/1.1 to the S3 port and never get a
useful answer: a request whose body stalls part way (the connection left
open until the gateway's ``client_timeout`` closes it, or closed by the
client after a few seconds), a body cut off by closing the connection,
a head that never ends, bytes that are not HTTP, and well-formed requests
the gateway must refuse, each naming something new (an access key, a
bucket, a key, a query parameter, an operation no one implements), as a
scanner or a misconfigured client does. Their answers are not checked;
the gateway must stay up, log no error and keep its memory flat.

``Operator`` asks the admin API for a flush and an eviction of the whole
cache every ``every`` seconds, as an operator on the node might.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter

from capacity import admin, log

from tests.servers import Gateway

# Connections a hostile thread leaves stalled at once, and for how long.
MAX_STALLED = 6
STALL_SECONDS = (1.0, 15.0)
METHODS = ("GET", "PUT", "POST", "DELETE", "HEAD", "PATCH", "OPTIONS", "PROPFIND")


def _word(rng: random.Random, n: int = 12) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789-") for _ in range(n))


class Hostile(threading.Thread):
    """One client sending the requests above, ``rate`` a second."""

    def __init__(self, gw: Gateway, bucket: str, seed: int, rate: float,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True, name="soak hostile")
        self.host, self.port, self.bucket = "127.0.0.1", gw.port, bucket
        self.rng = random.Random(f"hostile/{seed}")
        self.interval, self.stop = 1.0 / rate, stop
        self.sent: Counter[str] = Counter()
        self.stalled: list[tuple[float, socket.socket]] = []  # (close at, connection)

    def run(self) -> None:
        kinds = {"stalled_body": self.stalled_body, "cut_body": self.cut_body,
                 "endless_head": self.endless_head, "garbage": self.garbage,
                 "bad_signature": self.bad_signature, "unsigned": self.unsigned,
                 "bad_operation": self.bad_operation}
        names = list(kinds)
        while not self.stop.wait(self.interval):
            self.close_due()
            kind = self.rng.choice(names)
            try:
                kinds[kind]()
                self.sent[kind] += 1
            except OSError:  # refused or reset by the gateway: what it may do
                self.sent[f"{kind} (reset)"] += 1
        for _, conn in self.stalled:
            conn.close()

    def finish(self) -> dict[str, int]:
        self.join(timeout=30)
        return dict(self.sent)

    # -- connections -------------------------------------------------------------

    def connect(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=5)

    def exchange(self, data: bytes) -> None:
        """Send ``data``, read the answer until the gateway closes or 2 s pass."""
        with self.connect() as conn:
            conn.sendall(data)
            conn.settimeout(2)
            try:
                while conn.recv(65536):
                    pass
            except OSError:
                pass

    def close_due(self) -> None:
        now = time.monotonic()
        keep = []
        for due, conn in self.stalled:
            if due <= now:
                conn.close()
            else:
                keep.append((due, conn))
        self.stalled = keep

    def leave_open(self, conn: socket.socket) -> None:
        while len(self.stalled) >= MAX_STALLED:
            self.stalled.pop(0)[1].close()
        self.stalled.append((time.monotonic() + self.rng.uniform(*STALL_SECONDS), conn))

    def head(self, method: str, target: str, headers: dict[str, str]) -> bytes:
        # Connection: close, so exchange() ends when the answer does.
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host}:{self.port}",
                 "Connection: close"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def credential(self, key: str) -> str:
        return (f"AWS4-HMAC-SHA256 Credential={key}/20260101/us-east-1/s3/aws4_request, "
                f"SignedHeaders=host;x-amz-date, Signature={self.rng.getrandbits(256):064x}")

    # -- the requests --------------------------------------------------------------

    def stalled_body(self) -> None:
        """A PUT whose body stops after a few KiB; the connection stays."""
        size = self.rng.randint(64 * 1024, 4 * 1024 * 1024)
        conn = self.connect()
        conn.sendall(self.head("PUT", f"/{self.bucket}/stalled/{_word(self.rng)}", {
            "Content-Length": str(size), "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
            "x-amz-date": "20260101T000000Z", "Authorization": self.credential(_word(self.rng, 20))}))
        conn.sendall(self.rng.randbytes(self.rng.randint(0, 16 * 1024)))
        self.leave_open(conn)

    def cut_body(self) -> None:
        """A PUT that closes its connection part way through its body."""
        size = self.rng.randint(64 * 1024, 1024 * 1024)
        with self.connect() as conn:
            conn.sendall(self.head("PUT", f"/{self.bucket}/cut/{_word(self.rng)}", {
                "Content-Length": str(size), "x-amz-content-sha256": "UNSIGNED-PAYLOAD"}))
            conn.sendall(self.rng.randbytes(self.rng.randint(1, size - 1)))

    def endless_head(self) -> None:
        """A request head that stops in the middle of a header line."""
        conn = self.connect()
        conn.sendall(f"GET /{self.bucket}/{_word(self.rng)} HTTP/1.1\r\nHost: x\r\n"
                     f"X-{_word(self.rng)}: {_word(self.rng, 40)}".encode())
        self.leave_open(conn)

    def garbage(self) -> None:
        """Bytes that are not HTTP."""
        self.exchange(self.rng.randbytes(self.rng.randint(1, 4096)) + b"\r\n\r\n")

    def bad_signature(self) -> None:
        """A signed-looking request by an access key no one has."""
        method = self.rng.choice(("GET", "HEAD", "PUT", "DELETE"))
        target = f"/{_word(self.rng)}/{_word(self.rng, 30)}?{_word(self.rng, 6)}={_word(self.rng)}"
        self.exchange(self.head(method, target, {
            "x-amz-date": "20260101T000000Z", "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
            "Authorization": self.credential("AK" + _word(self.rng, 18).upper()),
            "Content-Length": "0"}))

    def unsigned(self) -> None:
        """An anonymous request for a key that may or may not exist."""
        method = self.rng.choice(("GET", "HEAD", "DELETE", "PUT"))
        target = f"/{self.rng.choice((self.bucket, _word(self.rng)))}/{_word(self.rng, 40)}"
        self.exchange(self.head(method, target, {"Content-Length": "0",
                                                 "User-Agent": _word(self.rng, 30)}))

    def bad_operation(self) -> None:
        """A method or sub-resource S3 does not have, on a new path."""
        method = self.rng.choice(METHODS)
        target = f"/{self.bucket}/{_word(self.rng)}?{_word(self.rng, 8)}&{_word(self.rng, 5)}=1"
        self.exchange(self.head(method, target, {"Content-Length": "0"}))


class Operator(threading.Thread):
    """A flush and an eviction of the whole cache every ``every`` seconds."""

    def __init__(self, gw: Gateway, every: float, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="soak operator")
        self.gw, self.every, self.stop = gw, every, stop
        self.jobs: Counter[str] = Counter()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            for job in ("flush", "evict"):
                try:
                    admin(self.gw, "POST", f"/jobs/{job}", wait="true")
                    self.jobs[job] += 1
                except Exception as exc:  # noqa: BLE001  (counted, reported; the run goes on)
                    self.jobs[f"{job} failed"] += 1
                    log(f"operator: {job} failed: {exc!r}")

    def finish(self) -> dict[str, int]:
        self.join(timeout=60)
        return dict(self.jobs)
