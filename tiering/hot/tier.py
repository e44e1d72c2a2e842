"""The hot tier: object bytes in files on local NVMe, under a byte budget.

Two kinds of files, in two trees:

- ``<root>/<xx>/<file id>`` (``xx``: the id's last two hex digits, random):
  staged pieces, the only copy of acknowledged data until the flusher has
  put them in the capacity tier. Written, fsynced
  (with their directory) and only then referenced from the index; a crash
  before the index commit leaves an unreferenced file that ``sweep`` removes.
  Never evicted.
- ``<root>/cache/<xx>/<segment>-<offset>-<stored>``: clean copies of
  capacity-tier extents (raw bytes), named by the extent (``Extent.cache_name``:
  offset and stored length in hex) so no index record is needed; ``xx`` is
  the low byte of the name's crc32, in hex.
  Evictable when the tier passes its high watermark or the filesystem's
  free space falls below the floor (``tiering.hot.space``), in SIEVE order
  (``tiering.hot.sieve``: files read only once go before files read again),
  or by an ``EvictionAdvisor``'s hints when one is set. A flushed staged
  file is renamed into this tree.

Files are named by opaque ids, never by object keys, so no key can reach
outside the data directory. Every method blocks; the object service calls
them through the pool. Counters are guarded by one lock.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from tiering.hot.eviction import CacheEviction
from tiering.hot.filling import CacheFilling
from tiering.hot.logs import LOGS, Logs, log_bytes
from tiering.hot.open_files import Opened, OpenFiles, capacity, read_files_now
from tiering.hot.packed import PackedPieces
from tiering.hot.restart import FANOUT, Restart
from tiering.hot.sieve import EvictionAdvisor, Sieve
from tiering.hot.space import Floor
from tiering.hot.staged import StagingWriter
from tiering.meta import Chunk
from tiering.model.digests import Digests


class HotTier(CacheFilling, CacheEviction, Restart, PackedPieces):
    """Staged and cached bytes under ``root`` within a byte budget.

    Eviction passes (``evict``) are ``CacheEviction``'s, in
    ``tiering.hot.eviction``; this class decides when one runs. Start and
    stop (the clean-shutdown marker, the sweep) are ``Restart``'s, in
    ``tiering.hot.restart``. Fills (``fill``, ``fill_many``) are
    ``CacheFilling``'s, in ``tiering.hot.filling``. With ``logs``, small
    cached pieces share append-only files (``PackedPieces``,
    ``tiering.hot.logs``)."""

    def __init__(self, root: Path, budget: int, high: float = 0.9, low: float = 0.8, floor: int = 0,
                 logs: bool = False) -> None:
        self.root = root
        self.cache_root = root / "cache"
        self._root_str, self._cache_root_str = str(root), str(self.cache_root)
        # Each cache subdirectory's path with its slash: a cache file's path
        # is then one concatenation (os.path.join and a format took 1.2 us).
        self._cache_dirs = [f"{self._cache_root_str}/{i:02x}/" for i in range(FANOUT)]
        # Descriptors kept for hot reads on the event loop (bound by the node at start).
        self.open_files = OpenFiles(capacity())
        self.budget = budget
        self.high = int(budget * high)
        self.low = int(budget * low)
        self.staged = 0  # bytes in staged files
        self.reserved = 0  # bytes promised to writes in progress
        self.cached = 0  # bytes in cache files
        self.evicted = 0  # bytes evicted since start
        self._sieve = Sieve()  # evictable cache files: name -> size, in SIEVE order
        # Hints about future reads, set by another component at any time.
        self.advisor: EvictionAdvisor | None = None
        # Pinned cache files are never evicted; they count in ``cached`` too.
        self._pinned: dict[str, int] = {}
        self.pinned = 0
        self._filling: set[str] = set()  # cache files being written
        self._pin_when_filled: set[str] = set()
        self._lock = threading.Lock()
        for i in range(FANOUT):
            (root / f"{i:02x}").mkdir(parents=True, exist_ok=True)
            (self.cache_root / f"{i:02x}").mkdir(parents=True, exist_ok=True)
        self.logs = Logs(self.cache_root / LOGS, log_bytes(budget)) if logs else None
        self._slots = self.logs.slots if self.logs is not None else {}  # log-held piece -> (log, offset, size)
        # The free space the tier leaves on its filesystem (0: none); files
        # unlinked but still open come back soon, and count as free.
        self.disk = Floor(root, floor, self.open_files.closing)

    @property
    def used(self) -> int:
        return self.staged + self.cached

    # -- staged files ------------------------------------------------------

    def path_of(self, file_id: str) -> Path:
        return Path(self._staged_file(file_id))

    def _staged_file(self, file_id: str) -> str:
        # The last two hex digits are random, so files spread evenly.
        return f"{self._root_str}/{file_id[-2:]}/{file_id}"

    @property
    def fixed(self) -> int:
        """Bytes eviction cannot free: staged, reserved and pinned."""
        return self.staged + self.reserved + self.pinned

    def staging_room(self) -> int:
        """Bytes a new write may still stage (unpinned cache can always be
        evicted)."""
        return self.budget - self.fixed

    def reserve(self, size: int) -> bool:
        """Promise ``size`` bytes to a write; False when staged and pinned
        data and other writes leave no room, in the budget or above the
        free-space floor (``shortage`` says which). Accounting and one
        statvfs (cheap enough for the event loop); call ``evict`` in the
        pool when ``over_high`` says so."""
        with self._lock:
            if self.fixed + size > self.budget or self.disk.short(self.reserved + size):
                return False
            self.reserved += size
            return True

    def shortage(self, size: int) -> str | None:
        """What a write of ``size`` bytes lacks now: room in the budget
        (``"budget"``), free space above the floor (``"floor"``), or None."""
        if self.fixed + size > self.budget:
            return "budget"
        return "floor" if self.disk.short(self.reserved + size) else None

    @property
    def over_high(self) -> bool:
        """Time to evict: past the high watermark, or free space below the floor."""
        return self.staged + self.reserved + self.cached > self.high or self.disk.low

    def release(self, size: int) -> None:
        if size:
            with self._lock:
                self.reserved -= size

    def grow_staged(self, size: int, reserved: int) -> None:
        """Account ``size`` newly written staged bytes; beyond what the write
        reserved, they must still fit (a body longer than announced)."""
        from_reserve = min(size, reserved)
        with self._lock:
            extra = size - from_reserve
            if extra and self.fixed + extra > self.budget:
                raise self.disk.refuse("budget", True)
            if extra and self.disk.short(self.reserved + extra):
                raise self.disk.refuse("floor", self.can_free())
            self.reserved -= from_reserve
            self.staged += size
        if self.over_high:
            self._evict_to(self._target())

    def shrink_staged(self, size: int) -> None:
        """A write counted by ``grow_staged`` failed: ``size`` bytes less."""
        with self._lock:
            self.staged -= size

    def writer(self, part_size: int, digests: Digests, reserved: int = 0) -> StagingWriter:
        return StagingWriter(self, part_size, digests, reserved)

    def read(self, file_id: str, offset: int, length: int) -> bytes:
        fd = self.open(file_id)
        try:
            return _pread_all(fd, length, offset)
        finally:
            os.close(fd)

    def open(self, file_id: str) -> int:
        """A read-only descriptor; the caller closes it."""
        return os.open(self.path_of(file_id), os.O_RDONLY)

    @staticmethod
    def pread(fd: int, offset: int, length: int) -> bytes:
        return _pread_all(fd, length, offset)

    @staticmethod
    def pread_into(fd: int, view: memoryview, offset: int = 0) -> None:
        """Fill ``view`` from ``offset`` of file ``fd`` (OSError if the file is shorter)."""
        got = os.preadv(fd, (view,), offset) if len(view) else 0
        while got < len(view):
            more = os.preadv(fd, (view[got:],), offset + got)
            if not more:
                raise OSError(f"hot-tier file shorter than its index record ({got} < {len(view)})")
            got += more

    def remove(self, chunks: Iterable[Chunk]) -> None:
        """Delete staged files (never cache files: those belong to extents)."""
        for chunk in chunks:
            if chunk.file_id is None:
                continue
            path = self._staged_file(chunk.file_id)
            try:
                size = os.stat(path).st_size
                os.unlink(path)
            except FileNotFoundError:  # removed already: its bytes were counted then
                self.open_files.forget(path)
                continue
            self.open_files.forget(path, size)
            with self._lock:
                self.staged -= size

    def adopt(self, file_id: str, cache_name: str, pin: bool = False) -> None:
        """A staged file was flushed: it becomes the clean cached copy."""
        source = self._staged_file(file_id)
        try:
            size = os.stat(source).st_size
            os.replace(source, self.cache_path(cache_name))
        except FileNotFoundError:
            return  # deleted meanwhile; nothing to adopt
        finally:
            self.open_files.forget(source)
        with self._lock:
            self.staged -= size
            self._insert(cache_name, size, pin)

    def _insert(self, name: str, size: int, pin: bool) -> None:
        """Account a new cache file (lock held)."""
        self._forget(name)
        self.cached += size
        if pin:
            self._pinned[name] = size
            self.pinned += size
        else:
            self._sieve.insert(name, size)

    def _forget(self, name: str) -> int | None:
        """Stop accounting a cache file (lock held); its size, if known."""
        size = self._sieve.remove(name)
        if size is None:
            size = self._pinned.pop(name, None)
            if size is None:
                return None
            self.pinned -= size
        self.cached -= size
        return size

    # -- cache files -------------------------------------------------------

    def cache_path(self, name: str) -> Path:
        return Path(self._cache_file(name))

    def _cache_file(self, name: str) -> str:
        return self._cache_dirs[zlib.crc32(name.encode()) & 0xFF] + name

    def file_of(self, file_id: str | None, cache_name: str | None) -> str:
        """The path of staged file ``file_id``, else of cached extent
        ``cache_name``, as a string: for callers that open many (a batch),
        without a ``Path`` each."""
        return self._staged_file(file_id) if file_id is not None else self._cache_file(cache_name)  # type: ignore[arg-type]

    def where(self, file_id: str | None, name: str | None) -> tuple[str, int]:
        """Where a piece's bytes start: (path, offset) of staged file
        ``file_id``, else of cached piece ``name`` (in a log, or a file of
        its own at offset 0). A log-held piece answers for the log it is in
        now; its bytes there never change."""
        if file_id is None and (held := self.in_log(name)) is not None:  # type: ignore[arg-type]
            return held
        return self.file_of(file_id, name), 0

    def in_log(self, name: str) -> tuple[str, int] | None:
        """(log path, offset) of a log-held piece, else None."""
        slot = self._slots.get(name)
        return None if slot is None else (slot[0].path, slot[1])

    def open_cached(self, name: str, size: int) -> Opened | None:
        """A descriptor on the cached copy of a piece and the offset of its
        bytes, or None on a miss. A file of its own of the wrong size (torn
        by a crash) is dropped."""
        path, offset = self.where(None, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        if not offset and os.fstat(fd).st_size != size:
            os.close(fd)
            self.drop_cached([name])
            return None
        self.touch_cached(name)
        return Opened(fd, offset)

    def is_cached(self, name: str) -> bool:
        return name in self._sieve or name in self._pinned or name in self._slots

    def touch_cached(self, name: str) -> bool:
        """Record a hit on a cached piece (a bit set, no reordering; pinned
        pieces are not queued; a log-held one marks its log); False when it
        is not cached."""
        with self._lock:
            if self._sieve.touch(name) or name in self._pinned:
                return True
            slot = self._slots.get(name)
            if slot is None:
                return False
            if slot[0].queued:
                self._sieve.touch(slot[0].key)
            return True

    def read_cached(self, name: str, size: int) -> bytes | None:
        opened = self.open_cached(name, size)
        if opened is None:
            return None
        try:
            return _pread_all(opened[0], size, opened[1])
        finally:
            os.close(opened[0])

    def read_now(self, pieces: Sequence[tuple[str | None, str | None, int]]) -> bytes | bytearray | None:
        """The bytes of ``pieces`` in order, each (file id, None, size) for a
        staged file or (None, cache name, size) for a cached extent, if the
        page cache holds them all: read with ``RWF_NOWAIT``, which fails
        rather than wait for the disk, so this may run on the event loop (a
        read from memory, on a descriptor kept open: :mod:`tiering.hot.open_files`).
        None when any byte would need the disk, or a file is gone or of
        another size: the caller then takes the pool path, which waits for
        the disk and drops torn files."""
        read = self.open_files.read
        if len(pieces) == 1:  # most objects
            file_id, name, size = pieces[0]
            if name is not None and not self.is_cached(name):
                return None  # not here (a piece another node keeps): no open() that fails
            # A staged file may hold more than the piece asked; a cached
            # piece's own file is exactly its size, a log holds more.
            path, offset = self.where(file_id, name)
            data = read(path, size, name is not None and not offset, offset)
            if data is None or name is not None and not self.touch_cached(name):
                return None  # or dropped by an eviction meanwhile: not counted as a hit here
            return data
        if not all(self.is_cached(name) for _, name, _ in pieces if name is not None):
            return None
        places = [(self.where(file_id, name), size, name is not None) for file_id, name, size in pieces]
        data = read_files_now([(path, size, cached and not offset, offset)
                               for (path, offset), size, cached in places], read)
        if data is None or not all(self.touch_cached(name) for _, name, _ in pieces if name is not None):
            return None
        return data

    def pin(self, names: Iterable[str]) -> int:
        """Make cached pieces unevictable; bytes newly pinned (names not
        cached are skipped: they get pinned when filled). A log-held piece
        is copied to a file of its own first: a log goes whole."""
        names = list(names)
        copied = sum(self._copy_out(name) for name in names if name in self._slots)
        with self._lock:
            return copied + sum(self._pin(name) for name in names)

    def _pin(self, name: str) -> int:
        size = self._sieve.remove(name)
        if size is None:
            return 0
        self._pinned[name] = size
        self.pinned += size
        return size

    def unpin(self, names: Iterable[str]) -> int:
        """Make pinned files evictable again (queued as new); bytes."""
        freed = 0
        with self._lock:
            for name in names:
                size = self._pinned.pop(name, None)
                if size is not None:
                    self.pinned -= size
                    self._sieve.insert(name, size)
                    freed += size
        return freed

    def drop_cached(self, names: Iterable[str], keep_pinned: bool = False) -> tuple[int, int]:
        """Delete cache files; with ``keep_pinned`` pinned ones stay.
        Returns (bytes dropped, bytes kept because pinned)."""
        dropped = kept = 0
        for name in names:
            with self._lock:
                if keep_pinned and name in self._pinned:
                    kept += self._pinned[name]
                    continue
                slot = self._slots.get(name)
                if slot is not None:  # its log goes once it holds nothing else
                    dropped += slot[2]
                    gone = self._drop_piece(name)
                else:
                    size = self._forget(name) or 0
                    dropped += size
            if slot is not None:
                self._unlink_logs(gone)
            else:
                self._unlink_cached(name, size)
        return dropped, kept

    def rename_cached(self, old: str, new: str) -> None:
        """Compaction moved an extent: keep its cached copy under the new name."""
        if self._slots:
            with self._lock:
                if self.logs is not None and self.logs.rename(old, new):
                    return
        try:
            os.replace(self.cache_path(old), self.cache_path(new))
        except FileNotFoundError:
            return
        finally:
            self.open_files.forget(self._cache_file(old))
        with self._lock:
            pinned = old in self._pinned
            size = self._forget(old)
            if size is not None:
                self._insert(new, size, pinned)


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            raise OSError(f"hot-tier file shorter than its index record ({offset + got} < {offset + length})")
        parts.append(more)
        got += len(more)
    return b"".join(parts)
