"""Read workers: more processes serving S3 on the same port, one index writer.

``serve --workers N`` (N > 1) runs the gateway as today (the writer:
index, hot tier, flush, prefetch, admin API), but for its S3 listener, and
starts N read workers, each its own Python process, so each its own GIL.
They listen on the S3 port with SO_REUSEPORT and the kernel spreads
connections over them; the writer only holds the port, so that its event
loop is free for the workers' lookups and the requests they pass on.

A worker verifies and answers GetObject and HeadObject itself when the
object is all in the hot tier (a managed object, or a mounted one whose
validation holds): it asks the writer where the bytes are
(``gateway.workers.lookup``), then reads the files, a small object's on its event
loop when the page cache holds them, else with pread in its own pool. It
keeps the writer's answer, and answers later GETs of the key from it for as
long as no write of the key happened (a counter per key in shared memory,
``tiering/index/generations.py``, which the writer moves before acknowledging a
write) and a mounted object's validation holds: a GET on a worker sees every
write the writer acknowledged. The writer counts the hit and moves the
epoch readers as for its own reads: at the lookup, or when the worker
reports the reads it answered from kept answers. Every other request (writes, listings, misses,
mounted objects due for revalidation, multipart) the worker passes to the writer unchanged over a
Unix socket (``gateway.workers.forward``), where the writer's S3 app authenticates
and answers it. A file that goes away between the lookup and the open
(evicted, or renamed by a flush) sends the request to the writer too; a file
already open keeps its bytes until the response is sent.

A worker is started by the writer (``python -m gateway.workers.worker``), reads its
configuration from stdin (a pickled Config: the secrets never touch the
disk or the command line), and stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gateway import routes
from gateway.app import S3App
from gateway.auth import sigv4
from gateway.auth.access import Access
from gateway.config.values import Config, tier_settings
from gateway.handlers.context import Context
from gateway.observability.accesslog import AccessLog
from gateway.s3.errors import S3Error
from gateway.s3.http import ClientDisconnected, S3Request, new_request_id
from gateway.serving import listener, process
from gateway.workers.forward import Forwarder
from gateway.workers.lookup import Elsewhere, LookupClient
from packer.ranges import ByteRange, split_over
from tiering import pool
from tiering.batch.hot import HotBatch, Pieces, close_all
from tiering.batch.member import Member
from tiering.cluster.peers import PEER_HEADER
from tiering.errors import NoSuchBucket, NoSuchKey, TierstoreError
from tiering.hot.logs import KEY
from tiering.hot.open_files import Opened, read_files_now
from tiering.hot.tier import HotTier
from tiering.identity.directory import EMPTY, Directory
from tiering.identity.sealing import Sealer, load_key
from tiering.identity.state import State
from tiering.index.generations import Generations, slot_of
from tiering.memo import CACHES, Kept
from tiering.meta import ObjectMeta, now_ms
from tiering.model.names import check_key
from tiering.reads.plan import (
    NOW_READ,
    SMALL_READ,
    Block,
    Place,
    Read,
    ReadPlan,
    ReadTally,
    decide,
    hot_plan,
    plan,
)
from tiering.reads.readahead import stream

log = logging.getLogger("tierstore.workers")

# Seconds between two reports of the requests served here to the writer.
REPORT_EVERY = 1.0
# A worker opens every file of a response before its head goes out (a file
# evicted later cannot cut the body short); a read over more pieces than
# this (256 MiB at the default 8 MiB parts) goes to the writer instead.
MAX_OPEN_PIECES = 32
# What a worker may answer itself; everything else goes to the writer.
SERVED_HERE = frozenset({"GetObject", "HeadObject", "GetBatch"})
# A batch a worker serves: at most this many objects, each at most
# SMALL_READ, all hot; its files are all opened before the first byte (an
# eviction cannot cut it), so the count bounds the descriptors it holds.
MAX_BATCH_HERE = 256


@dataclass(frozen=True)
class WorkerSetup:
    """What the writer hands a worker on stdin."""

    config: Config
    lookup_socket: str
    writer_socket: str
    generations: str  # the writer's shared table of write generations


def _open_files(files: list[Place], wanted: list[int]) -> dict[int, int]:
    """Descriptors on the files of the pieces ``wanted``, each file of its
    own checked for its size (a log's bytes never change); Elsewhere (none
    left open) if one is gone or not whole."""
    fds: dict[int, int] = {}
    try:
        for index in wanted:
            path, offset, size = files[index]
            fd = os.open(path, os.O_RDONLY)
            fds[index] = fd
            if not offset and os.fstat(fd).st_size != size:
                raise Elsewhere()
    except (FileNotFoundError, Elsewhere):
        for fd in fds.values():
            os.close(fd)
        raise Elsewhere() from None
    return fds


def _read_files(files: list[Place]) -> bytes:
    fds = _open_files(files, list(range(len(files))))
    try:
        return b"".join(HotTier.pread(fds[i], files[i][1], files[i][2]) for i in range(len(files)))
    finally:
        for fd in fds.values():
            os.close(fd)


def _open_all(objects: list[list[Place]]) -> list[Pieces]:
    """Every object's open pieces, (descriptor, offset, size) in order;
    Elsewhere (none left open) if a file is gone."""
    opened: list[Pieces] = []
    try:
        for files in objects:
            fds = _open_files(files, list(range(len(files))))
            opened.append([(fds[i], offset, size) for i, (_, offset, size) in enumerate(files)])
    except Elsewhere:
        close_all(opened)
        raise
    return opened


def _name(path: str, offset: int) -> str:
    """What the writer marks visited for a piece read here: its cache file's
    name, or the queue name of the log that holds it (``tiering.hot.logs``)."""
    return KEY + os.path.basename(path) if offset else os.path.basename(path)


class _Answer(NamedTuple):
    """A hot lookup answer a worker keeps: good while its key's write
    generation is still ``generation`` and, for a mounted object, until
    ``until_ms``."""

    meta: ObjectMeta
    files: list[Place]
    names: list[str]  # the files' names, for the writer's eviction marks
    slot: int
    generation: int
    until_ms: int | None


class RemoteObjects:
    """The read call of ObjectService (all that GetObject and HeadObject
    use), answered from the writer's lookups, kept while they hold, and the
    hot-tier files."""

    def __init__(self, lookups: LookupClient, generations: Generations, entries: int, window: int = 4) -> None:
        self._lookups = lookups
        self._generations = generations
        self._entries = entries
        # Bounded in bytes as the writer's record cache is, and by the same
        # setting (the ``records`` kind of tiering/memo.py, this process's own).
        self._answers: Kept[tuple[str, str], _Answer] = Kept("records", entries)
        self._reads: list[tuple[str, str, list[str]]] = []  # answered from kept answers, to report
        self._window = window

    async def read(self, read: Read) -> ReadPlan:
        # One lookup, or a kept answer: a GET counts as a read of the cache
        # and moves the writer's epoch readers, as a GET there does.
        try:
            meta, files = await self._hot(read.bucket, read.key, read=read.body)
        except NoSuchKey:
            # The writer answers a GET or HEAD of a missing key: in a
            # versioned bucket it may be a delete marker, which S3 names in
            # the answer's headers. (A batch's missing member stays here.)
            raise Elsewhere() from None
        decision = decide(meta, read)
        tally = ReadTally()
        if not (read.body and decision.sends_body):
            return plan(meta, read, decision, tally=tally)
        wanted = decision.wanted
        if meta.size <= SMALL_READ:
            data = (read_files_now((path, size, not offset, offset) for path, offset, size in files)
                    if meta.size <= NOW_READ else None)
            if data is None:
                try:
                    data = await pool.run(_read_files, files)
                except Elsewhere:  # a file is gone: the answer kept is no more
                    self._answers.pop((read.bucket, read.key))
                    raise
            return hot_plan(meta, read, decision, data)
        pieces = list(split_over([size for _, _, size in files], wanted))
        if len(pieces) > MAX_OPEN_PIECES:  # the writer streams it, opening files as it goes
            raise Elsewhere()
        return plan(meta, read, decision, self._stream(files, pieces, tally, read.blocks), tally)

    async def _hot(self, bucket: str, key: str, read: bool) -> tuple[ObjectMeta, list[Place]]:
        """The metadata and files of a hot object; Elsewhere if not all hot."""
        kept = self._kept(bucket, key)
        if kept is not None:
            if read:
                self._read_from_kept(bucket, key, kept.names)
            return kept.meta, kept.files
        # The generation is read before the question: a write committed
        # after this read moves it, one committed before is in the answer.
        slot = slot_of(bucket, key)
        generation = self._generations.at(slot)
        where = await self._lookups.locate(bucket, key, read=read)
        if where.missing == "NoSuchBucket":
            raise NoSuchBucket(BucketName=bucket)
        if where.missing == "NoSuchKey":
            raise NoSuchKey(Key=key)
        if where.record is None:  # not all hot, or due for revalidation: the writer answers
            raise Elsewhere()
        meta, files = ObjectMeta.from_bytes(where.record), list(where.files)
        self._keep((bucket, key), _Answer(meta, files, [_name(path, offset) for path, offset, _ in files],
                                          slot, generation, where.until_ms))
        return meta, files

    def _kept(self, bucket: str, key: str) -> _Answer | None:
        """The answer kept for bucket/key if it still holds (else dropped)."""
        kept = self._answers.items.get((bucket, key))
        if kept is None:
            return None
        if self._generations.at(kept.slot) == kept.generation and (kept.until_ms is None or now_ms() < kept.until_ms):
            return kept
        self._answers.pop((bucket, key))
        return None

    def _keep(self, name: tuple[str, str], answer: _Answer) -> None:
        if self._entries > 0:
            self._answers.put(name, answer)  # the oldest kept go first

    def _read_from_kept(self, bucket: str, key: str, names: list[str]) -> None:
        """Report a GET answered from a kept answer to the writer, with the
        others of this turn of the event loop in one message."""
        if not self._reads:
            asyncio.get_running_loop().call_soon(self._report_reads)
        self._reads.append((bucket, key, names))

    def _report_reads(self) -> None:
        reads, self._reads = self._reads, []
        self._lookups.report_reads(reads)

    async def head(self, bucket: str, key: str) -> ObjectMeta:
        """A batch's manifest (gateway/handlers/batch.py), when hot."""
        return (await self._hot(bucket, key, read=False))[0]

    async def read_all(self, meta: ObjectMeta) -> bytes:
        current, files = await self._hot(meta.bucket, meta.key, read=False)
        if current.etag != meta.etag or current.size > SMALL_READ:
            raise Elsewhere()
        return await pool.run(_read_files, files)

    async def batch(self, bucket: str, keys: Sequence[str], fail: bool, tally: ReadTally,
                    etags: Sequence[str] | None = None, peer: str | None = None) -> HotBatch:
        """A batch of at most MAX_BATCH_HERE small objects, all hot
        (Elsewhere otherwise, before any member): every lookup first (each
        a read: hits counted and epoch readers moved by the writer), then
        every file opened before the first member: a ``HotBatch``, whose
        bodies the handler has read in runs. One read at given ``etags``
        (another node gathering, ``peer``) is the writer's."""
        if len(keys) > MAX_BATCH_HERE or etags is not None or peer is not None:
            raise Elsewhere()
        now = self._batch_now(bucket, keys, tally)
        if now is not None:
            return now
        errors: dict[int, TierstoreError] = {}
        for i, key in enumerate(keys):
            try:
                check_key(key)
            except TierstoreError as exc:
                errors[i] = exc
        wanted = [i for i in range(len(keys)) if i not in errors]
        answers = await asyncio.gather(*(self._hot(bucket, keys[i], read=True) for i in wanted),
                                       return_exceptions=True)
        found: dict[int, tuple[ObjectMeta, list[Place]]] = {}
        for i, answer in zip(wanted, answers, strict=True):
            if isinstance(answer, NoSuchKey):
                errors[i] = answer
            elif isinstance(answer, BaseException):
                raise answer  # Elsewhere, NoSuchBucket
            elif answer[0].size > SMALL_READ:
                raise Elsewhere()
            else:
                found[i] = answer
        if fail and errors:
            raise errors[min(errors)]
        order = sorted(found)
        try:
            opened = dict(zip(order, await pool.run(_open_all, [found[i][1] for i in order]), strict=True))
        except Elsewhere:  # a file is gone: the answers kept for these keys are no more
            for i in order:
                self._answers.pop((bucket, keys[i]))
            raise
        members = [Member(key, error=errors[i]) if i in errors else Member(key, found[i][0])
                   for i, key in enumerate(keys)]
        return HotBatch(members, [opened.get(i) for i in range(len(keys))], tally)

    def _batch_now(self, bucket: str, keys: Sequence[str], tally: ReadTally) -> HotBatch | None:
        """:meth:`batch` on the event loop, when every key has a kept answer
        and every file opens (None otherwise, nothing left open): no lookup
        and no pool, as the writer's hot batch from its record cache."""
        kept = []
        for key in keys:
            answer = self._kept(bucket, key)
            if answer is None or answer.meta.size > SMALL_READ:
                return None
            kept.append(answer)
        try:
            opened = _open_all([answer.files for answer in kept])
        except Elsewhere:  # a file is gone: these answers are no more, the lookups tell
            for key in keys:
                self._answers.pop((bucket, key))
            return None
        for key, answer in zip(keys, kept, strict=True):
            self._read_from_kept(bucket, key, answer.names)
        return HotBatch([Member(key, answer.meta) for key, answer in zip(keys, kept, strict=True)],
                        list(opened), tally)

    async def _stream(
        self, files: list[Place], pieces: list[tuple[int, ByteRange]], tally: ReadTally, blocks: bool = False,
    ) -> AsyncIterator[Block]:
        # Every file is opened before the first byte goes out (the app pulls
        # the first block before the head): one evicted meanwhile passes the
        # request on (Elsewhere), one evicted later cannot cut the body short.
        fds = await pool.run(_open_files, files, [index for index, _ in pieces])
        handed: set[int] = set()

        async def open_piece(index: int) -> Opened:
            handed.add(index)
            return Opened(fds[index], files[index][1])

        try:
            async for block in stream(pieces, open_piece, window=self._window, tally=tally, blocks=blocks):
                yield block  # with ``blocks``, a Region of the file: sent with sendfile (gateway/serving/sendfile.py)
        finally:
            for index, fd in fds.items():
                if index not in handed:
                    os.close(fd)


