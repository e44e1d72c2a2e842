"""What admin routes share: the configuration and the gateway's node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gateway.admin.errors import AdminError
from gateway.config.values import Config
from gateway.observability.metrics import Metrics
from tiering.identity.store import Identities
from tiering.node import Node


class MemoryStatus(Protocol):
    """The process's memory and caches (``gateway.serving.memory.MemoryBudget``)."""

    def stats(self) -> dict[str, Any]: ...


class NodeStatus(Protocol):
    """What the admin API reads of the gateway's node (``gateway.node.Node``)."""

    @property
    def started(self) -> bool: ...

    @property
    def tiering(self) -> Node | None: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def memory(self) -> MemoryStatus: ...

    @property
    def identities(self) -> Identities | None:
        """Users, keys and policies (None while the gateway starts or stops)."""


@dataclass(frozen=True, slots=True)
class AdminContext:
    config: Config
    node: NodeStatus

    def tiering(self) -> Node:
        """The tiering node, or 503 while the gateway starts or stops."""
        tiering = self.node.tiering
        if tiering is None:
            raise AdminError("Unavailable", "the gateway is starting or stopping; retry shortly")
        return tiering
