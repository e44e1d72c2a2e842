"""Per-bucket policy: the layout settings a bucket's writes use, and pins.

A bucket may override the node's compression, part size and small-object
threshold (``BucketInfo``); :meth:`Policies.settings` resolves the settings a
write to it uses. A pin (bucket, prefix) keeps what it covers in the hot tier:
cached extents of covered objects are never evicted. Pins are this node's
cache policy, kept in its index and not in the capacity tier's footers (a
node rebuilt by ``recover`` starts with an empty cache anyway).

Both are read on every write and read, so they are cached here; every change
goes through this class, which keeps the cache true.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from tiering.index.db import Index
from tiering.meta import BucketInfo
from tiering.settings import TierSettings


class Policies:
    """Bucket settings and pins for one node (thread-safe reads)."""

    def __init__(self, index: Index, settings: TierSettings) -> None:
        self._index = index
        self._node = settings
        self._settings: dict[str, TierSettings] = {}
        self._pins: dict[str, frozenset[str]] = {}  # bucket -> pinned prefixes
        self._lock = threading.Lock()

    def load(self) -> None:
        """Read the pins from the index (start-up; blocking)."""
        pins: dict[str, set[str]] = {}
        for bucket, prefix in self._index.list_pins():
            pins.setdefault(bucket, set()).add(prefix)
        with self._lock:
            self._pins = {bucket: frozenset(prefixes) for bucket, prefixes in pins.items()}

    # -- layout settings -----------------------------------------------------

    def settings(self, bucket: str) -> TierSettings:
        """The settings writes to ``bucket`` use (the node's where the bucket
        has no override). A point read of the index on first use."""
        cached = self._settings.get(bucket)
        if cached is not None:
            return cached
        info = self._index.get_bucket(bucket)
        resolved = self.resolve(info) if info is not None else self._node
        self._settings[bucket] = resolved
        return resolved

    def resolve(self, info: BucketInfo) -> TierSettings:
        overrides = {
            name: value
            for name in ("compression", "part_size", "small_object_size")
            if (value := getattr(info, name)) is not None
        }
        return replace(self._node, **overrides) if overrides else self._node

    def changed(self, bucket: str) -> None:
        """A bucket was created, changed or deleted: resolve it again."""
        self._settings.pop(bucket, None)
        if self._index.get_bucket(bucket) is None:
            with self._lock:
                self._pins.pop(bucket, None)

    # -- pins ------------------------------------------------------------------

    def pins(self) -> list[tuple[str, str]]:
        return sorted((b, p) for b, prefixes in self._pins.items() for p in prefixes)

    def bucket_pinned(self, bucket: str) -> bool:
        return "" in self._pins.get(bucket, ())

    def pinned(self, bucket: str, key: str) -> bool:
        """True when a pin covers bucket/key (a few prefix tests)."""
        prefixes = self._pins.get(bucket)
        return bool(prefixes) and any(key.startswith(p) for p in prefixes)  # type: ignore[union-attr]

    def add_pin(self, bucket: str, prefix: str) -> bool:
        """Record a pin (blocking: an index write); False if it existed."""
        added = self._index.add_pin(bucket, prefix)
        with self._lock:
            self._pins[bucket] = self._pins.get(bucket, frozenset()) | {prefix}
        return added

    def remove_pin(self, bucket: str, prefix: str) -> bool:
        """Remove a pin (blocking); False if there was none."""
        removed = self._index.remove_pin(bucket, prefix)
        with self._lock:
            left = self._pins.get(bucket, frozenset()) - {prefix}
            if left:
                self._pins[bucket] = left
            else:
                self._pins.pop(bucket, None)
        return removed
