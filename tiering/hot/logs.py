"""Small cached pieces in shared append-only files ("logs").

A miss of a small object used to create a cache file of its own; on an aged
filesystem a file creation costs more CPU than the rest of the miss. Small
cached pieces (at most ``ITEM_MAX`` bytes, and at most an eighth of a log)
are appended instead to the open log, ``<cache>/logs/<id>`` (the id in 8
hex digits, never reused), and found through an offset table kept in
memory. A log is the unit of eviction: once full and written it enters the
hot tier's SIEVE queue as one entry (``log:<id>``), a hit on any of its
pieces marks it visited, and evicting it unlinks the file and forgets its
pieces. A log whose pieces were all dropped goes at once. This is how
log-structured caches (CacheLib's small-object cache, Kangaroo's log)
trade per-object eviction for sequential writes; pieces larger than
``ITEM_MAX`` keep files of their own, where the creation is paid by many
bytes.

A record on disk: a head (magic, data length, data CRC, name length, and
a CRC of those and the name), the name, the data. The CRC is CRC32C
(magic ``TSL2``), computed with the CPU's own instruction
(``packer.crc``): 1.4-2.5 us for 64 KiB here, against 20 us for zlib's CRC32 (``TSL1``, the
records of the first logs, still read back and checked as they were
written). Records are written
at offsets reserved under the hot tier's lock, a batch of them (the fills'
writer hands over what a few milliseconds of misses brought) reserved one
after another: the data of the first and everything after it (the later
records' heads among it) with one ``pwritev``, then the first head with a
``pwrite``. Each piece is readable only once both returned: a record never
points at bytes that did not land. After a process crash a log is read
back head by head up to the first head that is missing or fails its CRC (a
writer killed before its batch's first head landed); what followed it is
lost to the cache, never served wrong. As for cache files, a machine crash
(a new boot id) drops every log: they are not fsynced. A log's bytes are
never rewritten, so a descriptor or a read worker's path on a log evicted
meanwhile still reads the piece it was given.

Blocking methods take no lock; the state methods expect the hot tier's
lock to be held (``HotTier`` calls them).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packer.crc import crc32c
from tiering.files import pwritev_all

LOGS = "logs"  # under the cache tree
KEY = "log:"  # a log's name in the SIEVE queue (cache names hold no colon)
LOG_MAX = 32 * 1024 * 1024  # bytes a log takes before the next one opens
LOG_MIN = 256 * 1024
ITEM_MAX = 1024 * 1024  # larger pieces keep files of their own
_HEAD = struct.Struct("<4sIIHI")  # magic, data length, data CRC, name length, head CRC
_MAGIC = b"TSL2"
# The CRC of each record format: (data, previous) -> CRC.
_CRCS: dict[bytes, Callable[..., int]] = {_MAGIC: crc32c, b"TSL1": zlib.crc32}


def log_bytes(budget: int) -> int:
    """A log's size for a hot tier of ``budget`` bytes: 1/64 of it, so one
    eviction frees a small share, within LOG_MIN..LOG_MAX."""
    return max(LOG_MIN, min(LOG_MAX, budget // 64))


def head(name: bytes, data: bytes | memoryview) -> bytes:
    """The head of ``name``'s record holding ``data``."""
    fields = _HEAD.pack(_MAGIC, len(data), crc32c(data), len(name), 0)[:-4]
    return fields + struct.pack("<I", crc32c(name, crc32c(fields))) + name


@dataclass(slots=True)
class Record:
    """One record as read back: where its data starts, and how it checks."""

    name: str
    offset: int  # of the data
    size: int
    crc: int
    end: int  # of the record
    check: Callable[..., int] = crc32c  # the CRC of its format

    def holds(self, data: bytes) -> bool:
        """Whether ``data`` (read from the record's place) is what was written."""
        return self.check(data) == self.crc


def records(fd: int, length: int) -> Iterator[Record]:
    """The records of a log file of ``length`` bytes, in order, up to the
    first whose head is missing, torn or runs past the end."""
    offset = 0
    while offset + _HEAD.size <= length:
        raw = os.pread(fd, _HEAD.size + 255, offset)
        if len(raw) < _HEAD.size:
            return
        magic, size, crc, name_len, head_crc = _HEAD.unpack_from(raw)
        name = raw[_HEAD.size:_HEAD.size + name_len]
        fields = raw[:_HEAD.size - 4]
        check = _CRCS.get(magic)
        if check is None or len(name) != name_len or check(name, check(fields)) != head_crc:
            return
        start = offset + _HEAD.size + name_len
        if start + size > length:
            return
        try:
            text = name.decode()
        except UnicodeDecodeError:
            return
        yield Record(text, start, size, crc, start + size, check)
        offset = start + size


