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
  Evictable when the tier passes its high watermark, in SIEVE order
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
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tiering.errors import SlowDown
from tiering.files import sync_dir, write_all
from tiering.hot.eviction import CacheEviction
from tiering.hot.open_files import OpenFiles, capacity, read_files_now
from tiering.hot.sieve import EvictionAdvisor, Sieve
from tiering.hot.staged import StagingWriter
from tiering.meta import Chunk
from tiering.model.digests import Digests

_FANOUT = 256  # subdirectories, so no directory holds millions of entries
_CLEAN = "clean-shutdown"  # marker file: written at close, removed at start
_BOOT = "boot-id"  # the kernel boot the cache was last written under
_TMP = ".tmp"


class HotTier(CacheEviction):
    """Staged and cached bytes under ``root`` within a byte budget.

    Eviction passes (``evict``) are ``CacheEviction``'s, in
    ``tiering.hot.eviction``; this class decides when one runs."""

    def __init__(self, root: Path, budget: int, high: float = 0.9, low: float = 0.8) -> None:
        self.root = root
        self.cache_root = root / "cache"
        self._root_str, self._cache_root_str = str(root), str(self.cache_root)
        # Each cache subdirectory's path with its slash: a cache file's path
        # is then one concatenation (os.path.join and a format took 1.2 us).
        self._cache_dirs = [f"{self._cache_root_str}/{i:02x}/" for i in range(_FANOUT)]
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
        for i in range(_FANOUT):
            (root / f"{i:02x}").mkdir(parents=True, exist_ok=True)
            (self.cache_root / f"{i:02x}").mkdir(parents=True, exist_ok=True)

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
        data and other writes leave no room. Accounting only (cheap enough
        for the event loop); call ``evict`` in the pool when ``over_high``
        says so."""
        with self._lock:
            if self.fixed + size > self.budget:
                return False
            self.reserved += size
            return True

    @property
    def over_high(self) -> bool:
        return self.staged + self.reserved + self.cached > self.high

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
                raise SlowDown("The hot tier is full of data not yet flushed; retry later")
            self.reserved -= from_reserve
            self.staged += size
        if self.used > self.high:
            self._evict_to(self.low)

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
    def pread_into(fd: int, view: memoryview) -> None:
        """Fill ``view`` from the start of file ``fd`` (OSError if the file is shorter)."""
        got = os.preadv(fd, (view,), 0) if len(view) else 0
        while got < len(view):
            more = os.preadv(fd, (view[got:],), got)
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
            except FileNotFoundError:
                continue
            finally:
                self.open_files.forget(path)
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

    def open_cached(self, name: str, size: int) -> int | None:
        """A descriptor on the cached copy of an extent, or None on a miss.
        A file of the wrong size (torn by a crash) is dropped."""
        try:
            fd = os.open(self.cache_path(name), os.O_RDONLY)
        except FileNotFoundError:
            return None
        if os.fstat(fd).st_size != size:
            os.close(fd)
            self.drop_cached([name])
            return None
        self.touch_cached(name)
        return fd

    def is_cached(self, name: str) -> bool:
        return name in self._sieve or name in self._pinned

    def touch_cached(self, name: str) -> bool:
        """Record a hit on a cached extent (a bit set, no reordering; pinned
        extents are not queued); False when it is not cached."""
        with self._lock:
            return self._sieve.touch(name) or name in self._pinned

    def read_cached(self, name: str, size: int) -> bytes | None:
        fd = self.open_cached(name, size)
        if fd is None:
            return None
        try:
            return _pread_all(fd, size, 0)
        finally:
            os.close(fd)

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
            # A staged file may hold more than the piece asked; a cached extent is exactly its size.
            data = read(self.file_of(file_id, name), size, name is not None)
            if data is None or name is not None and not self.touch_cached(name):
                return None  # or dropped by an eviction meanwhile: not counted as a hit here
            return data
        data = read_files_now([(self.file_of(file_id, name), size, name is not None)
                               for file_id, name, size in pieces], read)
        if data is None or not all(self.touch_cached(name) for _, name, _ in pieces if name is not None):
            return None
        return data

    def fill(self, name: str, data: bytes, pin: bool = False) -> bool:
        """Cache an extent's raw bytes (pinned: never evicted); False when
        they do not fit beside the staged and pinned data. Written under a
        temp name and renamed, so a reader never sees a partial file. Not
        fsynced: see ``resume``. The room is reserved before the write, so
        concurrent fills cannot together pass the high watermark."""
        size = len(data)
        with self._lock:
            if name in self._sieve or name in self._pinned:
                if pin:
                    self._pin(name)
                return True
            if name in self._filling:  # another thread is writing the same bytes
                if pin:
                    self._pin_when_filled.add(name)
                return True
            if self.fixed + size > self.high:
                return False
            self.reserved += size
            self._filling.add(name)
        try:
            if self.over_high:
                # Down to the low watermark, not just below the high one: one
                # eviction pass (a hinted one sorts the future) serves the
                # next ~10% of the tier's fills instead of one.
                self._evict_to(self.low)
            path = self.cache_path(name)
            tmp = path.with_name(name + _TMP)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                write_all(fd, memoryview(data))
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with self._lock:
                self._filled(name, size)
            raise
        with self._lock:
            pin = self._filled(name, size) or pin
            self._insert(name, size, pin)
        return True

    def _filled(self, name: str, size: int) -> bool:
        """End a fill's reservation (lock held); True if a pin waited for it."""
        self.reserved -= size
        self._filling.discard(name)
        if name in self._pin_when_filled:
            self._pin_when_filled.discard(name)
            return True
        return False

    def is_filling(self, name: str) -> bool:
        return name in self._filling

    def pin(self, names: Iterable[str]) -> int:
        """Make cached files unevictable; bytes newly pinned (names not
        cached are skipped: they get pinned when filled)."""
        with self._lock:
            return sum(self._pin(name) for name in names)

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
                dropped += self._forget(name) or 0
            self._unlink_cached(name)
        return dropped, kept

    def rename_cached(self, old: str, new: str) -> None:
        """Compaction moved an extent: keep its cached copy under the new name."""
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

    # -- start and stop ----------------------------------------------------

    def mark_clean(self) -> None:
        """Record a clean shutdown: no write in flight, and the staged bytes.

        Called after the index is closed; ``resume`` consumes it."""
        tmp = self.root / (_CLEAN + _TMP)
        tmp.write_text(str(self.staged))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.root / _CLEAN)
        self.sync_dir(self.root)

    def resume(self, referenced: Callable[[], set[str]]) -> tuple[bool, int]:
        """Prepare the tier for serving; return (was clean, staged files removed).

        After a clean shutdown the staged byte count was saved. Otherwise
        ``referenced()`` (every staged file id the index knows) is consulted to
        remove files a crash left behind. Cache files are not fsynced, so
        after a machine crash (a new kernel boot id) they are all dropped:
        their contents may be torn. After a process crash they are intact.
        The marker is removed, durably, before serving: a crash from here on
        must lead to a sweep at the next start."""
        marker = self.root / _CLEAN
        clean = True
        try:
            staged = int(marker.read_text())
        except (FileNotFoundError, ValueError):
            clean = False
            staged = 0
        marker.unlink(missing_ok=True)
        self.sync_dir(self.root)
        removed = 0
        if clean:
            with self._lock:
                self.staged = staged
        else:
            removed = self.sweep(referenced())
        self._load_cache(drop=not clean and self._rebooted())
        return clean, removed

    def _rebooted(self) -> bool:
        boot = _boot_id()
        path = self.root / _BOOT
        try:
            previous = path.read_text()
        except FileNotFoundError:
            previous = None
        if previous != boot:
            path.write_text(boot)
        return previous is not None and previous != boot

    def _load_cache(self, drop: bool) -> None:
        """Rebuild the SIEVE queue from the cache tree: oldest mtime queued
        first, so the newest files end up at the head. Visited bits are lost."""
        found: list[tuple[int, str, int]] = []
        for i in range(_FANOUT):
            with os.scandir(self.cache_root / f"{i:02x}") as entries:
                for entry in entries:
                    if drop or entry.name.endswith(_TMP):
                        os.unlink(entry.path)
                        continue
                    st = entry.stat()
                    found.append((st.st_mtime_ns, entry.name, st.st_size))
        found.sort()
        with self._lock:
            # Pins are the index's; the service pins these again after start.
            self._sieve = Sieve()
            for _, name, size in found:
                self._sieve.insert(name, size)
            self._pinned = {}
            self.pinned = 0
            self.cached = sum(size for _, _, size in found)

    def sweep(self, referenced: set[str]) -> int:
        """Remove staged files no index record references (left by a crash
        between writing a file and committing it, or between an index delete
        and the unlink). Recount the staged bytes. Return files removed."""
        removed = 0
        staged = 0
        for i in range(_FANOUT):
            with os.scandir(self.root / f"{i:02x}") as entries:
                for entry in entries:
                    if entry.name in referenced:
                        staged += entry.stat().st_size
                    else:
                        os.unlink(entry.path)
                        removed += 1
        with self._lock:
            self.staged = staged
        return removed

    @staticmethod
    def sync_dir(path: Path) -> None:
        sync_dir(path)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


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
