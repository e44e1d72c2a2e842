"""The tiers against a model: random writes, deletes, metadata rewrites,
multipart uploads, flushes, compactions, evictions, clean restarts and
crashes, with a local directory as capacity store and tiny sizes so that
every path (packed and own segments, split objects, compaction, merging)
runs in a few kilobytes. After every step each key reads back as the model
says; at the end the data directory is consistent and a rebuild from the
capacity store alone gives the same namespace."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tiering.capacity import LocalDirStore
from tiering.errors import NoSuchKey
from tiering.index.db import Index
from tiering.maintenance import fsck
from tiering.maintenance.recover import recover
from tiering.model.inputs import Integrity, NewObject
from tiering.model.uploads import ChosenPart
from tiering.node import Node
from tiering.settings import TierSettings

SETTINGS = TierSettings(
    hot_size=1 << 20,
    small_object_size=2048,  # above this, an object gets a segment of its own
    part_size=1024,  # and is split into extents of 1 KiB
    segment_size=8192,
    flush_delay=3600.0,  # the machine decides when to flush
    compact_interval=3600.0,
)
KEYS = st.sampled_from([f"k{i}" for i in range(6)] + ["dir/a", "dir/b"])
SIZES = st.sampled_from([0, 1, 100, 1024, 1025, 3000, 5000])


def body_of(key: str, size: int, version: int) -> bytes:
    seed = hashlib.sha256(f"{key}/{version}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


async def stream(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 700):
        yield data[i : i + 700]


class TiersMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="tiers-model-"))
        self.loop = asyncio.new_event_loop()
        self.model: dict[str, tuple[bytes, dict[str, str]]] = {}
        self.version = 0
        self.service = self._open()
        self.run(self.service.objects.create_bucket("bkt"))

    def _open(self, data: str = "data") -> Node:
        service = Node(self.root / data, SETTINGS, LocalDirStore(self.root / "capacity"))
        self.run(service.start())
        return service

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    # -- writes --------------------------------------------------------------

    @rule(key=KEYS, size=SIZES)
    def put(self, key: str, size: int) -> None:
        self.version += 1
        data = body_of(key, size, self.version)
        meta = {"v": str(self.version)}
        self.run(self.service.objects.put("bkt", key, stream(data), NewObject(user_meta=meta),
                                  Integrity(expected_size=size)))
        self.model[key] = (data, meta)

    @rule(key=KEYS)
    def delete(self, key: str) -> None:
        self.run(self.service.objects.delete("bkt", key))
        self.model.pop(key, None)

    @rule(key=KEYS)
    def rewrite_metadata(self, key: str) -> None:
        if key not in self.model:
            return
        source = self.run(self.service.objects.head("bkt", key))
        self.version += 1
        meta = {"v": str(self.version)}
        self.run(self.service.objects.rewrite_meta(source, NewObject(user_meta=meta)))
        self.model[key] = (self.model[key][0], meta)

    @rule(key=KEYS, sizes=st.lists(st.sampled_from([1, 1500, 2500]), min_size=1, max_size=3),
          flush_between=st.booleans())
    def multipart(self, key: str, sizes: list[int], flush_between: bool) -> None:
        mp = self.service.objects
        upload = self.run(mp.create_upload("bkt", key, NewObject()))
        chosen, parts = [], []
        for number, size in enumerate(sizes, 1):
            self.version += 1
            data = body_of(key, size, self.version)
            part = self.run(mp.upload_part("bkt", key, upload.upload_id, number, stream(data),
                                           Integrity(expected_size=size)))
            chosen.append(ChosenPart(number, part.etag))
            parts.append(data)
            if flush_between:
                self.run(self.service.tiers.flush())
        # Every part but the last must be 5 MiB or more, far above these
        # sizes: complete with the last part, and the others are dropped
        # (flushed ones included).
        chosen, parts = chosen[-1:], parts[-1:]
        self.run(mp.complete_upload("bkt", key, upload.upload_id, chosen))
        self.model[key] = (b"".join(parts), {})

    # -- tiering -------------------------------------------------------------

    @rule()
    def flush(self) -> None:
        self.run(self.service.tiers.flush())

    @rule(threshold=st.sampled_from([0.5, 0.99]))
    def compact(self, threshold: float) -> None:
        self.run(self.service.tiers.compact(threshold))

    @rule()
    def evict(self) -> None:
        self.run(self.service.tiers.residency.evict())

    @rule()
    def restart(self) -> None:
        self.run(self.service.close())
        self.service = self._open()

    @rule()
    def crash(self) -> None:
        self.run(self.service.tiers.stop())
        self.service.index.close()  # no clean-shutdown marker
        self.service = self._open()

    # -- checks --------------------------------------------------------------

    @invariant()
    def reads_match_the_model(self) -> None:
        for key in ["k0", "k1", "k2", "k3", "k4", "k5", "dir/a", "dir/b"]:
            if key in self.model:
                data, meta = self.model[key]
                got = self.run(self.service.objects.head("bkt", key))
                assert self.run(self.service.objects.read_all(got)) == data, key
                assert got.user_meta == meta, key
            else:
                try:
                    self.run(self.service.objects.head("bkt", key))
                except NoSuchKey:
                    continue
                raise AssertionError(f"{key} should not exist")

    def teardown(self) -> None:
        try:
            self.run(self.service.tiers.flush())
            self.run(self.service.close())
            problems = fsck.check(self.root / "data")
            assert not problems, problems
            # The capacity store alone rebuilds the same namespace.
            shutil.rmtree(self.root / "data")
            store = LocalDirStore(self.root / "capacity")
            index = Index(self.root / "rebuilt" / "index")
            try:
                report = self.run(recover(store, index))
            finally:
                index.close()
            assert report.incomplete == 0, report  # nothing the model holds was lost
            rebuilt = self._open("rebuilt")
            try:
                listed = self.run(rebuilt.objects.list("bkt", max_keys=100))
                assert sorted(e.key for e in listed.contents) == sorted(self.model)
                for key, (data, meta) in self.model.items():
                    got = self.run(rebuilt.objects.head("bkt", key))
                    assert self.run(rebuilt.objects.read_all(got)) == data, key
                    assert got.user_meta == meta, key
            finally:
                self.run(rebuilt.close())
            assert fsck.check(self.root / "rebuilt") == []
        finally:
            self.loop.close()
            shutil.rmtree(self.root, ignore_errors=True)


# 10 runs of 25 steps; TIERSTORE_MODEL_EXAMPLES=200 in scripts/release-check.
EXAMPLES = int(os.environ.get("TIERSTORE_MODEL_EXAMPLES", "10"))
TiersMachine.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=25, deadline=None)
test_tiers_against_model = TiersMachine.TestCase
