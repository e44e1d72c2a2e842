"""The orders and key sets a trainer names: the documented shuffle of
``(prefix, seed)`` epochs, and key lists with their two opt-in forms,
WebDataset-style shard patterns and ``s3://bucket/key`` URLs.

A key is a key: a key list names S3 keys literally, whatever characters
they hold (``s3://...``, braces, commas, ``..``). Only a caller that asks
for it gets a pattern expanded (``patterns``) or a URL stripped (``urls``).
A pattern is parsed and its keys counted from its grammar before any is
built, so a pattern that names too many is refused at once, in a few
kilobytes; the keys are then produced one by one.

Pure functions, shared by the gateway (warm jobs, epochs) and the client
helper (``gateway/client/hints.py``), which must compute the same order the
gateway does without talking to it; they live with the client, which
imports nothing of the server, and the gateway's admin API imports them.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


class PatternError(ValueError):
    """A key list or pattern this module refuses: too long, too deep, too many keys, or
    naming another bucket. The gateway answers it as InvalidRequest."""


MAX_KEYS = 10_000_000  # keys one epoch, warm job or expanded pattern may name
MAX_PATTERN = 1024  # characters of one pattern
MAX_DEPTH = 8  # braces nested in one pattern


def shuffled(keys: Iterable[str], seed: int) -> list[str]:
    """The documented shuffle of ``(prefix, seed)`` epochs: keys ordered by
    the BLAKE2b-64 digest of ``"<seed>:<key>"`` (ties by key). Any language
    can reproduce it; the client helper does, to read in the same order."""
    prefix = f"{seed}:".encode()
    return sorted(keys, key=lambda k: (hashlib.blake2b(prefix + k.encode(), digest_size=8).digest(), k))


# -- shard patterns -------------------------------------------------------------
#
# pattern := item*
# item    := brace | text
# brace   := "{" range "}" | "{" choice "}"   (a "{" with its matching "}")
# range   := digits ".." digits                 zero-padded to the first bound's width
# choice  := pattern ("," pattern)+             commas at the brace's own level
#
# A brace that is neither (no matching "}", or content with no comma of its
# own that is not a range) is literal text: its "{" is a character, and
# what follows it is read on as text and braces. A "}" without its "{" is
# a character. Several braces multiply; the leftmost varies slowest, as in
# a shell: "{a,b}{1..2}" is a1, a2, b1, b2.

_RANGE = re.compile(r"([0-9]+)\.\.([0-9]+)")


@dataclass(frozen=True, slots=True)
class _Range:
    first: int
    last: int
    width: int

    def count(self) -> int:
        return self.last - self.first + 1

    def keys(self) -> Iterator[str]:
        width = self.width
        return (f"{n:0{width}d}" for n in range(self.first, self.last + 1))


@dataclass(frozen=True, slots=True)
class _Choice:
    options: tuple[_Seq, ...]

    def count(self) -> int:
        total = 0
        for option in self.options:
            total = _capped(total + option.count())
        return total

    def keys(self) -> Iterator[str]:
        for option in self.options:
            yield from option.keys()


@dataclass(frozen=True, slots=True)
class _Seq:
    items: tuple[str | _Range | _Choice, ...]  # text, merged: no two strings in a row

    def count(self) -> int:
        total = 1
        for item in self.items:
            if not isinstance(item, str):
                total = _capped(total * item.count())
        return total

    def keys(self) -> Iterator[str]:
        """Every combination, the last item varying fastest: an odometer
        over fresh iterators, so no item's keys are ever held as a list."""
        items = self.items
        if not items:
            yield ""
            return
        iters: list[Iterator[str]] = [_keys_of(item) for item in items]
        current = [next(it) for it in iters]  # every item names at least one key
        while True:
            yield "".join(current)
            i = len(items) - 1
            while i >= 0:
                got = next(iters[i], None)
                if got is not None:
                    current[i] = got
                    break
                iters[i] = _keys_of(items[i])
                current[i] = next(iters[i])
                i -= 1
            if i < 0:
                return


def _keys_of(item: str | _Range | _Choice) -> Iterator[str]:
    return iter((item,)) if isinstance(item, str) else item.keys()


def _capped(n: int) -> int:
    """Counts saturate just past MAX_KEYS: enough to refuse, and a product
    of a thousand ranges stays a small number."""
    return min(n, MAX_KEYS + 1)


