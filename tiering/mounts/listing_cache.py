"""Listing pages of mounted buckets, reused for a few seconds.

A data loader that lists a huge mounted data set at every epoch start (or
every worker that lists it) would ask the source for the same pages again
and again; a mount with ``listing_ttl`` keeps each page it fetched for that
many seconds. Pages are keyed by every parameter of the request, so a page
is only reused for the very same question. Writes through the gateway drop
the mount's pages at once; changes made at the source directly are seen
once the pages expire. The cache holds at most ``max_entries`` listed keys
and prefixes over all mounts, dropping the least recently used pages first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from tiering.index.db import ListEntry, ListPage, successor
from tiering.meta import Mount
from tiering.mounts.source import SourceBucket


class _Question(NamedTuple):
    mount: str
    prefix: str
    delimiter: str
    marker: str
    max_keys: int


class ListingCache:
    def __init__(self, max_entries: int = 200_000) -> None:
        self.max_entries = max_entries
        self._pages: OrderedDict[_Question, tuple[float, ListPage]] = OrderedDict()
        self._by_mount: dict[str, set[_Question]] = {}
        self._generations: dict[str, int] = {}
        self._entries = 0

    def get(self, mount: str, prefix: str, delimiter: str, marker: str, max_keys: int) -> ListPage | None:
        question = _Question(mount, prefix, delimiter, marker, max_keys)
        found = self._pages.get(question)
        if found is None:
            return None
        expires, page = found
        if time.monotonic() >= expires:
            self._drop(question)
            return None
        self._pages.move_to_end(question)
        return page

    async def page(self, mount: Mount, source: Callable[[], Awaitable[SourceBucket]], prefix: str,
                   delimiter: str, marker: str, max_keys: int) -> ListPage:
        """One listing page of ``mount``: kept from before (within its
        ``listing_ttl``), or asked of its source (CapacityError when that fails)."""
        cached = self.get(mount.name, prefix, delimiter, marker, max_keys)
        if cached is not None:
            return cached
        generation = self.generation(mount.name)
        start_after = successor(marker) if delimiter and marker.endswith(delimiter) else marker
        page = await (await source()).page(prefix, delimiter, start_after, max_keys)
        contents = [ListEntry(o.key, o.size, o.etag, o.last_modified_ms, None) for o in page.objects]
        names = sorted([e.key for e in contents] + page.prefixes)
        answer = ListPage(contents, page.prefixes, page.truncated, names[-1] if names else None)
        if mount.listing_ttl > 0:
            self.put(mount.name, prefix, delimiter, marker, max_keys, answer, mount.listing_ttl, generation)
        return answer

    def generation(self, mount: str) -> int:
        """Taken before asking the source: a page asked for before a write
        but answered after it is not kept (it may predate the write)."""
        return self._generations.get(mount, 0)

    def put(self, mount: str, prefix: str, delimiter: str, marker: str, max_keys: int,
            page: ListPage, ttl: float, generation: int) -> None:
        if generation != self.generation(mount):
            return
        question = _Question(mount, prefix, delimiter, marker, max_keys)
        if question in self._pages:
            self._drop(question)
        size = _size(page)
        if ttl <= 0 or size > self.max_entries:
            return
        self._pages[question] = (time.monotonic() + ttl, page)
        self._by_mount.setdefault(mount, set()).add(question)
        self._entries += size
        while self._entries > self.max_entries:
            self._drop(next(iter(self._pages)))

    def forget(self, mount: str) -> None:
        """Drop every page of ``mount`` (after a write through the gateway)."""
        self._generations[mount] = self.generation(mount) + 1
        for question in list(self._by_mount.get(mount, ())):
            self._drop(question)

    def _drop(self, question: _Question) -> None:
        _, page = self._pages.pop(question)
        self._entries -= _size(page)
        same = self._by_mount[question.mount]
        same.discard(question)
        if not same:
            del self._by_mount[question.mount]


def _size(page: ListPage) -> int:
    return len(page.contents) + len(page.prefixes) + 1
