"""Room on disk for the index: a reserve, the check before each write, and
opening the database whatever the disk holds.

RocksDB needs room to open (it replays its write-ahead log into a new
table file and starts a new log) and to write (each batch is appended to
the log). On a full disk both fail, and a failed append is worse than a
refused write: RocksDB's log writer remembers the error and fails every
later write, and the close, until the database is opened again
("Writer has previous error"). So:

- A *reserve*: a preallocated file in the index's directory (RocksDB
  ignores names it did not write), held while the disk has room and
  released, at once, when the index needs room and the disk has none
  left: before an open that needs more than is free, and before a write
  that finds less than ``MARGIN`` free and little room ahead of the log
  (below). The space keeper
  (``tiering/maintenance/space.py``) makes it again once the filesystem
  has room above the free-space floor.
- Room ahead in the log: blocks allocated past the end of the live
  write-ahead log (fallocate's KEEP_SIZE, what RocksDB does itself where
  it is built with fallocate), so its appends need no new blocks for a
  while, whoever takes the rest of the disk. The keeper tops it up.
- A write that finds less than ``MINIMUM`` free, and less than that ahead
  in the log, is refused before it reaches the log
  (:meth:`IndexRoom.refusal`). Short of that the index still writes: its
  batches are small, and the writes it takes then (a flush's commit above
  all) are how the gateway frees room.
- An open that fails for lack of room falls back to a read-only open,
  which needs none (``open_database``): reads go on, writes are refused
  until the keeper finds room to open it for writing again.
- A write the disk fails all the same (another process took the room
  between the check and the append) is refused too, after a reopen
  (``Database``, mixed into ``Index``): a read-only handle first, so
  readers go on, then one for writes once the reserve's room is free.

The index knows records and this one file, never the hot tier: whether
evicting or flushing could make room (the answer's 503 or 507) is asked
of a callable the node sets (:attr:`IndexRoom.can_free`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rocksdict import AccessType, Options, Rdict, WriteBatch, WriteOptions

from tiering.errors import InsufficientStorage, ServiceUnavailable, SlowDown, TierstoreError
from tiering.files import allocate_ahead, disk_space, no_space, sync_dir
from tiering.index.keys import SEQ_KEY

log = logging.getLogger("tierstore.index")

MiB = 1024 * 1024
RESERVE_NAME = "tierstore-reserve"
# Below this many free bytes the reserve is released for the index: room
# for its log and RocksDB's own files (its info log, a manifest) for a while.
MARGIN = 4 * MiB
# Below this many, a write is refused: a batch is a few KiB (a DeleteObjects
# of 1,000 keys about 200 KiB).
MINIMUM = 512 * 1024
# Blocks kept allocated past the end of the live log, topped up at half:
# at a few hundred bytes to a few KiB a batch, a thousand writes or more.
LOG_ROOM = 2 * MiB
# RocksDB's write buffer (memory table), at most two held at once.
MEMTABLE_BYTES = 8 * MiB
# How long a reopen waits for the old handle to let its lock go: an
# iterator a reader still runs keeps the old database (and its lock) alive
# until it ends, which is microseconds for a point read and a page.
_LOCK_WAIT = 2.0
# How old a free-space reading may be for a write behind a read (records
# learnt by reads, not synced) to skip its own: one ``statvfs`` per batch
# of such records made the fills' writer thread drop the GIL and wait to
# take it back from the event loop (tiering/hot/space.py says the same of
# cache fills), and their batches are a few KiB against MARGIN's MiBs.
RECENT = 0.02


def disk_error(exc: BaseException) -> bool:
    """Whether a rocksdict exception is the disk failing a file operation
    (RocksDB's ``IO error: ...``), as opposed to a bug or a closed handle."""
    return type(exc) is Exception and str(exc).startswith("IO error")


def _for_space(exc: BaseException) -> bool:
    text = str(exc)
    # "Writer has previous error": the log writer failed before (for lack
    # of room, since every other failure is a disk to replace).
    return "No space left" in text or "quota" in text.lower() or "previous error" in text


class IndexRoom:
    """The index's reserve file and its room checks, for the index in
    ``directory``. ``reserve`` bytes (0: no reserve, as for ``tierstore
    check`` and ``recover``)."""

    def __init__(self, directory: Path, reserve: int = 0, margin: int = MARGIN) -> None:
        self.directory = directory
        self.path = directory / RESERVE_NAME
        self.size = reserve
        self.margin = margin
        self.refusals = 0  # writes refused for lack of room
        self.releases = 0  # times the reserve was given up for the index
        # Whether evicting cache or flushing staged data could give the disk
        # room (the node sets it to the hot tier's answer).
        self.can_free: Callable[[], bool] = lambda: False
        self.held = self.path.exists()
        self._log: Path | None = None  # the live write-ahead log, as last found
        self._log_room = True  # False where the filesystem cannot allocate ahead
        self._reading = (-RECENT, 0)  # (monotonic time, free bytes) of the last statvfs

    def free(self) -> int:
        free = disk_space(self.directory)[0]
        self._reading = (time.monotonic(), free)
        return free

    def log_ahead(self) -> int:
        """Bytes the live log can still grow by into blocks it has."""
        for _ in range(2):
            if self._log is not None:
                try:
                    st = os.stat(self._log)
                    return max(0, st.st_blocks * 512 - st.st_size)
                except FileNotFoundError:
                    pass
            self._log = self._live_log()
            if self._log is None:
                return 0
        return 0

    def _live_log(self) -> Path | None:
        """The newest ``<number>.log`` in the index's directory."""
        logs = [e.name for e in os.scandir(self.directory) if e.name.endswith(".log") and e.name[:-4].isdigit()]
        return self.directory / max(logs, key=lambda name: int(name[:-4])) if logs else None

    def keep_log_room(self) -> None:
        """Allocate ``LOG_ROOM`` past the end of the live log when less than
        half of it is left (blocking: a scan, an fstat, maybe a fallocate)."""
        if not self._log_room:
            return
        self._log = self._live_log()
        if self._log is None:
            return
        try:
            fd = os.open(self._log, os.O_WRONLY)
            try:
                st = os.fstat(fd)
                if st.st_blocks * 512 - st.st_size < LOG_ROOM // 2:
                    allocate_ahead(fd, st.st_size, LOG_ROOM)
            finally:
                os.close(fd)
        except FileNotFoundError:
            pass  # rotated meanwhile: the next pass finds the new one
        except OSError as exc:
            if not no_space(exc):
                self._log_room = False  # no fallocate here: the reserve alone
                log.info("cannot allocate ahead of the index's log here: %s", exc)

    def release(self) -> bool:
        """Give the reserve's room to the index; True if there was one."""
        if not self.held:
            return False
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.held = False
        self.releases += 1
        log.warning("released the index's reserve (%d MiB): the disk is full", self.size // MiB)
        return True

    def restore(self, floor: int) -> bool:
        """Make the reserve again if the filesystem has room for it above
        ``floor``; True if it did. Blocking (a preallocation and fsyncs)."""
        if self.held or not self.size or self.free() < floor + self.size:
            return False
        tmp = self.path.with_name(RESERVE_NAME + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                # Blocks, not a sparse size: on ext4, xfs and tmpfs the
                # filesystem counts them as used at once.
                os.posix_fallocate(fd, 0, self.size)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            sync_dir(self.directory)
        except OSError as exc:  # the room went to someone else meanwhile
            tmp.unlink(missing_ok=True)
            log.info("could not make the index's reserve again: %s", exc)
            return False
        self.held = True
        return True

    def before_open(self) -> None:
        """Release the reserve when opening may need more than is free: a
        replay of the write-ahead log writes about its size into a table."""
        logs = sum(entry.stat().st_size for entry in os.scandir(self.directory) if entry.name.endswith(".log")) \
            if self.directory.exists() else 0
        if self.free() < logs + self.margin:
            self.release()

    def before_write(self, recent: bool = False) -> None:
        """Room for one write, or the refusal: the log's room ahead, and
        the reserve, go first. ``recent`` (a write behind reads, not
        synced): a reading up to ``RECENT`` old that found twice the margin
        free answers it."""
        if recent:
            at, free = self._reading
            if free >= 2 * self.margin and time.monotonic() - at < RECENT:
                return
        if self.free() >= self.margin or self.log_ahead() >= MINIMUM:
            return
        self.release()
        if self.free() < MINIMUM:
            raise self.refusal()

    def refusal(self, failure: BaseException | None = None) -> TierstoreError:
        """The error a write refused for lack of room gets (counted): 503
        SlowDown while the hot tier can free room, else 507. A disk error
        that is not about room is a 503 ServiceUnavailable."""
        if failure is not None and not _for_space(failure):
            # The details (file names) are in the log, not in the answer.
            return ServiceUnavailable("The gateway's index could not write to its disk")
        self.refusals += 1
        if self.can_free():
            return SlowDown("The gateway's disk is full; it is making room, retry shortly", cause="index")
        return InsufficientStorage("The gateway's disk is full of data it cannot free: its index has no room",
                                   cause="index")


class Database:
    """The database handle of ``Index``: opened whatever room the disk has,
    written through the room's checks, opened again after a write the disk
    failed, closed without failing for a log writer that did."""

    room: IndexRoom
    writable: bool  # False while the handle is a read-only one (no room to open it for writes)
    _db: Rdict

    def _open(self, path: Path, room: IndexRoom) -> None:
        self._path = path
        self._options = options = Options(raw_mode=True)
        options.create_if_missing(True)
        # Each open starts a new info log, and a full disk can mean reopens.
        options.set_keep_log_file_num(10)
        # The memory table: RocksDB's default of 64 MiB (two of them while
        # one is written out) is anonymous memory that grows with every
        # write until it is full; under the hostile soak it took 1.5 MiB a
        # minute, most of the process's growth after its caches stopped
        # (docs/reliability.md). With MEMTABLE_BYTES, RocksDB's background
        # thread writes a table out every 8 MiB of records instead.
        options.set_write_buffer_size(MEMTABLE_BYTES)
        self.room = room
        room.before_open()
        self._db, self.writable = open_database(path, options)
        self._read_only = not self.writable  # the handle is a read-only one
        if self.writable:
            room.keep_log_room()
        self._sync = WriteOptions()
        self._sync.sync = True
        # Held around every write to the database and every reopen, so a
        # reopen never races a write (most writers hold the index's lock too).
        self._writing = threading.Lock()

    def close(self) -> None:
        with self._writing:
            try:
                self._db.close()
            except Exception as exc:
                if not disk_error(exc):
                    raise
                # No room to write the memory table out, or a log writer that
                # failed: nothing acknowledged is lost, every write was synced
                # to the log before it was acknowledged, and the next start
                # replays the log (the reserve gives it room).
                log.warning("the index closed without writing out its memory table (%s); "
                            "its log holds every write", exc)

    def _store(self, raw: WriteBatch, sync: bool = True, seq: int = 0, behind: bool = False) -> None:
        """Write ``raw`` to the database, or raise the refusal of a disk
        without room (``IndexRoom.refusal``). ``seq``: the sequence number
        the batch stores, if any, by which a batch the disk failed is found
        in the database after all. ``behind``: a few records written behind
        the reads that learnt them (its room checked by a recent reading)."""
        with self._writing:
            self.room.before_write(recent=behind)  # the refusal when even the reserve leaves no room
            if not self.writable and not self._reopen():
                raise self.room.refusal()
            try:
                # No local name for the handle: a reopen must be able to
                # drop the last reference to a failed one.
                if sync:
                    self._db.write(raw, self._sync)
                else:
                    self._db.write(raw)
                return
            except Exception as exc:
                if not disk_error(exc):
                    raise
                failure = exc
            log.warning("the index could not write (%s): opening it again", failure)
            self.room.release()
            self._reopen()
            if seq and self._db.get(SEQ_KEY) == seq.to_bytes(8, "big"):
                return  # appended whole, only its sync failed: it is in the database
            raise self.room.refusal(failure)

    def reopen(self) -> bool:
        """Open the database for writing again if it is read-only now (the
        disk had no room); True when it takes writes."""
        with self._writing:
            if self.writable:
                return True
            if self.room.free() < self.room.margin and not self.room.release():
                return False
            return self._reopen()

    def _reopen(self) -> bool:
        """Open the database again (``_writing`` held): a read-only handle
        first, which needs no room, so readers go on from it; then, once
        every reader of the old handle let its lock go, for writing if the
        disk has room. True when it takes writes."""
        self.writable = False
        if not self._read_only:
            try:
                self._db = Rdict(str(self._path), self._options, access_type=AccessType.read_only())
            except Exception as exc:
                if not disk_error(exc):
                    raise
                log.warning("could not open the index read-only: %s", exc)
                return False  # the old handle stays: it reads, and holds the lock
            self._read_only = True
        try:
            self._db, self.writable = open_database(self._path, self._options, _LOCK_WAIT)
        except Exception as exc:
            if not disk_error(exc):
                raise
            log.warning("the index stays read-only for now: %s", exc)
        self._read_only = not self.writable
        if self.writable:
            self.room.keep_log_room()
            log.info("the index takes writes again")
        return self.writable


def open_database(path: Path, options: Options, wait: float = 0.0) -> tuple[Rdict, bool]:
    """Open the database at ``path`` for writing, or, when the disk has no
    room for that, read-only (which writes nothing); the handle and whether
    it takes writes. ``wait``: seconds to keep trying while another handle
    of this process still holds the lock (a reopen)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return Rdict(str(path), options), True
        except Exception as exc:  # noqa: BLE001  rocksdict raises plain Exception
            if not disk_error(exc):
                raise
            if "lock" in str(exc).lower() and time.monotonic() < deadline:
                time.sleep(0.01)
                continue
            if not _for_space(exc):  # held by another process, or a disk to replace
                raise
            log.warning("the index opens read-only until the disk has room: %s", exc)
            return Rdict(str(path), options, access_type=AccessType.read_only()), False
