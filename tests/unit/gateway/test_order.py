"""The documented shuffle and shard patterns: reproducible, bounded; key
lists literal unless asked otherwise."""

from __future__ import annotations

import hashlib
import re
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.client.order import (
    MAX_DEPTH,
    MAX_KEYS,
    MAX_PATTERN,
    PatternError,
    count,
    expand,
    expand_all,
    expansions,
    shuffled,
)
from tiering.prefetch import epochs
from tiering.prefetch.epoch import MAX_ATTEMPTS, Entry, Epoch


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
    with pytest.raises(PatternError):
        expand("x-{5..1}")
    with pytest.raises(PatternError):  # refused before anything is built
        expand(f"{{0..{MAX_KEYS}}}-{{0..{MAX_KEYS}}}")


def test_key_lists_strip_their_bucket_and_keep_or_drop_repeats_when_asked() -> None:
    named = ["s3://b/a", "a", "c-{1..2}"]
    assert expand_all(named, "b", patterns=True, urls=True) == ["a", "c-1", "c-2"]
    assert expand_all(named, "b", unique=False, patterns=True, urls=True) == ["a", "a", "c-1", "c-2"]
    with pytest.raises(PatternError):
        expand_all(["s3://other/a"], "b", urls=True)


def test_a_key_is_a_key_by_default() -> None:
    named = ["s3://resnet50/train/img_0000.npz", "a{1,2}.bin", "x/../y", " padded ", "s3://other/k", "{0..3}"]
    assert expand_all(named, "resnet50") == named
    assert expand_all(named + named, "resnet50", unique=False) == named + named
    assert expand_all(["s3://resnet50/train/img_0000.npz"], "resnet50", urls=True) == ["train/img_0000.npz"]
    assert expand_all(["a{1,2}.bin"], "b", patterns=True) == ["a1.bin", "a2.bin"]
    assert expand_all(["s3://b/a{1,2}.bin"], "b", urls=True) == ["a{1,2}.bin"], "a URL's key is literal too"


# The expansion before the grammar (tiering/order.py until the parser): the
# reference for patterns without a brace inside a brace.
_OLD_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_OLD_CHOICE = re.compile(r"\{([^{}]*,[^{}]*)\}")


def _old_expand(pattern: str) -> list[str]:
    found = [m for m in (_OLD_RANGE.search(pattern), _OLD_CHOICE.search(pattern)) if m is not None]
    if not found:
        return [pattern]
    match = min(found, key=lambda m: m.start())
    head, tail = pattern[:match.start()], pattern[match.end():]
    if match.re is _OLD_RANGE:
        first, last = match[1], match[2]
        options = [f"{n:0{len(first)}d}" for n in range(int(first), int(last) + 1)]
    else:
        options = match[1].split(",")
    return [k for option in options for k in _old_expand(head + option + tail)]


def _flat(pattern: str) -> bool:
    """No "{" while another is open: the patterns the old expansion read right."""
    open_ = False
    for ch in pattern:
        if ch == "{":
            if open_:
                return False
            open_ = True
        elif ch == "}":
            open_ = False
    return True


_PIECES = st.sampled_from(["a", "b", ",", "{", "}", ".", "0", "1", "..", "-", "{0..2}", "{a,b}", "{,x}"])


@given(st.lists(_PIECES, max_size=10).map("".join).filter(_flat))
def test_the_old_expansions_are_unchanged_for_patterns_without_nesting(pattern: str) -> None:
    try:
        old: list[str] | None = _old_expand(pattern)
    except ValueError:
        old = None
    if old is None or re.search(r"\{(\d+)\.\.(\d+)\}", pattern) and any(
        int(a) > int(b) for a, b in re.findall(r"\{(\d+)\.\.(\d+)\}", pattern)
    ):
        return  # an empty range: refused by both
    assert expand(pattern) == old
    assert count(pattern) == len(old)


def test_choices_hold_ranges_and_choices_of_their_own() -> None:
    assert expand("{a,{1..3}}x") == ["ax", "1x", "2x", "3x"]
    assert expand("{a,{b,{c,d}}e}") == ["a", "be", "ce", "de"]
    assert expand("s-{{00..01},x{y,z}}.tar") == ["s-00.tar", "s-01.tar", "s-xy.tar", "s-xz.tar"]
    assert expand("{a{b}c,d}") == ["a{b}c", "d"], "a brace that is neither is text, inside a choice too"
    assert expand("{x{a,b}}") == ["{xa}", "{xb}"]
    assert expand("{{a,b}") == ["{a", "{b"] and expand("{a,b}}") == ["a}", "b}"]
    assert expand("{a}") == ["{a}"] and expand("{}") == ["{}"] and expand("{1..2") == ["{1..2"]
    assert count("{a,{1..3}}x{0..9}") == 40


