"""The writer's side of read workers: their sockets, start, watch and stop.

``read_workers`` runs for as long as the S3 service: it answers the
workers' lookups on one Unix socket (``gateway.workers.lookup``), and starts
``config.workers`` worker processes (``gateway.workers.worker``), each given its
setup on stdin. A worker that exits while the gateway runs is logged and
started again a second later. At the end each gets SIGTERM (its server
drains its connections), and SIGKILL if it has not exited 10 s later. The
Unix sockets live in a private temporary directory (mode 0700), removed at
the end: a socket path must stay under about 100 bytes, which a data
directory's may not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from gateway.observability.metrics import Metrics
from gateway.serving.listener import StartupError
from gateway.workers.lookup import LookupServer
from gateway.workers.worker import WorkerSetup
from tiering.identity.store import Identities
from tiering.objects import ObjectService

log = logging.getLogger("tierstore.workers")

START_SECONDS = 60.0
STOP_SECONDS = 10.0
RESTART_DELAY = 1.0


@contextlib.contextmanager
def socket_dir() -> Iterator[Path]:
    """A private directory for the Unix sockets, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="tierstore-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class WorkerPool:
    """``count`` worker processes, kept running until ``stop``."""

    def __init__(self, setup: WorkerSetup, count: int, lookups: LookupServer) -> None:
        self._setup = pickle.dumps(setup)
        self._count = count
        self._lookups = lookups
        self._stopping = False
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._watchers: list[asyncio.Task[None]] = []

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs.values() if proc.returncode is None]

    async def start(self) -> None:
        """Start the workers and wait until they all listen."""
        for slot in range(self._count):
            await self._spawn(slot)
        try:
            await self._lookups.wait_ready(self._count, START_SECONDS)
        except TimeoutError:
            raise StartupError(f"read workers did not all listen within {START_SECONDS:g}s") from None
        for slot in range(self._count):
            self._watchers.append(asyncio.create_task(self._watch(slot), name=f"read worker {slot + 1}"))

    async def _spawn(self, slot: int) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.workers.worker", stdin=asyncio.subprocess.PIPE
        )
        assert proc.stdin is not None
        proc.stdin.write(self._setup)
        await proc.stdin.drain()
        proc.stdin.close()
        self._procs[slot] = proc

    async def _watch(self, slot: int) -> None:
        while True:
            status = await self._procs[slot].wait()
            if self._stopping:
                return
            log.error("read worker %d (pid %d) exited with status %s; starting another",
                      slot + 1, self._procs[slot].pid, status)
            await asyncio.sleep(RESTART_DELAY)
            if self._stopping:
                return
            await self._spawn(slot)

    async def stop(self) -> None:
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        for proc in self._procs.values():
            if proc.returncode is None:
                proc.terminate()
        for proc in self._procs.values():
            try:
                await asyncio.wait_for(proc.wait(), STOP_SECONDS)
            except TimeoutError:
                log.warning("read worker pid %d did not stop within %gs; killing it", proc.pid, STOP_SECONDS)
                proc.kill()
                await proc.wait()


@contextlib.asynccontextmanager
async def read_workers(
    setup: WorkerSetup, service: ObjectService, metrics: Metrics, count: int, identities: Identities | None = None
) -> AsyncIterator[WorkerPool]:
    """Answer lookups on ``setup.lookup_socket`` (and count the requests the
    workers report in ``metrics``; push them ``identities`` as it changes),
    and run ``count`` workers."""
    lookups = LookupServer(service, metrics, identities)
    await lookups.start(setup.lookup_socket)
    pool = WorkerPool(setup, count, lookups)
    try:
        await pool.start()
        yield pool
    finally:
        await pool.stop()
        await lookups.close()
