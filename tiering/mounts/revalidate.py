"""Revalidating mounted objects in the background, a listing page at a time.

A mounted object whose validation has expired, but whose bytes are cached,
is served from the hot tier at once (HTTP's stale-while-revalidate) and
queued here. A mount's queue is worked off by one task: the queued keys in
order, each ListObjectsV2 page answering the ETag, size and time of up to
1,000 of them, so an epoch over 20,000 objects past their freshness costs
about 20 requests, not 20,000 HEADs in front of 20,000 reads.

What a page says decides each key: the same ETag, size and Last-Modified
renew the validation; anything else, or a key the page passes over (deleted
at the source), drops the description and the cached pieces, so the next
read fetches the object anew and the old version is never served again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from tiering import pool
from tiering.errors import CapacityError
from tiering.index.db import Index
from tiering.meta import MountedObject, now_ms
from tiering.mounts.source import SourceBucket, SourceObject

log = logging.getLogger("tierstore.mounts")

PAGE = 1000  # keys per ListObjectsV2 page: S3's largest
RETRY_AFTER = 5.0  # seconds a mount's revalidation rests after its source failed


class Revalidator:
    """The background revalidation of every mount of one node."""

    def __init__(
        self,
        index: Index,
        client: Callable[[str], Awaitable[SourceBucket]],
        forget: Callable[[str, MountedObject], Awaitable[None]],
    ) -> None:
        self._index = index
        self._client = client
        self._forget = forget
        self._pending: dict[str, set[str]] = {}  # mount -> keys waiting
        self._asking: dict[str, set[str]] = {}  # mount -> keys of the round running now
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._resting: dict[str, float] = {}  # mount -> monotonic time its source may be asked again
        self.rounds = 0  # listing pages asked for (for tests and the status)

    def add(self, name: str, key: str) -> None:
        """Queue ``key`` of mount ``name``; its task starts if none runs."""
        if self._resting.get(name, 0.0) > time.monotonic():
            return  # the source failed just now; a read after the rest queues it again
        if key in self._asking.get(name, ()):
            return  # its page is being asked for: reads meanwhile need no second one
        self._pending.setdefault(name, set()).add(key)
        if name not in self._tasks:
            self._tasks[name] = asyncio.create_task(self._run(name), name=f"revalidate {name}")

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def idle(self) -> None:
        """Until every queued key has been revalidated (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _run(self, name: str) -> None:
        try:
            while keys := self._pending.pop(name, None):
                self._asking[name] = keys
                await self._revalidate(name, sorted(keys))
        except CapacityError as exc:
            log.warning("mount %s: revalidation failed (%s); serving what is cached", name, exc)
            self._pending.pop(name, None)
            self._resting[name] = time.monotonic() + RETRY_AFTER
        finally:
            self._asking.pop(name, None)
            self._tasks.pop(name, None)

    async def _revalidate(self, name: str, keys: list[str]) -> None:
        """Each of ``keys`` (sorted) decided by the listing page that covers
        it; every other key the page shows that this node knows is renewed
        (or dropped) on the way, so the reads that follow find it fresh.

        One sweep up the key space: keys queued meanwhile that lie ahead of
        it join it, and those a page has just decided leave the queue. Else
        each round would list again the pages the one before it covered
        (reads queue the keys of pages not reached yet): three passes over
        a 20,000-object set where one does."""
        client = await self._client(name)
        asking = self._asking[name]
        follow_on = None  # where a page that follows on from the last one starts
        while keys:
            # Keys strictly after the first one's parent: the first key itself
            # is on the page (S3's StartAfter excludes the key it names).
            start = follow_on if follow_on is not None else keys[0][:-1]
            page = await client.page("", "", start, PAGE)
            self.rounds += 1
            last = page.objects[-1].key if page.objects else None
            covered = [key for key in keys if not page.truncated or (last is not None and key <= last)]
            if not covered and follow_on is None:  # a truncated page that ends before the first key: not seen with S3
                covered = keys[:1]
            keys = keys[len(covered):]
            # Queued keys dense (more than one a page, as an epoch's reads
            # queue them): the next page follows on from this one, so no key
            # between the two is left to be queued again; sparse: it starts
            # at the next queued key.
            follow_on = last if len(covered) > 1 and page.truncated else None
            stale = await pool.run(self._renew, name, page.objects, covered)
            for known in stale:
                await self._forget(name, known)
            asking.difference_update(covered)
            queued = self._pending.get(name)
            if not queued:
                continue
            queued.difference_update(found.key for found in page.objects)  # decided by this page
            if page.truncated and last is not None and (ahead := {key for key in queued if key > last}):
                queued.difference_update(ahead)
                asking.update(ahead)
                keys = sorted(ahead.union(keys))

    def _renew(self, name: str, listed: list[SourceObject], covered: list[str]) -> list[MountedObject]:
        """Blocking: renew the validation of every known key ``listed`` shows
        unchanged; the descriptions to drop (changed, or ``covered`` and not
        listed: deleted at the source)."""
        now = now_ms()
        seen = set()
        stale, renewed = [], []
        for found in listed:
            seen.add(found.key)
            known = self._index.get_mounted(name, found.key)
            if known is None:
                continue
            if _same(known, found):
                renewed.append(replace(known, validated_ms=now))
            else:
                stale.append(known)
        self._index.put_mounted(name, *renewed)
        for key in covered:
            if key not in seen and (known := self._index.get_mounted(name, key)) is not None:
                stale.append(known)
        return stale


def _same(known: MountedObject, found: SourceObject) -> bool:
    """The version a listing shows is the one described: same ETag and size,
    and the same Last-Modified to the second (a HEAD gives it in seconds)."""
    return (
        found.etag == known.etag
        and found.size == known.size
        and found.last_modified_ms // 1000 == known.last_modified_ms // 1000
    )
