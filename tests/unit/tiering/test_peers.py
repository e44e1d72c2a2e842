"""Who fetches which segment in a cooperative warm, and how a peer's bytes
are checked (no network)."""

from __future__ import annotations

import os
import zlib
from collections import Counter

from packer import codec
from tiering.cluster.peers import owner, stored_matches
from tiering.meta import Extent


def test_owner_is_stable_balanced_and_moves_little_when_a_node_joins() -> None:
    segments = [f"{i:016x}" for i in range(3000)]
    three = ["n1", "n2", "n3"]
    placed = {s: owner(s, three) for s in segments}
    assert placed == {s: owner(s, list(reversed(three))) for s in segments}  # order of the list does not matter
    counts = Counter(placed.values())
    assert min(counts.values()) > 850  # about 1,000 each
    four = {s: owner(s, [*three, "n4"]) for s in segments}
    moved = [s for s in segments if four[s] != placed[s]]
    assert all(four[s] == "n4" for s in moved)  # only to the new node
    assert 600 < len(moved) < 900  # about a quarter


def _extent(raw: bytes, level: int = 3) -> Extent:
    name, stored = codec.encode(raw, level)
    return Extent("0000000000000001", 16, len(stored), len(raw), name, zlib.crc32(stored))


def test_peer_bytes_are_checked_against_the_stored_form() -> None:
    plain = os.urandom(50_000)  # stored as is
    packed = b"".join(f"row {i}, {i * i % 977}, {i % 13}\n".encode() for i in range(5000))  # stored as zstd
    for raw in (plain, packed):
        ext = _extent(raw)
        assert stored_matches(ext, raw, 3)
        flipped = bytearray(raw)
        flipped[1234] ^= 1
        assert not stored_matches(ext, bytes(flipped), 3)
        assert not stored_matches(ext, raw[:-1], 3)
    assert _extent(packed).codec == codec.ZSTD and _extent(plain).codec == codec.NONE
    # Made again at another level, the frame differs: refused, read from the store.
    assert not stored_matches(_extent(packed, level=3), packed, 19)
