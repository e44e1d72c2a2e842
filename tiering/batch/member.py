"""One member of a batch, and how a member is read when it is not part of a
hot batch: as a GET reads it, its failure kept as the member's error."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from tiering.errors import TierstoreError
from tiering.meta import ObjectMeta
from tiering.model.names import check_key
from tiering.reads.plan import Body, ReadPlan, ReadTally


@dataclass(slots=True)
class Member:
    """One key of a batch: its metadata and body, or why it has neither."""

    key: str
    meta: ObjectMeta | None = None
    body: Body | None = None
    error: TierstoreError | None = None


# The read of one object of the batch's bucket, as a GET reads it.
ReadOne = Callable[[str], Awaitable[ReadPlan]]


async def planned(key: str, read_one: ReadOne, tally: ReadTally) -> Member:
    """One object read as a GET reads it; a failure becomes the member's error."""
    try:
        check_key(key)
        answer = await read_one(key)
    except TierstoreError as exc:
        return Member(key, error=exc)
    if isinstance(answer.body, bytes):
        tally.hot += answer.tally.hot
        tally.capacity += answer.tally.capacity
        return Member(key, answer.meta, answer.body)
    return Member(key, answer.meta, _counted(answer.body, answer.tally, tally))  # type: ignore[arg-type]


async def _counted(body: AsyncIterator[bytes], mine: ReadTally, total: ReadTally) -> AsyncIterator[bytes]:
    """A streamed body whose tally is added to the batch's as it goes."""
    try:
        async for block in body:
            yield block
    finally:
        total.hot += mine.hot
        total.capacity += mine.capacity
        await close_body(body)


async def close_body(body: object) -> None:
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        await aclose()
