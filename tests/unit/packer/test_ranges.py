from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packer.ranges import ByteRange, split_over


def test_rejects_inverted_and_negative() -> None:
    with pytest.raises(ValueError):
        ByteRange(5, 4)
    with pytest.raises(ValueError):
        ByteRange(-1, 4)


def test_intersect() -> None:
    assert ByteRange(0, 10).intersect(ByteRange(5, 20)) == ByteRange(5, 10)
    assert ByteRange(0, 10).intersect(ByteRange(10, 20)) is None


@given(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=8), data=st.data())
def test_split_over_reassembles_the_range(sizes: list[int], data: st.DataObject) -> None:
    total = sum(sizes)
    start = data.draw(st.integers(0, total))
    end = data.draw(st.integers(start, total))
    blob = bytes(i % 251 for i in range(total))
    pieces, offsets = [], [sum(sizes[:i]) for i in range(len(sizes))]
    for index, piece in split_over(sizes, ByteRange(start, end)):
        base = offsets[index]
        assert 0 <= piece.start < piece.end <= sizes[index]
        pieces.append(blob[base + piece.start : base + piece.end])
    assert b"".join(pieces) == blob[start:end]
