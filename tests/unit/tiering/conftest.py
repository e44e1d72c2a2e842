"""Fixtures shared by the tiering unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiering.capacity import LocalDirStore
from tiering.node import Node
from tiering.settings import TierSettings


@pytest.fixture
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Node]:
    """A started node over a local capacity directory, with an empty bucket
    ``bkt``; ``node.run`` runs a coroutine on its event loop. A test marked
    ``own_files`` gets every cached piece in a file of its own (no logs)."""
    logs = request.node.get_closest_marker("own_files") is None
    n = Node(tmp_path / "data", TierSettings(flush_delay=3600.0, cache_logs=logs),
             LocalDirStore(tmp_path / "capacity"))
    loop = asyncio.new_event_loop()
    loop.run_until_complete(n.start())
    loop.run_until_complete(n.objects.create_bucket("bkt"))
    n.run = loop.run_until_complete  # type: ignore[attr-defined]
    yield n
    loop.run_until_complete(n.close())
    loop.close()