def test_chains_of_ranges_vary_the_leftmost_slowest() -> None:
    keys = expand("{0..1}{00..02}-{8..10}")
    assert keys[:4] == ["000-8", "000-9", "000-10", "001-8"]
    assert keys == [f"{a}{b:02d}-{c}" for a in range(2) for b in range(3) for c in range(8, 11)]
    assert count("{0..9}{0..9}{0..9}{0..9}") == 10_000


def test_a_range_made_by_a_choice_is_text() -> None:
    """``x{{0,0}..6000000}`` once counted as 2 and expanded to six million
    keys (the choice's options re-read as a range). By the grammar it names
    two keys, the same text twice."""
    assert count("x{{0,0}..6000000}") == 2
    assert expand("x{{0,0}..6000000}") == ["x{0..6000000}", "x{0..6000000}"]


def test_a_huge_count_is_refused_before_anything_is_built() -> None:
    huge = [
        "x{{0..999},{0..999}}{{0..999999},{1..9}}{0..99}",
        f"{{0..{10 ** 900}}}",
        "".join("{0..9}" for _ in range(150)),
        "{" + ",".join(["{0..99999}"] * 90) + "}{a,b}",
    ]
    tracemalloc.start()
    try:
        for pattern in huge:
            assert len(pattern) <= MAX_PATTERN
            assert count(pattern) > MAX_KEYS
            with pytest.raises(PatternError):
                expansions(pattern)
            with pytest.raises(PatternError):
                expand_all([pattern], "b", patterns=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, f"refused in {peak} bytes"


def test_many_patterns_are_bounded_together() -> None:
    half = f"{{1..{MAX_KEYS // 2 + 1}}}"
    with pytest.raises(PatternError, match="At most"):
        expand_all(["a" + half, "b" + half], "b", patterns=True)


def test_a_pattern_is_bounded_in_length_and_depth() -> None:
    with pytest.raises(PatternError, match="characters"):
        expand("a" * (MAX_PATTERN + 1))
    assert expand_all(["a" * (MAX_PATTERN + 1)], "b") == ["a" * (MAX_PATTERN + 1)], "a literal key is not"
    deep = "{a," * MAX_DEPTH + "b" + "}" * MAX_DEPTH
    assert len(expand(deep)) == MAX_DEPTH + 1
    with pytest.raises(PatternError, match="nest"):
        expand("{a," + deep + "}")


def test_expansion_is_lazy() -> None:
    keys = expansions(f"k{{0..{MAX_KEYS - 1}}}")
    assert [next(keys) for _ in range(3)] == ["k0", "k1", "k2"]


def test_a_failed_prefetch_backs_off_then_gives_up_and_a_missing_key_is_an_answer() -> None:
    epoch = Epoch(id="e", bucket="b", entries=[Entry(k) for k in ["a", "b", "a", "c"]], readers=1,
                  lookahead_bytes=1, lookahead_objects=4, idle_timeout=1)
    epoch.mark_missing("a")
    assert [e.missing for e in epoch.entries] == [True, False, True, False]
    assert epoch.view()["missing"] == 1 and epoch.view()["missing_keys"] == ["a"]
    assert epoch.view()["missing_objects"] == 2
    for attempt in range(1, MAX_ATTEMPTS + 1):
        assert not epoch.held("b", 1000.0 * attempt)
        assert epoch.count_failure("b", 1000.0 * attempt) == (attempt == MAX_ATTEMPTS)
        assert epoch.held("b", 1000.0 * attempt + 0.5), "backing off"
    assert epoch.held("b", 1e9), "failed for the epoch"
    assert (epoch.view()["failed"], epoch.view()["failed_keys"]) == (1, ["b"])


def test_the_client_and_the_server_bound_an_epoch_alike() -> None:
    """The client's pattern expansion and the server's epochs refuse past the same count."""
    assert MAX_KEYS == epochs.MAX_KEYS
