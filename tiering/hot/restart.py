"""The hot tier's start and stop: the clean-shutdown marker, the sweep of
staged files a crash left behind, and the cache tree read back into the
eviction queue. Mixed into ``HotTier`` (``tiering.hot.tier``), which owns
the counters, the lock and the queue."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from tiering.files import no_space, sync_dir
from tiering.hot.logs import Logs
from tiering.hot.sieve import Sieve

log = logging.getLogger("tierstore.hot")

FANOUT = 256  # subdirectories, so no directory holds millions of entries
CLEAN = "clean-shutdown"  # marker file: written at close, removed at start
BOOT = "boot-id"  # the kernel boot the cache was last written under
TMP = ".tmp"


class Restart:
    """Start and stop of ``HotTier`` (see there for the trees and the
    lock); ``HotTier`` provides the attributes declared here."""

    root: Path
    cache_root: Path
    staged: int
    cached: int
    pinned: int
    _lock: threading.Lock
    _sieve: Sieve
    _pinned: dict[str, int]
    logs: Logs | None

    def mark_clean(self) -> None:
        """Record a clean shutdown: no write in flight, and the staged bytes.

        Called after the index is closed; ``resume`` consumes it. On a
        full disk there is none (logged): the next start sweeps, which is
        what it does after a crash, and loses nothing."""
        if self.logs is not None:
            self.logs.close()
        tmp = self.root / (CLEAN + TMP)
        try:
            tmp.write_text(str(self.staged))
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, self.root / CLEAN)
            self.sync_dir(self.root)
        except OSError as exc:
            if not no_space(exc):
                raise
            tmp.unlink(missing_ok=True)
            log.warning("no clean-shutdown marker (%s): the next start sweeps the hot tier", exc)

    def resume(self, referenced: Callable[[], set[str]]) -> tuple[bool, int]:
        """Prepare the tier for serving; return (was clean, staged files removed).

        After a clean shutdown the staged byte count was saved. Otherwise
        ``referenced()`` (every staged file id the index knows) is consulted to
        remove files a crash left behind. Cache files are not fsynced, so
        after a machine crash (a new kernel boot id) they are all dropped:
        their contents may be torn. After a process crash they are intact.
        The marker is removed, durably, before serving: a crash from here on
        must lead to a sweep at the next start."""
        marker = self.root / CLEAN
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
        path = self.root / BOOT
        try:
            previous = path.read_text()
        except FileNotFoundError:
            previous = None
        if previous != boot:
            try:
                path.write_text(boot)
            except OSError as exc:  # a full disk: the next start may drop the cache too
                if not no_space(exc):
                    raise
                path.unlink(missing_ok=True)
        return previous is not None and previous != boot

    def _load_cache(self, drop: bool) -> None:
        """Rebuild the SIEVE queue from the cache tree and the logs (each
        one entry): oldest mtime queued first, so the newest end up at the
        head. Visited bits are lost."""
        found: list[tuple[int, str, int]] = self.logs.load(drop) if self.logs is not None else []
        for i in range(FANOUT):
            with os.scandir(self.cache_root / f"{i:02x}") as entries:
                for entry in entries:
                    if drop or entry.name.endswith(TMP):
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
        for i in range(FANOUT):
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
