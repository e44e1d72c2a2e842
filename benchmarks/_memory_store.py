"""A capacity store in memory, for simulations: S3's answers, counted.

``MemoryStore`` implements ``tiering.capacity.store.CapacityStore`` with
what the cluster code relies on from S3: an ETag per object (the MD5 of
its bytes, so the same bytes written again keep their tag), LastModified
in whole seconds on the store's clock, conditional writes (``If-None-Match:
*`` / ``If-Match``), conditional deletes, conditional reads (a 304 when
unchanged, counted as the GET S3 bills it as), and listings in pages of
at most 1,000 names (ListObjectsV2's ``MaxKeys``), one request a page.

Every request is counted by operation and by the name it touches
(``requests``: ``(operation, name) -> count``): an object's name, or the
prefix a listing names. ``prefix_of`` says which prefix S3 would count an
object's request under (its name up to its last ``/``: ``leases/`` for the
follow head and the leases). A request may take
``latency`` seconds of the loop's clock (a simulated clock when the loop's
is), and ``clock`` is the store's wall clock (LastModified).

Nothing here touches a disk or a socket: many nodes share one store in one
process. Not for tests of the real stores' behaviour (the contract suite
runs those against moto and the local directory).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import hashlib
import math
import time
from collections.abc import AsyncIterator, Callable

from _common import ROOT  # noqa: F401  (first: puts the repo root on sys.path)

from tiering.capacity.store import CapacityStats, Into, Listed, check_name, check_prefix, check_range, pour
from tiering.errors import CapacityConflict, CapacityError, CapacityNotFound

PAGE = 1000  # ListObjectsV2 answers at most this many names a request


def prefix_of(name: str) -> str:
    """The prefix an object's requests are counted under: its "directory"."""
    return name[: name.rfind("/") + 1]