class _Parser:
    """Recursive descent over one pattern: ``match[i]`` is where the brace
    opened at ``i`` closes (by nesting), ``commas[i]`` the commas of that
    brace's own level. Each character is read once."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.match: dict[int, int] = {}
        self.commas: dict[int, list[int]] = {}
        stack: list[int] = []
        for i, ch in enumerate(text):
            if ch == "{":
                stack.append(i)
                if len(stack) > MAX_DEPTH:
                    raise PatternError(f"Pattern braces nest deeper than {MAX_DEPTH} levels")
                self.commas[i] = []
            elif ch == "}" and stack:
                self.match[stack.pop()] = i
            elif ch == "," and stack:
                self.commas[stack[-1]].append(i)
        # A "{" left open is never inside a closed brace (a "}" closes the
        # innermost open one): its commas are text at the top level.
        for i in stack:
            del self.commas[i]

    def seq(self, start: int, end: int) -> _Seq:
        """The items of ``text[start:end]``."""
        text = self.text
        items: list[str | _Range | _Choice] = []
        run: list[str] = []
        i = start
        while i < end:
            if text[i] == "{" and (close := self.match.get(i)) is not None and close < end:
                brace = self.brace(i, close)
                if brace is not None:
                    if run:
                        items.append("".join(run))
                        run = []
                    items.append(brace)
                    i = close + 1
                    continue
            run.append(text[i])
            i += 1
        if run:
            items.append("".join(run))
        return _Seq(tuple(items))

    def brace(self, open_: int, close: int) -> _Range | _Choice | None:
        commas = [c for c in self.commas.get(open_, ()) if c < close]
        if commas:
            bounds = [open_, *commas, close]
            return _Choice(tuple(self.seq(a + 1, b) for a, b in itertools.pairwise(bounds)))
        found = _RANGE.fullmatch(self.text, open_ + 1, close)
        if found is None:
            return None
        first, last = found[1], found[2]
        if int(last) < int(first):
            raise PatternError(f"Empty range {{{first}..{last}}} in a pattern")
        return _Range(int(first), int(last), len(first))


def parse(pattern: str) -> _Seq:
    """The parsed pattern (PatternError: too long, too deeply nested,
    or an empty range)."""
    if len(pattern) > MAX_PATTERN:
        raise PatternError(f"A pattern has at most {MAX_PATTERN} characters; this one has {len(pattern)}")
    parser = _Parser(pattern)
    return parser.seq(0, len(pattern))


def count(pattern: str) -> int:
    """How many keys ``pattern`` names, from its grammar (more than
    MAX_KEYS reads as MAX_KEYS + 1)."""
    return parse(pattern).count()


def expansions(pattern: str, limit: int = MAX_KEYS) -> Iterator[str]:
    """The keys ``pattern`` names, one by one, once it is known to name at
    most ``limit`` (checked before the first is built)."""
    tree = parse(pattern)
    if tree.count() > limit:
        raise PatternError(f"A pattern names at most {limit} keys; {pattern[:100]!r} names more")
    return tree.keys()


def expand(pattern: str) -> list[str]:
    """WebDataset-style brace expansion: ``{000..099}`` is a zero-padded
    range (width of the first bound), ``{a,b}`` a choice (whose options may
    hold braces of their own); several braces multiply, the leftmost
    varying slowest. A key without braces is itself."""
    return list(expansions(pattern))


def expand_all(
    keys: Iterable[str], bucket: str, unique: bool = True, *, patterns: bool = False, urls: bool = False,
) -> list[str]:
    """Every key named, in order; ``unique``: without repeats (a warm set),
    else as named (an epoch may read a key twice). Each item is a key as it
    is, unless asked: ``urls`` strips ``s3://<bucket>/`` (another bucket is
    refused), ``patterns`` expands shard patterns, each counted before it
    is expanded. Empty items are skipped."""
    out: list[str] = []
    seen: set[str] = set()
    for item in keys:
        if urls and item.startswith("s3://"):
            named, _, item = item[5:].partition("/")
            if named != bucket:
                raise PatternError(f"{item!r} is in bucket {named!r}, not {bucket!r}")
        named_keys: Iterable[str] = (item,)
        if patterns:
            tree = parse(item)
            if len(out) + tree.count() > MAX_KEYS:
                raise PatternError(f"At most {MAX_KEYS} keys may be named; the pattern {item[:100]!r} "
                                      f"names {'more' if tree.count() > MAX_KEYS else tree.count()}")
            named_keys = tree.keys()
        for key in named_keys:
            if key and not (unique and key in seen):
                if unique:
                    seen.add(key)
                out.append(key)
        if len(out) > MAX_KEYS:
            raise PatternError(f"At most {MAX_KEYS} keys may be named")
    return out