@dataclass(slots=True)
class Log:
    number: int
    path: str
    end: int = 0  # bytes reserved so far
    used: int = 0  # bytes of records written (counted in the tier's ``cached``)
    members: set[str] = field(default_factory=set)
    writing: int = 0  # appends reserved, not yet published or abandoned
    sealed: bool = False  # no more appends
    queued: bool = False  # in the SIEVE queue (sealed, nothing being written)
    fd: int | None = None  # for appends, while open or still being written
    key: str = ""  # its name in the SIEVE queue

    def __post_init__(self) -> None:
        self.key = KEY + f"{self.number:08x}"


@dataclass(slots=True)
class Append:
    """An append reserved in ``log``: the record's head, and where it goes."""

    log: Log
    fd: int
    offset: int
    head: bytes


class Logs:
    """The logs of one hot tier, and where each small cached piece is."""

    def __init__(self, root: Path, size: int) -> None:
        self.root = root
        self._root = str(root)
        self.size = size
        self.item_max = min(ITEM_MAX, size // 8)
        root.mkdir(parents=True, exist_ok=True)
        self.slots: dict[str, tuple[Log, int, int]] = {}  # name -> (log, data offset, size)
        self._logs: dict[int, Log] = {}
        self._open: Log | None = None
        self._next = 1

    def fits(self, size: int) -> bool:
        return size <= self.item_max

    def where(self, name: str) -> tuple[str, int] | None:
        """The log path and data offset of cached piece ``name``, or None."""
        slot = self.slots.get(name)
        return None if slot is None else (slot[0].path, slot[1])

    def unit(self, name: str) -> str:
        """What eviction takes to free piece ``name``: its log's queue name
        (``name`` itself when it is not in a log)."""
        slot = self.slots.get(name)
        return name if slot is None else slot[0].key

    def log_of(self, key: str) -> Log | None:
        """The log queued as ``key`` (None: not a log's queue name)."""
        return self._logs.get(int(key[len(KEY):], 16)) if key.startswith(KEY) else None

    def path_of(self, key: str) -> str:
        """The file of the log queued as ``key``."""
        return f"{self._root}/{key[len(KEY):]}"

    # -- appends (state under the tier's lock; ``write`` without it) -------

    def reserve(self, name: str, data: bytes | memoryview) -> tuple[Append, list[Log]]:
        """Room for ``name``'s record in the open log (a new one when it is
        full), and the logs that are now sealed and idle (to queue)."""
        encoded = name.encode()
        record_head = head(encoded, data)
        length = len(record_head) + len(data)
        sealed: list[Log] = []
        log = self._open
        if log is not None and log.end + length > self.size and log.end:
            sealed += self._seal(log)
            log = None
        if log is None:
            log = self._new()
        offset = log.end
        log.end += length
        log.writing += 1
        assert log.fd is not None
        return Append(log, log.fd, offset, record_head), sealed

    @staticmethod
    def write_many(appends: Sequence[Append], datas: Sequence[bytes | memoryview]) -> None:
        """Blocking: records reserved one after another (``reserve``, under
        one hold of the lock), each run of them that follows on in one log
        with one ``pwritev`` and one ``pwrite``: everything from the run's
        first data on (the later records' heads among it), then the first
        head. Until that head lands the log reads back as ending before the
        run (``records``), so a writer killed in between leaves no head
        before torn data."""
        at = 0
        while at < len(appends):
            first = appends[at]
            start = first.offset + len(first.head)
            parts: list[bytes | memoryview] = [datas[at]]
            end = start + len(datas[at])
            at += 1
            while at < len(appends) and appends[at].log is first.log and appends[at].offset == end:
                parts += (appends[at].head, datas[at])
                end += len(appends[at].head) + len(datas[at])
                at += 1
            pwritev_all(first.fd, parts, start)
            os.pwrite(first.fd, first.head, first.offset)

    def publish(self, name: str, append: Append, size: int) -> tuple[int, list[Log]]:
        """The append of ``name`` landed: it is readable now. Returns (bytes
        the tier now holds more, logs sealed and idle to queue)."""
        log = append.log
        log.writing -= 1
        gained = 0
        if log.number in self._logs:  # not evicted while it was written
            self._drop_slot(name)
            self.slots[name] = (log, append.offset + len(append.head), size)
            log.members.add(name)
            gained = len(append.head) + size
            log.used += gained
        return gained, self._idle(log)

    def abandon(self, append: Append) -> list[Log]:
        """The append failed (a full disk): its log takes no more appends."""
        log = append.log
        log.writing -= 1
        return self._seal(log) if not log.sealed else self._idle(log)

    def open_pieces(self) -> bool:
        """True if the open log (not queued yet) holds pieces."""
        return self._open is not None and bool(self._open.members)

    def seal_open(self) -> list[Log]:
        """Seal the open log for an eviction that found nothing else (a
        small tier): itself if nothing is being written to it, to queue."""
        return [] if self._open is None else self._seal(self._open)

    # -- removal (under the tier's lock) -----------------------------------

    def drop(self, name: str) -> Log | None:
        """Forget piece ``name``; the log it was in if that is now empty,
        idle and queued or sealed (the caller removes it)."""
        log = self._drop_slot(name)
        if log is None or log.members or log.writing:
            return None
        if log is self._open:
            self._open = None
            log.sealed = True
        return log

    def rename(self, old: str, new: str) -> bool:
        """Compaction moved an extent: its piece answers to ``new`` (the head
        on disk keeps ``old``, which no record names any more)."""
        slot = self.slots.pop(old, None)
        if slot is None:
            return False
        self._drop_slot(new)
        self.slots[new] = slot
        slot[0].members.discard(old)
        slot[0].members.add(new)
        return True

    def remove(self, log: Log) -> list[str]:
        """Forget ``log`` and every piece in it (evicted); their names.
        Its descriptor is closed if no append still uses it."""
        self._logs.pop(log.number, None)
        if self._open is log:
            self._open = None
        names = list(log.members)
        for name in names:
            self.slots.pop(name, None)
        log.members.clear()
        log.sealed = True
        if not log.writing:
            self._close(log)
        return names

    def any_member(self, key: str, wanted: Callable[[str], bool]) -> bool:
        log = self.log_of(key)
        return log is not None and any(wanted(name) for name in log.members)

    # -- start and stop ----------------------------------------------------

    def load(self, drop: bool) -> list[tuple[int, str, int]]:
        """Read the logs back (``drop``: delete them all); the logs found as
        (mtime, queue name, bytes), every one sealed: appends go to a new log."""
        found = []
        for entry in sorted(os.scandir(self._root), key=lambda e: e.name):
            try:
                number = int(entry.name, 16)
            except ValueError:
                number = 0
            if drop or not number:
                os.unlink(entry.path)
                continue
            st = entry.stat()
            log = Log(number, entry.path, end=st.st_size, used=st.st_size, sealed=True, queued=True)
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                for record in records(fd, st.st_size):
                    self._drop_slot(record.name)
                    self.slots[record.name] = (log, record.offset, record.size)
                    log.members.add(record.name)
            finally:
                os.close(fd)
            self._logs[number] = log
            self._next = max(self._next, number + 1)
            found.append((st.st_mtime_ns, log.key, st.st_size))
        return found

    def close(self) -> None:
        for log in self._logs.values():
            self._close(log)
        self._open = None

    def verify(self) -> list[str]:
        """Blocking, for ``tierstore check``: every record's data against its
        CRC; what is wrong."""
        problems = []
        for entry in sorted(os.scandir(self._root), key=lambda e: e.name):
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                for record in records(fd, os.fstat(fd).st_size):
                    if not record.holds(os.pread(fd, record.size, record.offset)):
                        problems.append(f"cache log {entry.name}: {record.name} fails its CRC")
            finally:
                os.close(fd)
        return problems

    # -- internals ---------------------------------------------------------

    def _new(self) -> Log:
        number = self._next
        self._next += 1
        path = f"{self._root}/{number:08x}"
        log = Log(number, path, fd=os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        self._logs[number] = log
        self._open = log
        return log

    def _seal(self, log: Log) -> list[Log]:
        log.sealed = True
        if self._open is log:
            self._open = None
        return self._idle(log)

    def _idle(self, log: Log) -> list[Log]:
        """``log`` if it just became sealed with nothing being written: its
        descriptor closes, and it joins the queue (or goes, if empty)."""
        if not log.sealed or log.writing or log.queued or log.number not in self._logs:
            if log.number not in self._logs and not log.writing:
                self._close(log)
            return []
        self._close(log)
        log.queued = True
        return [log]

    def _close(self, log: Log) -> None:
        if log.fd is not None:
            os.close(log.fd)
            log.fd = None

    def _drop_slot(self, name: str) -> Log | None:
        slot = self.slots.pop(name, None)
        if slot is None:
            return None
        slot[0].members.discard(name)
        return slot[0]
