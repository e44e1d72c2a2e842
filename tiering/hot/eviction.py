"""How the hot tier frees room: eviction passes that delete unpinned cache
files until the tier holds at most a target number of bytes, in SIEVE order
or guided by an ``EvictionAdvisor`` (``tiering.hot.sieve`` has both). Mixed
into ``HotTier``, which owns the counters, the lock and the SIEVE queue, and
decides when a pass runs (past the high watermark, or below the free-space
floor of ``tiering.hot.space``; down to the low watermark, or further while
the filesystem lacks free space)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from tiering.hot.logs import KEY

if TYPE_CHECKING:
    import threading
    from pathlib import Path

    from tiering.hot.logs import Logs
    from tiering.hot.open_files import OpenFiles
    from tiering.hot.sieve import EvictionAdvisor, Sieve
    from tiering.hot.space import Floor


class CacheEviction:
    """Eviction methods of ``HotTier`` (see there for the budget and the
    lock); ``HotTier`` provides the attributes declared here."""

    _lock: threading.Lock
    _sieve: Sieve
    advisor: EvictionAdvisor | None
    low: int
    staged: int
    reserved: int
    cached: int
    evicted: int
    open_files: OpenFiles
    disk: Floor

    logs: Logs | None
    _slots: dict[str, object]

    if TYPE_CHECKING:
        def cache_path(self, name: str) -> Path: ...
        def _cache_file(self, name: str) -> str: ...
        def _log_wanted(self, wanted: Callable[[str], bool]) -> Callable[[str], bool]: ...
        def _seal_open_log(self) -> bool: ...

    # -- eviction ----------------------------------------------------------

    def evict(self, target: int | None = None, room: int = 0) -> int:
        """Evict unpinned cache files until the tier holds at most ``target``
        bytes (by default the low watermark, or less while the filesystem's
        free space is short of the floor and its slack, plus ``room`` bytes
        more); bytes freed.

        Copies of pieces other nodes own go first, oldest first (``ranking
        copies``). Then, without an advisor, in SIEVE order. With one, files
        no registered future read wants go first (in SIEVE order), then
        wanted files, the one needed furthest in the future first (Belady's
        rule), then, if still over, whatever SIEVE picks."""
        return self._evict_to(self._target(room) if target is None else target)

    def rank_copies(self, is_copy: Callable[[str], bool]) -> None:
        """In a cluster: ``is_copy(name)`` is True for a cached piece that
        another node owns, which eviction then takes before this node's
        own share. Called for each name as it is queued (under the lock: a
        table lookup), and for all of them by ``judge_copies``."""
        with self._lock:
            self._sieve.judge = is_copy
        self.judge_copies()

    @property
    def copies(self) -> int:
        """Cached pieces judged copies of other nodes' (evicted first)."""
        return len(self._sieve.copies)

    def judge_copies(self) -> int:
        """Blocking: judge every queued name again (the owners changed);
        the copies now. The judging runs outside the lock, over a snapshot."""
        is_copy = self._sieve.judge
        if is_copy is None:
            return 0
        with self._lock:
            names = list(self._sieve.names())
        copies = [name for name in names if is_copy(name)]
        with self._lock:
            self._sieve.rejudge(copies)
            return len(self._sieve.copies)

    def _target(self, room: int = 0) -> int:
        """Where a pass stops: the low watermark, or lower by the bytes free
        space lacks to be back at the floor plus its slack once the bytes
        promised to writes (and ``room`` more) are written."""
        wanted = self.disk.wanted(self.reserved + room)
        used = self.staged + self.reserved + self.cached
        return min(self.low, used - wanted) if wanted else self.low

    def can_free(self) -> bool:
        """Whether eviction or a flush can give the disk room: unpinned
        cache, staged data a flush turns into some, or writes under way
        that will be staged."""
        return bool(self._sieve) or bool(self._slots) or self.staged + self.reserved > 0

    def _evict_to(self, target: int) -> int:
        target = max(target, 0)
        advisor = self.advisor  # one advisor for the whole pass
        freed = self._evict_victims(target, None, copies=True)
        if advisor is None:
            return freed + self._evict_victims(target, None)
        freed += self._evict_victims(target, self._log_wanted(advisor.wanted))
        freed += self._evict_furthest(target, advisor)
        return freed + self._evict_victims(target, None)

    def _done(self, target: int) -> bool:
        """At or below ``target``, or nothing left to evict (lock held): the
        open log counts, an eviction seals it when nothing else is left."""
        if self.staged + self.reserved + self.cached <= target:
            return True
        return not self._sieve and not (self.logs is not None and self.logs.open_pieces())

    def _evict_victims(self, target: int, skip: Callable[[str], bool] | None, copies: bool = False) -> int:
        """Evict SIEVE victims (passing over names ``skip`` keeps) until done
        or every queued name is skipped; with ``copies``, the copies of other
        nodes' pieces alone, oldest first."""
        freed = 0
        while True:
            with self._lock:
                if self._done(target):
                    break
                if copies:
                    picked = self._sieve.copy_victim()
                    if picked is None:
                        break
                else:
                    picked = self._sieve.victim(skip)
                if picked is None and self._seal_open_log():
                    picked = self._sieve.victim(skip)
                if picked is None:
                    break
                name, size = picked
                self._account_evicted(name, size)
            self._unlink_cached(name, size)
            freed += size
        return freed

    def _evict_furthest(self, target: int, advisor: EvictionAdvisor) -> int:
        """Evict queued names in the advisor's furthest-first order until
        done. The lock is held per name, never while the advisor's iterator
        runs, so it may be a generator doing work of its own."""
        with self._lock:
            if self._done(target):
                return 0
        freed = 0
        unit = self.logs.unit if self.logs is not None else str
        for wanted in advisor.furthest():
            with self._lock:
                if self._done(target):
                    break
                name = unit(wanted)  # a log-held piece goes with its log
                size = self._sieve.remove(name)  # None: not cached, pinned or filling
                if size is not None:
                    self._account_evicted(name, size)
                done = self._done(target)
            if size is not None:
                self._unlink_cached(name, size)
                freed += size
            if done:
                break
        return freed

    def _account_evicted(self, name: str, size: int) -> None:
        """A file or a log left the queue to be evicted (lock held)."""
        self.cached -= size
        self.evicted += size
        if self.logs is not None and (log := self.logs.log_of(name)) is not None:
            self.logs.remove(log)

    def _unlink_cached(self, name: str, size: int = 0) -> None:
        logs = self.logs
        path = logs.path_of(name) if logs is not None and name.startswith(KEY) else self._cache_file(name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        finally:
            self.open_files.forget(path, size)
