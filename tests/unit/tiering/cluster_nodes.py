"""Nodes of a cluster over one capacity directory, in one process, for the
cluster tests (``test_cluster.py``, ``test_cluster_terms.py``): rounds are
driven by hand (no timers), so each step is deterministic."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.tiering.test_objects import body
from tiering.capacity import LocalDirStore
from tiering.capacity.layout import SEGMENTS
from tiering.cluster.terms import SEALS
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node
from tiering.settings import TierSettings

TTL = 2.0  # the lease's skew is a quarter of it


def node(root: Path, name: str, **settings: object) -> Node:
    tiers = TierSettings(node_id=name, lease_ttl=TTL, follow_interval=3600.0, follow_fallback=3600.0,
                         flush_delay=3600.0, **settings)
    return Node(root / name, tiers, LocalDirStore(root / "capacity"))


@contextlib.asynccontextmanager
async def running(root: Path, *names: str, **settings: object) -> AsyncIterator[list[Node]]:
    """Nodes started in order (each with ``settings``), closed at the end."""
    services = [node(root, name, **settings) for name in names]
    for svc in services:
        await svc.start()
    try:
        yield services
    finally:
        for svc in services:
            await svc.close()


async def put(svc: Node, bucket: str, key: str, data: bytes) -> None:
    await svc.objects.put(bucket, key, body(data), NewObject(), Integrity(expected_size=len(data)))


async def get(svc: Node, bucket: str, key: str) -> bytes:
    return await svc.objects.read_all(await svc.objects.head(bucket, key))


async def pause(svc: Node) -> None:
    """The node stops renewing (a long GC pause, a partition) but keeps its state."""
    task = svc.tiers.cluster._task
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    svc.tiers.cluster._task = None


async def wait_out_lease() -> None:
    await asyncio.sleep(TTL + TTL / 4 + 0.2)


async def seal(svc: Node, term: int) -> str:
    data, _ = await svc.tiers.capacity.read_versioned(f"{SEALS}{term:08x}")
    return data.decode()


async def segment_names(svc: Node) -> list[str]:
    return [p[len(SEGMENTS):] async for p, _ in svc.tiers.capacity.list(SEGMENTS)]


def term(svc: Node, bucket: str) -> int:
    return svc.tiers.cluster._held[bucket].term
