"""The owners of a mounted batch's members, and gathering them in runs
(``tiering/batch/gathered.py`` drives it; ``Gather`` there is what this
answers).

A member is worth gathering when another node owns it and this node knows
it now (its record in memory and current, ``Mounts.known_now``) as a small
object (``SMALL_READ`` at most, what a GET holds whole too): then its owner can be asked for it by key and ETag in
a batch, and what comes back is checked against the size known here. Runs
hold up to ``RUN_OBJECTS`` members or ``RUN_BYTES`` bytes of one owner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tiering.meta import ObjectMeta
from tiering.mounts.owners import MountOwners, PeerRefused
from tiering.reads.plan import SMALL_READ

if TYPE_CHECKING:
    from tiering.mounts.buckets import Mounts

RUN_OBJECTS = 64
# A run's answer is received into one buffer: under glibc's mmap threshold
# (1 MiB, gateway/serving/process.py) it reuses freed memory; over it, every answer
# is a new mapping the kernel zeroes page by page, which cost the reading
# node a fifth of a gathered batch's CPU with runs of 4 MiB.
RUN_BYTES = 960 * 1024


@dataclass(slots=True)
class PeerRun:
    """Members of one batch that ``node`` keeps."""

    node: str
    positions: list[int] = field(default_factory=list)
    metas: list[ObjectMeta] = field(default_factory=list)
    size: int = 0


class MountGather:
    """``Gather`` for the mounted buckets of a node with peers."""

    def __init__(self, mounts: Mounts, owners: MountOwners) -> None:
        self._mounts = mounts
        self._owners = owners

    def runs(self, bucket: str, keys: Sequence[str], start: int, end: int) -> dict[int, PeerRun]:
        runs: dict[int, PeerRun] = {}
        open_runs: dict[str, PeerRun] = {}
        for position in range(start, end):
            key = keys[position]
            node = self._owners.of(bucket, key)
            if node is None:
                continue
            meta = self._mounts.known_now(bucket, key)
            if meta is None or meta.size > SMALL_READ:
                continue
            run = open_runs.get(node)
            if run is None or len(run.positions) >= RUN_OBJECTS or run.size + meta.size > RUN_BYTES:
                run = open_runs[node] = PeerRun(node)
            run.positions.append(position)
            run.metas.append(meta)
            run.size += meta.size
            runs[position] = run
        return runs

    async def fetch(self, bucket: str, run: PeerRun) -> list[bytes | memoryview | None]:  # type: ignore[override]
        try:
            found = await self._owners.batch(run.node, bucket, [(m.key, m.etag) for m in run.metas])
        except PeerRefused:
            return [None] * len(run.metas)
        out: list[bytes | memoryview | None] = []
        for meta in run.metas:
            body = found.get(meta.key)
            out.append(body if isinstance(body, memoryview) and len(body) == meta.size else None)
        return out
