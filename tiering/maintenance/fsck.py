"""Consistency check of a data directory: index against hot-tier files.

Run on a directory no gateway has open (the index takes a lock). Tests run
it after every gateway they stop; operators can run ``tierstore check``.
Checks: every piece of every object and part is either a staged file of the
right size or an extent of a segment the index knows; no staged file is
unreferenced (a leak); segment counters match what references them; every
record in the hot tier's cache logs (``tiering/hot/logs.py``) matches its
CRC32 (a cached piece is a copy, so a bad one is a problem of the disk, to
be dropped with ``tierstore evict``, not a lost write).
"""

from __future__ import annotations

import itertools
import os
from collections import defaultdict
from pathlib import Path

from tiering.hot.logs import LOGS, Logs
from tiering.hot.tier import HotTier
from tiering.index.db import Index
from tiering.meta import Chunk


def check(data_dir: Path) -> list[str]:
    """Problems found, as sentences; an empty list means consistent."""
    problems: list[str] = []
    index = Index(data_dir / "index")
    try:
        hot = HotTier(data_dir / "hot", budget=1)
        segments = {info.name: info for info in index.segments()}
        expected: dict[str, tuple[int, str]] = {}
        live: defaultdict[str, int] = defaultdict(int)
        pins: defaultdict[str, int] = defaultdict(int)

        def pieces(owner: str, chunks: tuple[Chunk, ...]) -> None:
            for chunk in chunks:
                if chunk.file_id is not None:
                    expected[chunk.file_id] = (chunk.size, owner)
                elif chunk.extent is None:
                    problems.append(f"{owner}: a piece is neither staged nor flushed")
                elif chunk.extent.segment not in segments:
                    problems.append(f"{owner}: extent in unknown segment {chunk.extent.segment}")
                elif chunk.extent.raw != chunk.size:
                    problems.append(f"{owner}: extent holds {chunk.extent.raw} bytes, piece {chunk.size}")
                else:
                    live[chunk.extent.segment] += chunk.extent.weight

        for meta in itertools.chain(index.iter_objects(), index.iter_versions()):
            owner = f"object {meta.bucket}/{meta.key}" + (f" version {meta.version}" if meta.version else "")
            if sum(c.size for c in meta.chunks) != meta.size:
                problems.append(f"{owner}: chunk sizes do not add up to {meta.size}")
            if meta.part_sizes and sum(meta.part_sizes) != meta.size:
                problems.append(f"{owner}: part sizes do not add up to {meta.size}")
            if index.get_bucket(meta.bucket) is None:
                problems.append(f"{owner}: bucket does not exist")
            if meta.manifest is not None:
                pins[meta.manifest] += 1
                if meta.manifest not in segments:
                    problems.append(f"{owner}: manifest in unknown segment {meta.manifest}")
            pieces(owner, meta.chunks)
        uploads = {u.upload_id for u in index.iter_uploads()}
        for part in index.iter_parts():
            pieces(f"part {part.part_number}", part.chunks)
        for raw_key, _ in index._scan(b"P", b"P"):
            upload_id = raw_key[1:].split(b"\x00", 1)[0].decode()
            if upload_id not in uploads:
                problems.append(f"part record of unknown upload {upload_id}")
        for name, info in segments.items():
            if info.live != live[name]:
                problems.append(f"segment {name}: index counts {info.live} live bytes, objects use {live[name]}")
            if info.pins < pins[name]:
                problems.append(f"segment {name}: {info.pins} pins, but {pins[name]} manifests point at it")
        present: dict[str, int] = {}
        for sub in sorted(p for p in hot.root.iterdir() if p.is_dir() and p != hot.cache_root):
            for entry in os.scandir(sub):
                present[entry.name] = entry.stat().st_size
        for file_id, (size, owner) in expected.items():
            if file_id not in present:
                problems.append(f"{owner}: file {file_id} is missing")
            elif present[file_id] != size:
                problems.append(f"{owner}: file {file_id} has {present[file_id]} bytes, index says {size}")
        for file_id in present.keys() - expected.keys():
            problems.append(f"file {file_id} is referenced by nothing")
        if (hot.cache_root / LOGS).is_dir():
            problems += Logs(hot.cache_root / LOGS, 0).verify()
    finally:
        index.close()
    return problems
