"""The capacity tier: immutable named objects (segments) in an object store.

``CapacityStore`` is the whole contract the rest of ``tiering`` relies on
(the backends live beside this module: ``local.py``, ``s3.py``).

Every backend reports failures the same way: a missing name raises
``CapacityNotFound`` from every read method, anything else that cannot be
served raises ``CapacityError``, and a name that could escape the store's
root or prefix raises ``ValueError`` before any I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

# Temporary files of LocalDirStore start with this; no name component may, so
# a temp file is never mistaken for an object (and list can skip them).
TMP_PREFIX = ".tmp-"


class Into(Protocol):
    """Where a ranged GET's bytes go as they arrive
    (``CapacityStore.get_range_into``): the store puts the next bytes at the
    start of ``buffer()`` (the rest of the range), then says how many with
    ``landed``. Neither may raise."""

    def buffer(self) -> memoryview:
        ...

    def landed(self, count: int) -> None:
        ...


def pour(into: Into, piece: bytes | memoryview) -> None:
    """Copy ``piece`` into ``into``: for a source that reads into buffers of its own."""
    if piece:
        into.buffer()[: len(piece)] = piece
        into.landed(len(piece))


@dataclass(slots=True)
class CapacityStats:
    """Request counters, for benchmarks and the admin API.

    One count per logical request; the extra attempts of a retried request
    are counted in ``retries`` only.
    """

    puts: int = 0  # single PUTs, multipart creates, part uploads and completes
    gets: int = 0
    heads: int = 0
    deletes: int = 0  # deletes and multipart aborts
    lists: int = 0  # pages (S3) or directory walks (local)
    bytes_written: int = 0
    bytes_read: int = 0
    retries: int = 0


class Listed(NamedTuple):
    """One object as a listing describes it (``CapacityStore.list_entries``):
    enough to tell whether it changed since it was last read, without
    reading it."""

    name: str
    size: int
    etag: str  # the version tag ``read_versioned`` and ``put_conditional`` use
    modified: float  # when it was last written, on the store's clock (Unix seconds)


class CapacityUpload(Protocol):
    """One object being written in pieces (a segment streamed as it is built).

    Calls are sequential: await each ``write`` before the next. Nothing is
    visible under the name until ``complete`` returns.
    """

    async def write(self, data: bytes | memoryview) -> None:
        """Append ``data``. Memory stays bounded: S3 waits for a free upload
        slot when ``concurrency`` parts are already in flight."""
        ...

    async def complete(self) -> int:
        """Make the object visible atomically; return its size."""
        ...

    async def abort(self) -> None:
        """Drop what was written. Idempotent; a no-op after ``complete``."""
        ...


class CapacityStore(Protocol):
    """Immutable named objects in the capacity tier (segments).

    Names are relative paths such as ``segments/00000000000000a1``; see
    ``check_name``. A missing name raises ``CapacityNotFound`` from
    ``get_range``, ``get_tail`` and ``size``; ``delete`` of a missing name
    succeeds.
    """

    stats: CapacityStats

    async def start(self) -> None:
        """Open clients and check the store is usable (S3: the bucket exists)."""
        ...

    async def close(self) -> None: ...

    async def put(self, name: str, data: bytes | memoryview) -> None:
        """Write a whole object atomically: readers see all of it or nothing."""
        ...

    def upload(self, name: str) -> CapacityUpload:
        """Start writing an object in pieces."""
        ...

    async def read_versioned(self, name: str) -> tuple[bytes, str]:
        """A small object whole, and its version tag (S3: the ETag)."""
        ...

    async def read_if_changed(self, name: str, tag: str) -> tuple[bytes, str] | None:
        """As ``read_versioned``, unless the object's version tag is still
        ``tag``: then None, at the cost of a bodiless answer (S3: GET with
        If-None-Match, answered 304 Not Modified). For small objects that
        many nodes read often and that rarely change."""
        ...

    async def put_conditional(self, name: str, data: bytes, expect: str | None) -> str:
        """Write ``name`` only if it does not exist (``expect`` None) or its
        version tag is still ``expect``; return the new tag. Otherwise
        raise ``CapacityConflict``: compare-and-swap, for coordination
        through the store (S3 conditional writes)."""
        ...

    async def delete_conditional(self, name: str, expect: str) -> None:
        """Remove ``name`` only if its version tag is still ``expect``; a
        missing name is not an error. Otherwise raise ``CapacityConflict``:
        a record another process wrote again meanwhile is never removed
        (S3 conditional deletes, ``If-Match``)."""
        ...

    async def get_range(self, name: str, start: int, end: int) -> bytes:
        """Exactly the bytes ``[start, end)``. An empty range returns ``b""``
        without a request (so without checking that the name exists); a range
        past the end of the object raises ``CapacityError``."""
        ...

    async def get_range_into(self, name: str, start: int, end: int, into: Into) -> None:
        """The bytes ``[start, end)`` put into ``into`` in order, each byte
        once, as the store delivers them (a reader can send the first ones
        on before the last have come); returns once all have landed. Errors
        as ``get_range``'s; a failure after some bytes landed raises the same
        way (``into`` keeps what it got)."""
        ...

    async def get_tail(self, name: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes (the whole object if it is smaller) and
        the object's total size: a segment footer in one request."""
        ...

    async def size(self, name: str) -> int: ...

    async def delete(self, name: str) -> None:
        """Remove the object; a missing name is not an error."""
        ...

    async def abort_incomplete(self) -> int:
        """Remove writes a crashed process started and never completed
        (temp files, multipart uploads) under this store's root or prefix;
        return how many. Called at start-up, when this node has none in
        flight: the store must have one writer."""
        ...

    def describe(self) -> str:
        """Where the store is, for logs and messages (never credentials)."""
        ...

    def list(self, prefix: str = "", after: str = "") -> AsyncIterator[tuple[str, int]]:
        """``(name, size)`` of every object whose name starts with ``prefix``
        (and, if given, sorts after the name ``after``), in ascending name
        order (code point order, which is S3's UTF-8 byte order), fetched
        lazily."""
        ...

    def list_entries(self, prefix: str = "") -> AsyncIterator[Listed]:
        """As ``list``, with each object's version tag and the time of its
        last write: for small records (the node registry) that a reader
        reads again only when they changed. S3 sends both with each page of
        ListObjectsV2; the local store hashes each file for its tag, so it
        suits prefixes of small objects."""
        ...


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe relative object name, else raise ValueError.

    A name is one or more ``/``-separated components; none may be empty,
    ``.`` or ``..``, start with the temp-file prefix, or contain NUL or a
    backslash. Such a name can neither leave a directory root nor be spelled
    two ways (``a//b``, ``a/./b``), so local and S3 stores agree on it.
    """
    if not isinstance(name, str):
        raise TypeError(f"capacity object name must be a string, got {name!r}")
    if not name:
        raise ValueError("capacity object name must not be empty")
    if "\x00" in name or "\\" in name:
        raise ValueError(f"capacity object name {name!r} contains NUL or a backslash")
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(
                f"capacity object name {name!r} has an empty, '.' or '..' path component"
            )
        if part.startswith(TMP_PREFIX):
            raise ValueError(
                f"capacity object name {name!r} uses the reserved prefix {TMP_PREFIX!r}"
            )
    return name


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it may filter a listing, else raise ValueError.

    A prefix is matched as a string, so it cannot escape the store; it is
    only refused when no valid name could start with it."""
    if not isinstance(prefix, str):
        raise TypeError(f"capacity list prefix must be a string, got {prefix!r}")
    if "\x00" in prefix or "\\" in prefix or prefix.startswith("/"):
        raise ValueError(f"capacity list prefix {prefix!r} cannot match any object name")
    return prefix


def check_range(start: int, end: int) -> None:
    if start < 0 or end < start:
        raise ValueError(f"bad byte range [{start}, {end})")
