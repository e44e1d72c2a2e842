"""A cold read of a managed object: decided on the event loop, its small
extent checked there, the pool asked only for what it must do (the local
store's file read)."""

from __future__ import annotations

import asyncio
import collections
import os
from pathlib import Path
from typing import Any

import pytest

from tiering import pool
from tiering.capacity import LocalDirStore
from tiering.errors import NoSuchKey
from tiering.model.conditions import Conditions
from tiering.model.inputs import Integrity, NewObject
from tiering.node import Node
from tiering.reads.plan import Read
from tiering.settings import TierSettings


async def _body(data: bytes):  # type: ignore[no-untyped-def]
    yield data


def _pool_calls(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Every pool call from now on, by the name of what it ran."""
    calls: collections.Counter[str] = collections.Counter()
    run = pool.run

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        target = getattr(fn, "func", fn)
        calls[getattr(target, "__qualname__", repr(target))] += 1
        return await run(fn, *args, **kwargs)

    monkeypatch.setattr(pool, "run", counted)
    return calls


def test_a_cold_small_get_is_decided_and_checked_on_the_loop(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(50_000)  # stored as it is: random bytes do not compress

    def open_node() -> Node:
        return Node(tmp_path / "data", TierSettings(flush_delay=3600.0), LocalDirStore(tmp_path / "capacity"))

    async def go() -> None:
        node = open_node()
        await node.start()
        await node.objects.create_bucket("bkt")
        await node.objects.put("bkt", "k", _body(data), NewObject(), Integrity(expected_size=len(data)))
        await node.tiers.flush()
        await node.tiers.residency.evict("bkt", "")
        await node.close()
        node = open_node()  # restarted: no record in memory either
        await node.start()
        try:
            calls = _pool_calls(monkeypatch)
            answer = await node.objects.read(Read("bkt", "k"))
            assert answer.status == 200 and answer.body == data
            assert answer.tally.capacity == len(data), "a miss"
            assert "ManagedBuckets._plan_sync" not in calls, calls
            assert not any("decode_entry" in name for name in calls), calls
            # Conditions and HEADs are decided on the loop too, as the pool did.
            meta = answer.meta
            unchanged = await node.objects.read(Read("bkt", "k", conditions=Conditions(if_none_match=f'"{meta.etag}"')))
            assert unchanged.status == 304 and unchanged.body is None
            head = await node.objects.read(Read("bkt", "k", body=False))
            assert head.status == 200 and head.body is None and head.meta.size == len(data)
            with pytest.raises(NoSuchKey):
                await node.objects.read(Read("bkt", "missing"))
        finally:
            await node.close()

    asyncio.run(go())
