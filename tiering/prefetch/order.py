"""The orders and key sets a trainer names: the documented shuffle of
``(prefix, seed)`` epochs and WebDataset-style shard patterns.

Pure functions, shared by the gateway (warm jobs, epochs) and the client
helper (``gateway/hints.py``), which must compute the same order the
gateway does without talking to it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from tiering.errors import InvalidArgument

MAX_KEYS = 10_000_000  # keys one epoch, warm job or expanded pattern may name


def shuffled(keys: Iterable[str], seed: int) -> list[str]:
    """The documented shuffle of ``(prefix, seed)`` epochs: keys ordered by
    the BLAKE2b-64 digest of ``"<seed>:<key>"`` (ties by key). Any language
    can reproduce it; the client helper does, to read in the same order."""
    prefix = f"{seed}:".encode()
    return sorted(keys, key=lambda k: (hashlib.blake2b(prefix + k.encode(), digest_size=8).digest(), k))


_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_CHOICE = re.compile(r"\{([^{}]*,[^{}]*)\}")


def expand(pattern: str) -> list[str]:
    """WebDataset-style brace expansion: ``{000..099}`` is a zero-padded
    range (width of the first bound), ``{a,b}`` a choice; several braces
    multiply. A key without braces is itself."""
    if _count(pattern) > MAX_KEYS:
        raise InvalidArgument(f"{pattern!r} names more than {MAX_KEYS} keys")
    return _expand(pattern)


def _count(pattern: str) -> int:
    """How many keys ``pattern`` names, without naming them."""
    count = 1
    for first, last in _RANGE.findall(pattern):
        if int(last) < int(first):
            raise InvalidArgument(f"Empty range in {pattern!r}")
        count *= int(last) - int(first) + 1
    for options in _CHOICE.findall(_RANGE.sub("", pattern)):
        count *= len(options.split(","))
    return count


def _expand(pattern: str) -> list[str]:
    """The leftmost brace varies slowest, as in a shell."""
    found = [m for m in (_RANGE.search(pattern), _CHOICE.search(pattern)) if m is not None]
    if not found:
        return [pattern]
    match = min(found, key=lambda m: m.start())
    head, tail = pattern[:match.start()], pattern[match.end():]
    if match.re is _RANGE:
        first, last = match[1], match[2]
        options = [f"{n:0{len(first)}d}" for n in range(int(first), int(last) + 1)]
    else:
        options = match[1].split(",")
    return [k for option in options for k in _expand(head + option + tail)]


def expand_all(keys: Iterable[str], bucket: str, unique: bool = True) -> list[str]:
    """Every key named, patterns expanded, ``s3://bucket/`` stripped, in
    order; ``unique``: without repeats (a warm set), else as named (an
    epoch may read a key twice)."""
    out: list[str] = []
    seen: set[str] = set()
    for item in keys:
        item = item.strip()
        if item.startswith("s3://"):
            named, _, item = item[5:].partition("/")
            if named != bucket:
                raise InvalidArgument(f"{item!r} is in bucket {named!r}, not {bucket!r}")
        for key in expand(item):
            if key and not (unique and key in seen):
                seen.add(key)
                out.append(key)
        if len(out) > MAX_KEYS:
            raise InvalidArgument(f"At most {MAX_KEYS} keys may be named")
    return out