class MemoryStore:
    """Objects in a dict, names in a sorted list; every request counted."""

    def __init__(self, clock: Callable[[], float] = time.time, latency: float = 0.0) -> None:
        self.stats = CapacityStats()
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self._clock = clock
        self._latency = latency
        self._objects: dict[str, tuple[bytes, Listed]] = {}
        self._names: list[str] = []  # sorted: listings walk it in S3's order

    # -- counting -------------------------------------------------------------------

    async def _request(self, operation: str, name: str) -> None:
        self.requests[(operation, name)] += 1
        if self._latency:
            await asyncio.sleep(self._latency)

    def reset(self) -> None:
        """Zero the counters (a measurement starts)."""
        self.requests.clear()
        self.stats = CapacityStats()

    # -- objects ---------------------------------------------------------------------

    def _store(self, name: str, data: bytes) -> str:
        tag = hashlib.md5(data, usedforsecurity=False).hexdigest()
        if name not in self._objects:
            bisect.insort(self._names, name)
        # S3 keeps LastModified in whole seconds.
        self._objects[name] = (data, Listed(name, len(data), tag, float(math.floor(self._clock()))))
        self.stats.bytes_written += len(data)
        return tag

    def _remove(self, name: str) -> None:
        if self._objects.pop(name, None) is not None:
            del self._names[bisect.bisect_left(self._names, name)]

    def _get(self, name: str) -> tuple[bytes, Listed]:
        try:
            return self._objects[check_name(name)]
        except KeyError:
            raise CapacityNotFound(f"memory store: no such object {name}", name=name) from None

    def _tag(self, name: str) -> str | None:
        found = self._objects.get(name)
        return found[1].etag if found is not None else None

    # -- the CapacityStore protocol --------------------------------------------------

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def describe(self) -> str:
        return "memory"

    async def put(self, name: str, data: bytes | memoryview) -> None:
        check_name(name)
        self.stats.puts += 1
        await self._request("PUT", name)
        self._store(name, bytes(data))

    def upload(self, name: str) -> _Upload:
        return _Upload(self, check_name(name))

    async def read_versioned(self, name: str) -> tuple[bytes, str]:
        self.stats.gets += 1
        await self._request("GET", name)
        data, listed = self._get(name)
        self.stats.bytes_read += len(data)
        return data, listed.etag

    async def read_if_changed(self, name: str, tag: str) -> tuple[bytes, str] | None:
        self.stats.gets += 1
        await self._request("GET", name)
        data, listed = self._get(name)
        if listed.etag == tag:
            return None  # 304 Not Modified: a request, no body
        self.stats.bytes_read += len(data)
        return data, listed.etag

    async def put_conditional(self, name: str, data: bytes, expect: str | None) -> str:
        check_name(name)
        self.stats.puts += 1
        await self._request("PUT", name)
        current = self._tag(name)
        if current != expect:  # If-None-Match: * on an object that exists, If-Match on another version
            raise CapacityConflict(f"memory store: conditional write of {name}", name=name,
                                   expected=expect, found=current)
        return self._store(name, bytes(data))

    async def delete_conditional(self, name: str, expect: str) -> None:
        check_name(name)
        self.stats.deletes += 1
        await self._request("DELETE", name)
        current = self._tag(name)
        if current is None:
            return
        if current != expect:
            raise CapacityConflict(f"memory store: conditional delete of {name}", name=name,
                                   expected=expect, found=current)
        self._remove(name)

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        check_range(start, end)
        if start == end:
            return b""
        self.stats.gets += 1
        await self._request("GET", name)
        data, _ = self._get(name)
        if end > len(data):
            raise CapacityError(f"memory store: {name} is {len(data)} bytes, asked for [{start}, {end})",
                                name=name, size=len(data))
        self.stats.bytes_read += end - start
        return data[start:end]

    async def get_range_into(self, name: str, start: int, end: int, into: Into) -> None:
        pour(into, await self.get_range(name, start, end))

    async def get_tail(self, name: str, length: int) -> tuple[bytes, int]:
        self.stats.gets += 1
        await self._request("GET", name)
        data, _ = self._get(name)
        tail = data[-length:] if length else b""
        self.stats.bytes_read += len(tail)
        return tail, len(data)

    async def size(self, name: str) -> int:
        self.stats.heads += 1
        await self._request("HEAD", name)
        return self._get(name)[1].size

    async def delete(self, name: str) -> None:
        check_name(name)
        self.stats.deletes += 1
        await self._request("DELETE", name)
        self._remove(name)

    async def abort_incomplete(self) -> int:
        return 0

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[tuple[str, int]]:
        async for listed in self._pages(prefix, after):
            yield listed.name, listed.size

    async def list_entries(self, prefix: str = "") -> AsyncIterator[Listed]:
        async for listed in self._pages(prefix, ""):
            yield listed

    async def _pages(self, prefix: str, after: str) -> AsyncIterator[Listed]:
        """Page after page, each as the store holds it when it is asked
        for (as S3's continuation tokens give them), one request each."""
        check_prefix(prefix)
        while True:
            self.stats.lists += 1
            await self._request("LIST", prefix)
            start = bisect.bisect_right(self._names, after) if after > prefix else \
                bisect.bisect_left(self._names, prefix)
            page = []
            for name in self._names[start:start + PAGE]:
                if not name.startswith(prefix):
                    break
                page.append(self._objects[name][1])
            for listed in page:
                yield listed
            if len(page) < PAGE:
                return
            after = page[-1].name


class _Upload:
    """An object written in pieces: visible whole at ``complete`` (one
    request per piece and one to complete, as a multipart upload)."""

    def __init__(self, store: MemoryStore, name: str) -> None:
        self._store = store
        self._name = name
        self._pieces: list[bytes] = []

    async def write(self, data: bytes | memoryview) -> None:
        self._store.stats.puts += 1
        await self._store._request("PUT", self._name)
        self._pieces.append(bytes(data))

    async def complete(self) -> int:
        self._store.stats.puts += 1
        await self._store._request("POST", self._name)
        data = b"".join(self._pieces)
        self._store._store(self._name, data)
        return len(data)

    async def abort(self) -> None:
        self._pieces = []
