"""Real servers for tests: the gateway as a subprocess, moto in a thread.

Both bind 127.0.0.1 on free ports, are polled until ready, and are stopped
(by PID, for the gateway) by the fixture that started them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ACCESS_KEY = "tierstore-test-key"
SECRET_KEY = "tierstore-test-secret"
ADMIN_TOKEN = "tierstore-test-admin-token"


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: all held open while they are chosen,
    so two calls in a row cannot hand out the same port twice."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def wait_http(
    url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None,
    verify: ssl.SSLContext | bool = True,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=1.0, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


def children(pid: int) -> list[int]:
    """The PIDs of ``pid``'s child processes (a gateway's read workers)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the process or thread ended meanwhile
            pass
    return out


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
    """Signal a process we started (if it still runs), and kill it if it has
    not ended ``timeout`` seconds later."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# asyncio's report of a failed task or future nobody awaited ("Task exception
# was never retrieved", "Future exception was never retrieved", "_GatheringFuture
# exception was never retrieved"): checked in every gateway's log at its stop.
NEVER_RETRIEVED = "exception was never retrieved"


@dataclass
class Gateway:
    """A `tierstore serve` subprocess and how to reach it."""

    data_dir: Path
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    admin_port: int = 0
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    # With TLS configured (--tls-cert/--tls-key in the arguments or the
    # environment): the CA bundle that verifies the gateway's certificate.
    ca: Path | None = None

    @property
    def scheme(self) -> str:
        return "http" if self.ca is None else "https"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        return True if self.ca is None else ssl.create_default_context(cafile=str(self.ca))

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.admin_port}"

    def pids(self) -> list[int]:
        """The gateway's process and its children (its read workers), for
        their CPU from /proc."""
        assert self.proc is not None
        return [self.proc.pid, *children(self.proc.pid)]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            TIERSTORE_ACCESS_KEY=ACCESS_KEY,
            TIERSTORE_SECRET_KEY=SECRET_KEY,
            TIERSTORE_ADMIN_TOKEN=ADMIN_TOKEN,
            # One process whatever the machine's cores ("auto" would start
            # read workers on a large one); tests of workers ask for them.
            TIERSTORE_WORKERS="1",
            # A crash in native code (a signal) leaves every thread's Python
            # stack in the log, which post_mortem() shows.
            PYTHONFAULTHANDLER="1",
        )
        env.update(self.extra_env)
        return env

    def start(self, ports: tuple[int, int] | None = None) -> Gateway:
        """Start on ``ports`` (S3, admin), or on free ones."""
        self.port, self.admin_port = ports or tuple(free_ports(2))
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-gateway.log"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(self.port),
             "--admin-port", str(self.admin_port), "--data-dir", str(self.data_dir),
             *self.extra_args],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        wait_http(f"{self.admin_url}/health", proc=self.proc, verify=self.verify)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the process; then its log must hold no exception that asyncio
        reports as never retrieved (a task or future whose failure nobody
        awaited: a bug, whichever test happened to run it)."""
        if self.proc is None:
            return
        stop_process(self.proc, sig)
        self.proc = None
        unretrieved = [line for line in self.log().splitlines() if NEVER_RETRIEVED in line]
        assert not unretrieved, f"{self.log_path}: " + "; ".join(unretrieved[:3])

    def restart(self) -> Gateway:
        self.stop()
        return self.start()

    def admin(self, method: str, path: str, timeout: float = 300.0, **kwargs: object) -> httpx.Response:
        """Call the admin API with the test token; raise on an error status."""
        response = httpx.request(
            method, self.admin_url + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=timeout, verify=self.verify, **kwargs,  # type: ignore[arg-type]
        )
        response.raise_for_status()
        return response

    def run_job(self, kind: str, **body: object) -> dict:
        """Run an admin job to its end (``?wait=true``); its result."""
        job = self.admin("POST", f"/jobs/{kind}", params={"wait": "true"}, json=body or None).json()
        assert job["state"] == "succeeded", job
        return job["result"]

    def flush(self) -> dict:
        """Flush everything staged; the /tiers status after it."""
        self.run_job("flush")
        return self.admin("GET", "/tiers").json()

    def evict(self) -> dict:
        return self.run_job("evict")

    def compact(self, threshold: float | None = None) -> dict:
        return self.run_job("compact", **({"threshold": threshold} if threshold is not None else {}))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def post_mortem(self, lines: int = 80) -> str:
        """Whether the process still runs (or how it ended) and the end of
        its log: added to a failure seen while it served, so a report says
        what the gateway went through, not only what the client saw."""
        if self.proc is None:
            state = "not running (stopped by the test)"
        elif (code := self.proc.poll()) is None:
            state = f"pid {self.proc.pid}, still running"
        else:
            how = f"by signal {-code}" if code < 0 else f"with exit code {code}"
            state = f"pid {self.proc.pid}, ended {how} before the test stopped it"
        tail = self.log().splitlines()[-lines:]
        return "\n".join([f"gateway S3 {self.endpoint}, admin {self.admin_url}: {state}; "
                          f"the last {len(tail)} lines of {self.log_path}:", *tail])
