"""One read of one object: what the gateway asks, and what tiering answers.

The gateway asks once per GET or HEAD with a :class:`Read` (bucket, key,
the range or part asked for, the request's conditions) and gets a
:class:`ReadPlan` back: the object's metadata, the status (200, 206, 304 or
412), the bytes the answer covers and the body, already counted by the tier
it came from. Conditions are decided from the metadata alone, before any
byte of the object is read, so a 304 or 412 costs an index lookup and
nothing else.

Both kinds of bucket (managed, mounted) and a read worker build their plans
with :func:`decide`, so they agree on every status and range.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from packer.ranges import ByteRange
from tiering.errors import InvalidRange, NotModified, PreconditionFailed
from tiering.meta import ObjectMeta
from tiering.model.conditions import Conditions, check

# A hot body up to this size is read in the same thread-pool call as the
# metadata and answered in one piece; larger bodies are streamed.
SMALL_READ = 1024 * 1024
# A hot body up to this size whose record is in the record cache is read on
# the event loop when the page cache holds it (``HotTier.read_now``): at
# most tens of microseconds, less than the trip to the pool and back.
NOW_READ = 256 * 1024


class Region:
    """``count`` bytes of the open file ``fd`` from ``offset``: a block of a
    streamed body that the server sends from the file (``sendfile``),
    without reading it into memory. Only in a body asked for with
    ``Read.blocks``; ``len()`` is its length, as a block of bytes's is. The
    consumer sends a region before it asks the body for the next block: the
    descriptor is the body's, closed once the body moves on.

    ``sent`` is the server's: what to await until it has sent the region
    (or failed to)."""

    __slots__ = ("fd", "offset", "count", "sent")

    def __init__(self, fd: int, offset: int, count: int) -> None:
        self.fd = fd
        self.offset = offset
        self.count = count
        self.sent: Awaitable[None] | None = None

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"Region(fd={self.fd}, offset={self.offset}, count={self.count})"


# A block of a body: bytes, or with ``Read.blocks``, a file region or a view
# of an extent's buffer (sent before the body moves on).
Block = bytes | memoryview | Region

Body = bytes | bytearray | AsyncIterator[bytes] | AsyncIterator[Block]


@dataclass(frozen=True, slots=True)
class RangeSpec:
    """A single ``bytes=`` range as sent, not yet held against a size.

    ``first`` None is a suffix range (the last ``last`` bytes); ``last``
    None runs to the end. ``text`` is the header, for the error."""

    first: int | None
    last: int | None
    text: str

    def resolve(self, size: int) -> ByteRange | None:
        """The half-open range within an object of ``size`` bytes; None when
        the range is to be ignored (RFC 9110 lets a server ignore an invalid
        one, as S3 does); InvalidRange (416) when it starts past the end."""
        if self.first is None:  # suffix: the last N bytes
            assert self.last is not None
            if self.last == 0 or size == 0:
                raise self._unsatisfiable(size)
            return ByteRange(max(0, size - self.last), size)
        if self.last is not None and self.last < self.first:
            return None
        if self.first >= size:
            raise self._unsatisfiable(size)
        return ByteRange(self.first, size if self.last is None else min(self.last + 1, size))

    def _unsatisfiable(self, size: int) -> InvalidRange:
        return InvalidRange(
            "The requested range is not satisfiable", RangeRequested=self.text.strip(), ActualObjectSize=size
        )


@dataclass(frozen=True, slots=True)
class Read:
    """A GET (``body``) or HEAD of one object."""

    bucket: str
    key: str
    range: RangeSpec | None = None
    part_number: int | None = None  # GetObject ?partNumber= (1..10000, checked at the edge)
    conditions: Conditions = field(default_factory=Conditions)
    body: bool = True
    # Another gateway asking (``tiering.cluster.peers``: FETCH or HOT): it
    # does not move epoch readers and is never passed on to a third node.
    peer: str | None = None
    # ?versionId= (checked at the edge: "null" or a well-formed id); None
    # reads the current version.
    version: str | None = None
    # The server takes a streamed body's blocks as ``Region`` (a hot piece
    # sent from its file) and as views of a buffer (an extent arriving);
    # else every block is bytes.
    blocks: bool = False


@dataclass(slots=True)
class ReadTally:
    """Bytes a read produced, by the tier they came from: the hot tier
    (staged files and cached extents), another node's hot tier (``peer``:
    the node that keeps them, ``tiering/cluster/``) or the capacity side
    (the capacity store or a mount's source). A streamed body counts as it
    is produced."""

    hot: int = 0
    capacity: int = 0
    peer: int = 0


@dataclass(slots=True)
class ReadPlan:
    """The answer to a :class:`Read`."""

    meta: ObjectMeta
    status: int  # 200, 206, 304 or 412
    wanted: ByteRange  # the bytes a 200 or 206 sends
    body: Body | None = None  # None for HEAD, 304 and 412
    tally: ReadTally = field(default_factory=ReadTally)
    condition: str | None = None  # the condition that failed (304, 412)
    parts_count: int | None = None  # set when a part was asked for

    @property
    def partial(self) -> bool:
        return self.status == 206


# Where a piece's bytes are in the hot tier: (path, offset, size).
Place = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class Location:
    """Where a read worker finds an object's bytes (``ObjectService.locate_many``):
    its encoded record and the hot-tier files that hold all of them, in
    order, as (path, offset, size) (the offset is 0 but in a log of small
    pieces: ``tiering/hot/logs.py``); no record when some bytes are not hot or the
    bucket is mounted (the writer serves those itself); or the S3 error
    of a missing bucket or key. A worker may keep a hot answer until a
    write of the key (``tiering/index/generations.py``), and a mounted object's
    no later than ``until_ms`` (when its validation expires)."""

    record: bytes | None = None
    files: tuple[Place, ...] = ()
    missing: str | None = None  # "NoSuchBucket" or "NoSuchKey"
    until_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """What the metadata alone decides about a read."""

    status: int
    wanted: ByteRange
    condition: str | None = None

    @property
    def sends_body(self) -> bool:
        return self.status in (200, 206)


def decide(meta: ObjectMeta, read: Read) -> Decision:
    """Status and range of ``read`` against ``meta``: the conditions first
    (RFC 9110 section 13.2.2: they are evaluated before Range), then the
    part or the range."""
    whole = ByteRange(0, meta.size)
    try:
        check(meta, read.conditions)
    except NotModified as exc:
        return Decision(304, whole, str(exc.detail.get("Condition")))
    except PreconditionFailed as exc:
        return Decision(412, whole, str(exc.detail.get("Condition")))
    if read.part_number is not None:
        return Decision(206, part_range(meta, read.part_number))
    wanted = read.range.resolve(meta.size) if read.range is not None else None
    return Decision(200, whole) if wanted is None else Decision(206, wanted)


def part_range(meta: ObjectMeta, part_number: int) -> ByteRange:
    """The byte range of part ``part_number`` (GetObject ?partNumber=)."""
    sizes = meta.part_sizes or (meta.size,)
    if not 1 <= part_number <= len(sizes):
        raise InvalidRange("The requested partnumber is not satisfiable", ActualObjectSize=meta.size)
    start = sum(sizes[: part_number - 1])
    return ByteRange(start, start + sizes[part_number - 1])


def plan(meta: ObjectMeta, read: Read, decision: Decision, body: Body | None = None,
         tally: ReadTally | None = None) -> ReadPlan:
    """The plan of a decided read (``body`` only where one is sent)."""
    return ReadPlan(
        meta=meta,
        status=decision.status,
        wanted=decision.wanted,
        body=body if read.body and decision.sends_body else None,
        tally=tally if tally is not None else ReadTally(),
        condition=decision.condition,
        parts_count=(len(meta.part_sizes) or 1) if read.part_number is not None else None,
    )


def plan_from_memory(
    meta: ObjectMeta, read: Read, read_now: Callable[[ObjectMeta], bytes | bytearray | None]
) -> ReadPlan | None:
    """The plan of ``read`` of ``meta`` (a record from memory) when it needs
    no byte of the object, or the object is small and ``read_now`` has all
    of it in memory; None otherwise. The ``plan_now`` of both backends."""
    decision = decide(meta, read)
    if not (read.body and decision.sends_body):
        return plan(meta, read, decision)
    if meta.size > NOW_READ:
        return None
    data = read_now(meta)
    return hot_plan(meta, read, decision, data) if data is not None else None


def hot_plan(meta: ObjectMeta, read: Read, decision: Decision, data: bytes | bytearray) -> ReadPlan:
    """The plan of a decided read whose whole object is ``data``, read from
    the hot tier (counted there)."""
    wanted = decision.wanted
    body = data if wanted.length == len(data) else data[wanted.start : wanted.end]
    return plan(meta, read, decision, body, ReadTally(hot=wanted.length))
