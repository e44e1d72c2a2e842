"""How bytes fetched for a read become cached pieces of the hot tier: a fill
is admitted (not cached or being written already, room under the high
watermark reserved), room is made (an eviction pass, the free-space floor),
and the bytes are written, to a log (``PackedPieces``) or a file of their
own. ``fill`` does one piece; ``fill_many`` a batch, as the fills' writer
thread hands them over (``tiering.hot.fills``): one lock for the batch's
admissions and one for its accounting, one check of the room, and the
batch's log records in one write. Mixed into ``HotTier``, which owns the
counters, the lock and the SIEVE queue; every method blocks."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tiering.files import write_all
from tiering.hot.restart import TMP

if TYPE_CHECKING:
    from tiering.hot.logs import Log, Logs
    from tiering.hot.sieve import Sieve
    from tiering.hot.space import Floor


class CacheFilling:
    """Fills of ``HotTier``; it provides the attributes declared here."""

    _lock: threading.Lock
    _sieve: Sieve
    _pinned: dict[str, int]
    _slots: dict[str, tuple[Log, int, int]]
    _filling: set[str]
    _pin_when_filled: set[str]
    logs: Logs | None
    disk: Floor
    high: int
    staged: int
    reserved: int
    cached: int

    if TYPE_CHECKING:
        @property
        def fixed(self) -> int: ...
        def cache_path(self, name: str) -> Path: ...
        def _pin(self, name: str) -> int: ...
        def _insert(self, name: str, size: int, pin: bool) -> None: ...
        def _copy_out(self, name: str) -> int: ...
        def _append_many(self, pieces: Sequence[tuple[str, bytes]]) -> list[bool]: ...
        def _evict_to(self, target: int) -> int: ...
        def _target(self, room: int = 0) -> int: ...

    def fill(self, name: str, data: bytes, pin: bool = False) -> bool:
        """Cache a piece's raw bytes (pinned: never evicted); False when
        they do not fit beside the staged and pinned data. A small unpinned
        piece is appended to a log (``PackedPieces``); any other is written
        to a file of its own under a temp name and renamed, so a reader never
        sees a partial file. Not fsynced: see ``resume``. The room is
        reserved before the write, so concurrent fills cannot together pass
        the high watermark."""
        size = len(data)
        if pin and name in self._slots:
            self._copy_out(name)
            return True
        with self._lock:
            admitted = self._admit(name, size, pin)
        if admitted is not None:
            return admitted
        if self._logged(size, pin):
            outcome = self._append_admitted([(name, data)])[0]
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        try:
            if not self._room(1):
                with self._lock:
                    self._filled(name, size)
                return False
            self._write_file(name, data)
        except BaseException:
            with self._lock:
                self._filled(name, size)
            raise
        with self._lock:
            pin = self._filled(name, size) or pin
            self._insert(name, size, pin)
        return True

    def fill_many(self, fills: Sequence[tuple[str, bytes, bool]]) -> list[bool | BaseException]:
        """``fill`` each of ``fills`` (name, bytes, pin), a batch at once:
        what ``fill`` returns for each, or what it raised. The small
        unpinned pieces a log takes are admitted together and appended with
        one write; the others go through ``fill`` one by one."""
        outcomes: list[bool | BaseException] = [False] * len(fills)
        logged: list[int] = []  # of the pieces admitted for one append
        alone: list[int] = []  # of the pieces ``fill`` writes
        with self._lock:
            for at, (name, data, pin) in enumerate(fills):
                if not self._logged(len(data), pin):
                    alone.append(at)
                elif (admitted := self._admit(name, len(data), False)) is None:
                    logged.append(at)
                else:
                    outcomes[at] = admitted
        for at in alone:
            try:
                outcomes[at] = self.fill(*fills[at])
            except BaseException as exc:  # noqa: BLE001  each piece's own outcome, to its reader
                outcomes[at] = exc
        appended = self._append_admitted([(fills[at][0], fills[at][1]) for at in logged]) if logged else []
        for at, outcome in zip(logged, appended, strict=True):
            outcomes[at] = outcome
        return outcomes

    def _logged(self, size: int, pin: bool) -> bool:
        """Whether a piece of ``size`` bytes is appended to a log."""
        return not pin and self.logs is not None and self.logs.fits(size)

    def _append_admitted(self, pieces: Sequence[tuple[str, bytes]]) -> list[bool | BaseException]:
        """Make room for admitted pieces (their bytes reserved) and append
        them to the log together: each one's outcome (False: no room on the
        disk; what making room or the append raised). Every piece's fill
        ends here."""
        try:
            room: bool | BaseException = self._room(len(pieces))
        except BaseException as exc:  # noqa: BLE001  (an eviction pass failed) each piece's outcome
            room = exc
        if room is not True:
            with self._lock:
                for name, data in pieces:
                    self._filled(name, len(data))
            return [room] * len(pieces)
        try:
            return list(self._append_many(pieces))  # ends each piece's fill, also when it raises
        except BaseException as exc:  # noqa: BLE001  each piece's outcome, to its reader
            return [exc] * len(pieces)

    def _admit(self, name: str, size: int, pin: bool) -> bool | None:
        """A fill's outcome when it needs no write (True: cached or being
        written already; False: no room under the high watermark), or None
        with its bytes reserved and the piece marked as filling (lock held)."""
        if name in self._sieve or name in self._pinned or name in self._slots:
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
        return None

    def _room(self, fills: int) -> bool:
        """Make room for admitted fills (``fills`` of them, their bytes
        reserved): False when the disk has none above its floor, counted as
        skipped (the read that fetched the bytes is answered all the same)."""
        short = self.disk.short(self.reserved, recent=True)  # a statvfs per READING_AGE, unless it evicts
        # over_high's, but for the floor: free space below it leaves these
        # fills short too (their bytes are reserved), and short asked already.
        if self.staged + self.reserved + self.cached > self.high or short:
            # Down to the low watermark, not just below the high one: one
            # eviction pass (a hinted one sorts the future) serves the
            # next ~10% of the tier's fills instead of one.
            self._evict_to(self._target())
            short = self.disk.short(self.reserved)
        if short:
            self.disk.fills_skipped += fills
        return not short

    def _write_file(self, name: str, data: bytes) -> None:
        """Blocking: ``data`` as the cache file of ``name``, whole or not at all."""
        path = self.cache_path(name)
        tmp = path.with_name(name + TMP)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            write_all(fd, memoryview(data))
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def _filled(self, name: str, size: int) -> bool:
        """End a fill's reservation (lock held); True if a pin waited for it."""
        self.reserved -= size
        self.disk.landed(size)
        self._filling.discard(name)
        if name in self._pin_when_filled:
            self._pin_when_filled.discard(name)
            return True
        return False

    def is_filling(self, name: str) -> bool:
        return name in self._filling
