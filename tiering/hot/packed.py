"""The hot tier's side of small cached pieces kept in logs
(``tiering.hot.logs``): appending a fill, dropping a piece, copying a piece
out to a file of its own when it is pinned (a pinned piece must never go
with its log), and the accounting that goes with each. Mixed into
``HotTier``, which owns the counters, the lock and the SIEVE queue, and
calls these methods with or without its lock as each says."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tiering.hot.logs import KEY, Append, Log, Logs

if TYPE_CHECKING:
    from tiering.hot.open_files import OpenFiles
    from tiering.hot.sieve import Sieve


class PackedPieces:
    """Log-held pieces of ``HotTier``; it provides the attributes declared here."""

    _lock: threading.Lock
    _sieve: Sieve
    logs: Logs | None
    _slots: dict[str, tuple[Log, int, int]]
    cached: int
    open_files: OpenFiles

    if TYPE_CHECKING:
        def _filled(self, name: str, size: int) -> bool: ...
        def _write_file(self, name: str, data: bytes) -> None: ...
        def _insert(self, name: str, size: int, pin: bool) -> None: ...

    def _append_many(self, pieces: Sequence[tuple[str, bytes]]) -> list[bool]:
        """Blocking: append pieces to the open log, their room reserved
        (``HotTier.fill``, ``fill_many``), readable once the write returned:
        reserved under one hold of the lock, so they follow on in the log
        (or the next, when it fills), written together
        (``Logs.write_many``), published under one more. A failed write
        (a full disk) ends every piece's fill, none cached, and raises."""
        logs = self.logs
        assert logs is not None
        appends: list[Append] = []
        with self._lock:
            gone: list[Log] = []
            for name, data in pieces:
                append, idle = logs.reserve(name, data)
                appends.append(append)
                gone += self._queue_logs(idle)
        self._unlink_logs(gone)
        gone = []
        try:
            Logs.write_many(appends, [data for _, data in pieces])
        except BaseException:
            with self._lock:
                for (name, data), append in zip(pieces, appends, strict=True):
                    self._filled(name, len(data))
                    gone += self._queue_logs(logs.abandon(append))
            self._unlink_logs(gone)
            raise
        cached: list[bool] = []
        pinned: list[str] = []
        with self._lock:
            for (name, data), append in zip(pieces, appends, strict=True):
                if self._filled(name, len(data)):
                    pinned.append(name)
                gained, idle = logs.publish(name, append, len(data))
                self.cached += gained
                gone += self._queue_logs(idle)
                cached.append(bool(gained))
        self._unlink_logs(gone)
        for name in pinned:
            self._copy_out(name)
        return cached

    def _queue_logs(self, idle: list[Log]) -> list[Log]:
        """Logs now sealed with nothing left to write join the queue as one
        entry each; an empty one is removed (lock held). Those to unlink."""
        gone = []
        for log in idle:
            if log.members:
                self._sieve.insert(log.key, log.used)
            else:
                gone += self._remove_log(log)
        return gone

    def _seal_open_log(self) -> bool:
        """Queue the open log, for an eviction that found nothing else to
        take (lock held); True if it did (an empty one is unlinked here)."""
        if self.logs is None:
            return False
        idle = self.logs.seal_open()
        self._unlink_logs(self._queue_logs(idle))
        return bool(idle)

    def _drop_piece(self, name: str) -> list[Log]:
        """Forget a log-held piece (lock held); the log to unlink if it held
        nothing else. Its bytes stay counted until then."""
        assert self.logs is not None
        log = self.logs.drop(name)
        return [] if log is None else self._remove_log(log)

    def _remove_log(self, log: Log) -> list[Log]:
        assert self.logs is not None
        if log.queued:
            self._sieve.remove(log.key)
        self.cached -= log.used
        self.logs.remove(log)
        return [log]

    def _unlink_logs(self, logs: list[Log]) -> None:
        for log in logs:
            try:
                os.unlink(log.path)
            except FileNotFoundError:
                pass
            finally:
                self.open_files.forget(log.path, log.used)

    def _copy_out(self, name: str) -> int:
        """Blocking: give a log-held piece a file of its own, pinned; its size
        (0 if it is not in a log any more)."""
        slot = self._slots.get(name)
        if slot is None:
            return 0
        log, offset, size = slot
        try:
            fd = os.open(log.path, os.O_RDONLY)
        except FileNotFoundError:
            return 0  # evicted meanwhile: pinned when it is filled again
        try:
            data = os.pread(fd, size, offset)
        finally:
            os.close(fd)
        if len(data) != size:
            return 0
        self._write_file(name, data)
        with self._lock:
            gone = self._drop_piece(name) if name in self._slots else []
            self._insert(name, size, True)
        self._unlink_logs(gone)
        return size

    def _log_wanted(self, wanted: Callable[[str], bool]) -> Callable[[str], bool]:
        """An advisor's ``wanted`` for queue entries: a log is wanted while
        any piece in it is."""
        logs = self.logs
        if logs is None:
            return wanted
        return lambda name: logs.any_member(name, wanted) if name.startswith(KEY) else wanted(name)
