"""Hot batches: every member known and every body's file open before the
first byte, so the gateway lays the answer out whole and reads the bodies
straight into its send buffers."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence

from tiering import pool
from tiering.batch.member import Member
from tiering.hot.tier import HotTier
from tiering.reads.plan import NOW_READ, ReadTally

# The open pieces of one member's body, in order: (descriptor, where its
# bytes start, how many): the offset is 0 but in a log (tiering/hot/logs.py).
Pieces = list[tuple[int, int, int]]


class HotBatch:
    """A batch whose members are all known before its first byte: each an
    error or a small object whose every piece is open, so its bytes can no
    longer change (an eviction, a flush or a delete unlinks or renames a
    file; an open descriptor still reads it). The gateway lays out the
    answer whole and has the bodies read into its buffers, a run of
    members at a time (:meth:`read`); :meth:`close` when done.

    Built by ``BatchReads.lookup_open`` for a managed bucket, and by a read
    worker from the files it opened (``gateway/workers/worker.py``)."""

    def __init__(self, members: list[Member], files: list[Pieces | None], tally: ReadTally,
                 observe: Callable[[str], None] | None = None,
                 release: Callable[[int], None] = os.close) -> None:
        self.members = members  # in order: ``meta`` or ``error`` set, never ``body``
        self._files = files  # per member, its open pieces (None for an error)
        self._tally = tally
        self._observe = observe  # a member's turn: the epoch readers move
        # What is done with a descriptor once read: closed, or a kept
        # one's hold released (``OpenFiles.release``, on the loop only).
        self._release = release
        self._closed = False

    async def read(self, start: int, views: Sequence[memoryview | None]) -> None:
        """Read the bodies of the members from ``start`` on into ``views``
        (one per member, each of its size; None for an error), and close
        their files. The members' turn has come: they count as read, and
        move the epoch readers.

        As a single GET's ``HotTier.read_now``: a body of at most NOW_READ
        bytes is read on the event loop with ``RWF_NOWAIT``, which fails
        rather than wait for the disk, the loop let go between steps of
        NOW_READ bytes; a larger body, or one not all in the page cache,
        is read by the pool (one call for the rest of the run). In the pool,
        each read gave the GIL up and took it back against the loop's
        thread: reading on the loop cost a fifth less CPU per object in a
        hot batch of 64 KiB objects (docs/batch.md)."""
        if self._closed:
            raise RuntimeError("read of a closed batch")
        files, members, observe, release = self._files, self.members, self._observe, self._release
        later: list[tuple[Pieces, memoryview]] = []  # their descriptors are this call's to release
        last = start + len(views) - 1
        step = 0
        try:
            for i, view in enumerate(views, start):
                if observe is not None:
                    observe(members[i].key)
                pieces = files[i]
                if pieces is None:
                    continue
                assert view is not None
                size = len(view)
                self._tally.hot += size
                done = size <= NOW_READ and _read_now(pieces, view)
                files[i] = None  # released below, or once ``later`` is read
                if not done:
                    later.append((pieces, view))
                    continue
                for fd, _, _ in pieces:
                    release(fd)
                step += size
                if step >= NOW_READ and i < last:
                    step = 0
                    await asyncio.sleep(0)  # others' turn on the loop
        except BaseException:
            close_all([pieces for pieces, _ in later], release)
            raise
        if later:
            # Not cancelled with this call: the descriptors are released on
            # the loop once the pool is done with them.
            job = asyncio.ensure_future(pool.run(_read_into, later))
            job.add_done_callback(lambda done: _released(done, later, release))
            await asyncio.shield(job)

    def close(self) -> None:
        """Release the files of the members not read (those read were
        released by their read)."""
        if not self._closed:
            self._closed = True
            close_all(self._files, self._release)


def _read_now(pieces: Pieces, view: memoryview) -> bool:
    """Read ``pieces`` into ``view`` if the page cache holds them all, else
    False (EAGAIN, a short read, no RWF_NOWAIT here): the pool reads them."""
    try:
        if len(pieces) == 1:  # most members: the whole view, no slice
            fd, offset, size = pieces[0]
            return not size or os.preadv(fd, (view,), offset, os.RWF_NOWAIT) == size
        at = 0
        for fd, offset, size in pieces:
            if size and os.preadv(fd, (view[at:at + size],), offset, os.RWF_NOWAIT) != size:
                return False
            at += size
    except OSError:
        return False
    return True


def _read_into(jobs: list[tuple[Pieces, memoryview]]) -> None:
    """Blocking: each job's pieces, in order, into its view."""
    for pieces, view in jobs:
        at = 0
        for fd, offset, size in pieces:
            HotTier.pread_into(fd, view[at:at + size], offset)
            at += size


def _released(done: asyncio.Future[None], jobs: list[tuple[Pieces, memoryview]],
              release: Callable[[int], None]) -> None:
    """On the loop, once the pool has read ``jobs``: their descriptors released."""
    if not done.cancelled():
        done.exception()  # retrieved: the caller, if it still waits, raises it
    close_all([pieces for pieces, _ in jobs], release)


def close_all(files: list[Pieces | None] | None, release: Callable[[int], None] = os.close) -> None:
    for pieces in files or ():
        for fd, _, _ in pieces or ():
            release(fd)
