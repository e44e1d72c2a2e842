"""Values derived once from records that never change, kept by identity.

The record cache hands out one decoded record per object version (frozen
dataclasses), so what a hot GET derives from it (a mounted object's
``ObjectMeta``, a response head) can be kept for as long as that record
is the one handed out, and found again by ``id()`` without hashing the
record's fields.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ByIdentity(Generic[K, V]):
    """At most ``size`` derived values, the oldest going first. The record
    is held with its value, so an ``id()`` reused by another object is
    never mistaken for it."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._kept: dict[int, tuple[K, V]] = {}

    def get(self, record: K, derive: Callable[[K], V]) -> V:
        kept = self._kept.get(id(record))
        if kept is not None and kept[0] is record:
            return kept[1]
        value = derive(record)
        if len(self._kept) >= self._size:
            del self._kept[next(iter(self._kept))]
        self._kept[id(record)] = (record, value)
        return value

    def __len__(self) -> int:
        return len(self._kept)