class _Kept:
    """A request's receive that keeps the body messages it passed on, up to
    KEEP_BODY bytes, to pass them again (``replay``) to the writer. Only a
    batch reads a body before it may be passed on, and its body is at most
    2 MiB; any other request is passed on before its body is read."""

    KEEP_BODY = 2 * 1024 * 1024 + 64 * 1024

    def __init__(self, receive: Any) -> None:
        self._receive = receive
        self._kept: list[dict[str, Any]] = []
        self._size = 0

    async def receive(self) -> Any:
        message = await self._receive()
        if message["type"] == "http.request" and self._size <= self.KEEP_BODY:
            self._kept.append(message)
            self._size += len(message.get("body", b""))
        return message

    async def replay(self) -> Any:
        if self._size > self.KEEP_BODY:
            raise S3Error("ServiceUnavailable", "The request could not be passed to the gateway's writer.")
        if self._kept:
            return self._kept.pop(0)
        return await self._receive()


class _Relayed:
    """Stands for the worker's metrics: requests served here are reported
    to the writer, whose /metrics and /stats count every process."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def observe(self, *row: Any) -> None:
        self.rows.append(row)


def _directory(document: bytes, sealer: Sealer) -> Directory:
    """The snapshot of an identities document the writer pushed."""
    return Directory(State.decode(document) if document else State(), sealer)


# Refusals a worker leaves to the writer: a key it does not know yet (the
# writer pushes every change at once, but may not have yet) and AccessDenied,
# which the writer answers, logs and counts under the caller's name.
_PASSED_REFUSALS = frozenset({"InvalidAccessKeyId", "AccessDenied"})


class WorkerApp(S3App):
    """The S3 app of a read worker: GetObject and HeadObject of hot objects
    here, everything else passed to the writer."""

    PASS_ON = (Elsewhere,)

    def __init__(self, setup: WorkerSetup) -> None:
        self._relayed = _Relayed()
        # A worker is its own plane: its context, set between startup and
        # shutdown, serves from the writer's lookups.
        self.context: Context | None = None
        super().__init__(setup.config, self, self._relayed, AccessLog(setup.config.access_log))
        self._setup = setup
        self._generations: Generations | None = None
        self._lookups = LookupClient(setup.lookup_socket, self._identities_pushed)
        # Users, keys and policies as the writer last pushed them.
        self._sealer: Sealer | None = None
        self._directory: Directory = EMPTY
        self._document: bytes | None = None  # the latest pushed, not yet made a snapshot
        self._building: asyncio.Future[None] | None = None
        self._forwarder = Forwarder(setup.writer_socket)
        self._reporting: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        # The writer made the key file before it started any worker.
        self._sealer = Sealer(await pool.run(load_key, self.config.secrets_key_path))
        await self._lookups.start()
        await self._forwarder.start()
        self._generations = Generations(Path(self._setup.generations))
        CACHES.configure(self.config.cache_sizes)  # this process's caches, as the writer's
        objects = RemoteObjects(self._lookups, self._generations, tier_settings(self.config).record_cache)
        access = Access(self.config.credentials, lambda: self._directory)
        self.context = Context(self.config, objects, access)  # type: ignore[arg-type]

    def _identities_pushed(self, document: bytes) -> None:
        self._document = document
        if self._building is None or self._building.done():
            self._building = asyncio.ensure_future(self._build())

    async def _build(self) -> None:
        """Snapshots of the pushed documents, in the pool, the latest last."""
        while self._document is not None and self._sealer is not None:
            document, self._document = self._document, None
            try:
                self._directory = await pool.run(_directory, document, self._sealer)
            except ValueError as exc:  # the writer serves nothing it cannot read: never
                log.error("read worker: identities document not usable: %s", exc)

    def _authenticate(self, access: Access, req: S3Request, virtual_host: bool) -> sigv4.AuthContext:
        try:
            return super()._authenticate(access, req, virtual_host)
        except S3Error as exc:
            if exc.code in _PASSED_REFUSALS:
                raise Elsewhere() from None
            raise

    def _authorize(self, access: Access, req: S3Request, op: str) -> None:
        try:
            super()._authorize(access, req, op)
        except S3Error as exc:
            if exc.code in _PASSED_REFUSALS:
                raise Elsewhere() from None
            raise
        self._reporting = asyncio.create_task(self._report(), name="served-request reports")

    async def shutdown(self) -> None:
        self.context = None
        if self._building is not None:
            self._building.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._building
        if self._reporting is not None:
            self._reporting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reporting
        self._report_now()
        await self._lookups.close()
        await self._forwarder.close()
        if self._generations is not None:
            self._generations.close()

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY)
            self._report_now()

    def _report_now(self) -> None:
        rows, self._relayed.rows = self._relayed.rows, []
        self._lookups.report_served(rows)

    def listening(self) -> None:
        """The S3 socket listens: the writer may count this worker as up."""
        self._lookups.report_ready()

    async def writer_gone(self) -> None:
        """Returns when the writer closed the lookup socket: time to exit."""
        await self._lookups.lost.wait()

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kept = _Kept(receive)
        try:
            await super()._http(scope, kept.receive, send)
        except Elsewhere:
            try:
                # A batch read its body before finding an object not hot:
                # the writer gets that body again, then the rest.
                await self._forwarder.forward(scope, kept.replay, send)
            except ClientDisconnected:
                return
            except S3Error as exc:  # nothing was sent: the writer is gone, or the body stalled
                request_id = new_request_id()
                response, _ = self._error(exc, scope.get("path", "/"), request_id, scope["method"])
                response.headers += [("x-amz-request-id", request_id), ("server", "tierstore"),
                                     ("connection", "close")]
                await response.send(send, head_only=scope["method"] == "HEAD")

    def _pass_on(self, route: routes.Route | None, req: S3Request) -> None:
        # The writer verifies (and answers the errors of) what it is given;
        # another gateway's request too: it must neither move the epochs nor
        # be served half from here (tiering/cluster/peers.py).
        if route is None or route.op not in SERVED_HERE or PEER_HEADER in req.headers or "versionId" in req.query:
            raise Elsewhere()


def main() -> int:
    """A worker's life: its setup from stdin, then its S3 app on the shared
    port until SIGTERM, or until the writer's lookup socket closes."""
    setup: WorkerSetup = pickle.loads(sys.stdin.buffer.read())
    config, app = setup.config, WorkerApp(setup)

    async def serve() -> None:
        stop = asyncio.Event()
        sock = listener.listen(config.host, config.port, "S3", reuse_port=True)
        with contextlib.closing(sock):
            server = listener.http_server(app, config, s3=True)
            with listener.signals(stop, [server]):
                await app.startup()
                try:
                    async with listener.running(server, sock, "S3") as task:
                        app.listening()
                        await listener.first_of(stop.wait(), task, app.writer_gone())
                finally:
                    await app.shutdown()

    with contextlib.suppress(KeyboardInterrupt):
        process.run_loop(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
