"""The documented shuffle and shard patterns: reproducible, bounded."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiering.errors import InvalidArgument
from tiering.prefetch.order import MAX_KEYS, expand, expand_all, shuffled


def test_the_shuffle_is_the_documented_digest_order() -> None:
    keys = [f"train/{i:05d}.jpg" for i in range(1000)]
    order = shuffled(keys, 7)
    assert sorted(order) == keys and order != keys
    digest = [hashlib.blake2b(f"7:{k}".encode(), digest_size=8).digest() for k in order]
    assert digest == sorted(digest), "keys ordered by BLAKE2b-64 of '<seed>:<key>'"
    assert shuffled(reversed(keys), 7) == order, "the order does not depend on the listing order"
    assert shuffled(keys, 8) != order


@given(st.lists(st.text(min_size=1, max_size=20), unique=True, max_size=50), st.integers())
def test_a_shuffle_is_a_permutation(keys: list[str], seed: int) -> None:
    assert sorted(shuffled(keys, seed)) == sorted(keys)


def test_shard_patterns_expand_like_webdataset() -> None:
    assert expand("train-{000..003}.tar") == [f"train-{i:03d}.tar" for i in range(4)]
    assert expand("{a,b}/x-{8..10}") == ["a/x-8", "a/x-9", "a/x-10", "b/x-8", "b/x-9", "b/x-10"]
    assert expand("plain.tar") == ["plain.tar"]
    with pytest.raises(InvalidArgument):
        expand("x-{5..1}")
    with pytest.raises(InvalidArgument):  # refused before anything is built
        expand(f"{{0..{MAX_KEYS}}}-{{0..{MAX_KEYS}}}")


def test_key_lists_strip_their_bucket_and_keep_or_drop_repeats() -> None:
    named = ["s3://b/a", "a", "c-{1..2}"]
    assert expand_all(named, "b") == ["a", "c-1", "c-2"]
    assert expand_all(named, "b", unique=False) == ["a", "a", "c-1", "c-2"]
    with pytest.raises(InvalidArgument):
        expand_all(["s3://other/a"], "b")
