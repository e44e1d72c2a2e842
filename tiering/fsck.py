"""Consistency check of a data directory: index against hot-tier files.

Run on a directory no gateway has open (the index takes a lock). Tests run
it after every gateway they stop; operators can run ``tierstore check``.
"""

from __future__ import annotations

import os
from pathlib import Path

from tiering.hot import HotTier
from tiering.index import Index


def check(data_dir: Path) -> list[str]:
    """Problems found, as sentences; an empty list means consistent."""
    problems: list[str] = []
    index = Index(data_dir / "index")
    try:
        hot = HotTier(data_dir / "hot", budget=1)
        expected: dict[str, tuple[int, str]] = {}
        for meta in index.iter_objects():
            if sum(c.size for c in meta.chunks) != meta.size:
                problems.append(f"{meta.bucket}/{meta.key}: chunk sizes do not add up to {meta.size}")
            if meta.part_sizes and sum(meta.part_sizes) != meta.size:
                problems.append(f"{meta.bucket}/{meta.key}: part sizes do not add up to {meta.size}")
            if index.get_bucket(meta.bucket) is None:
                problems.append(f"{meta.bucket}/{meta.key}: bucket does not exist")
            for chunk in meta.chunks:
                expected[chunk.file_id] = (chunk.size, f"object {meta.bucket}/{meta.key}")
        uploads = {u.upload_id for u in index.iter_uploads()}
        for part in index.iter_parts():
            expected[part.chunk.file_id] = (part.chunk.size, f"part {part.part_number}")
        for raw_key, _ in index._scan(b"P", b"P"):
            upload_id = raw_key[1:].split(b"\x00", 1)[0].decode()
            if upload_id not in uploads:
                problems.append(f"part record of unknown upload {upload_id}")
        present: dict[str, int] = {}
        for sub in sorted(p for p in hot.root.iterdir() if p.is_dir()):
            for entry in os.scandir(sub):
                present[entry.name] = entry.stat().st_size
        for file_id, (size, owner) in expected.items():
            if file_id not in present:
                problems.append(f"{owner}: file {file_id} is missing")
            elif present[file_id] != size:
                problems.append(f"{owner}: file {file_id} has {present[file_id]} bytes, index says {size}")
        for file_id in present.keys() - expected.keys():
            problems.append(f"file {file_id} is referenced by nothing")
    finally:
        index.close()
    return problems
