"""What the process keeps in memory for speed: every cache bounded in
bytes, the one registry of them, and values derived once from records.

A cache that grows with traffic (decoded records, response heads,
authorisation decisions, ...) is a :class:`Kept`: a dict whose entries are
weighed when stored (:func:`weigh`, an estimate of the bytes the entry
keeps alive) and dropped oldest first once their sum passes the cache's
bound. Each cache has a kind (``records``, ``heads``, ...), and the
process-wide :data:`CACHES` registry holds every live cache and the bound
of each kind: the gateway sets them from its configuration
(:meth:`Caches.configure`), its memory budget shrinks them all at once
under pressure (:meth:`Caches.squeeze`), and ``GET /stats`` and
``/metrics`` read their sizes from it (:meth:`Caches.stats`).

The registry is the process's, not a node's: memory is a process's, and
a memo of the S3 edge (``gateway/s3/headers.py``) lives as long as its
module. Tests that run several nodes in one process see their caches of
one kind added up.

The record cache hands out one decoded record per object version (frozen
dataclasses), so what a hot GET derives from it (a mounted object's
``ObjectMeta``, a response head) can be kept for as long as that record
is the one handed out, and found again by ``id()`` without hashing the
record's fields (:class:`ByIdentity`).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

MiB = 1024 * 1024

# The kinds of cache, each with its default bound: a share of the memory
# the process may use (the machine's, or its memory budget), at most a cap,
# at least MIN_BOUND. The shares add up to about 2 % of memory: caches are
# for speed, the rest is for requests in flight and the allocator's slack.
# (share, cap, what it keeps)
KINDS: dict[str, tuple[float, int, str]] = {
    "records": (1 / 64, 256 * MiB, "decoded index records of objects and mounted objects"),
    "heads": (1 / 1024, 32 * MiB, "GET and HEAD response heads, by object version"),
    "tar_headers": (1 / 1024, 32 * MiB, "GetBatch tar member headers, by object version"),
    "batch_places": (1 / 1024, 32 * MiB, "where a batch member's pieces are, by object version"),
    "decisions": (1 / 1024, 32 * MiB, "authorisation decisions, by caller, action and resource"),
    "memos": (1 / 1024, 32 * MiB, "other values derived from records (a mounted object's metadata)"),
}
MIN_BOUND = 1 * MiB
# Before the gateway configures the registry (a test's node, a tool): a
# bound that lets a cache do its work without taking much.
UNCONFIGURED = 64 * MiB
# The smallest squeeze: under memory pressure a cache keeps at least this
# fraction of its bound, so hot GETs still find their records.
MIN_SQUEEZE = 1 / 64


def default_bounds(memory: int) -> dict[str, int]:
    """Each kind's bound for a process that may use ``memory`` bytes, in whole MiB."""
    return {name: max(MIN_BOUND, min(cap, int(memory * share)) // MiB * MiB)
            for name, (share, cap, _) in KINDS.items()}


# -- weighing -----------------------------------------------------------------

_LEAVES = frozenset((str, bytes, int, float, bool, type(None)))
_SEQUENCES = frozenset((tuple, list, set, frozenset))
_DEPTH = 6  # records nest 3 deep (ObjectMeta -> chunks -> Chunk -> Extent)
_getsizeof = sys.getsizeof


@cache
def _slots(cls: type) -> tuple[str, ...]:
    """The slot names of ``cls`` and its bases (slotted dataclasses)."""
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__weakref__", "__dict__")]
    return tuple(names)


def weigh(obj: object, depth: int = 0) -> int:
    """An estimate of the bytes ``obj`` keeps alive: ``sys.getsizeof`` of
    it and of what it holds (containers, dataclass fields), ``_DEPTH``
    levels down. Objects shared with others (interned strings, small ints)
    are counted each time they appear, so it errs on the high side. A
    decoded record with one chunk weighs about 1.4 KiB, in about 13 us."""
    size = _getsizeof(obj)
    kind = type(obj)
    if kind in _LEAVES or depth >= _DEPTH:
        return size
    depth += 1
    if kind in _SEQUENCES:
        for item in obj:  # type: ignore[attr-defined]
            size += _getsizeof(item) if type(item) in _LEAVES else weigh(item, depth)
        return size
    if kind is dict:
        for k, v in obj.items():  # type: ignore[attr-defined]
            size += _getsizeof(k) + (_getsizeof(v) if type(v) in _LEAVES else weigh(v, depth))
        return size
    for name in _slots(kind):
        value = getattr(obj, name, None)
        size += _getsizeof(value) if type(value) in _LEAVES else weigh(value, depth)
    if (attrs := getattr(obj, "__dict__", None)) is not None:
        size += weigh(attrs, depth)
    return size


def weigh_item(key: object, value: object) -> int:
    """An entry's weight: its key, its value and the dict slot holding them."""
    return weigh(key) + weigh(value) + _SLOT


# An entry's place: its slot (hash, key, value) in the entries' dict and in
# the sizes', and the sizes' order (a linked node and its index, about 56 bytes).
_SLOT = 3 * 8 * 2 + 56


# -- caches -------------------------------------------------------------------


class Kept(Generic[K, V]):
    """key -> value, at most ``bound`` bytes of entries by their weight
    (and at most ``entries`` entries, when given), the oldest stored
    going first. A hit is one lookup of :attr:`items` (a plain dict, never
    replaced) and takes no lock and no reordering; stores and drops take
    the cache's lock, so threads may share it.

    The order of age is the sizes' (an ``OrderedDict``): the oldest is
    dropped in constant time. Found as the first key of a plain dict, it
    cost a walk over the slots the drops before it had emptied, up to the
    dict's next resize: 4.4 us a store at 8,192 entries and 9.7 at
    100,000, against 0.8 now, paid by every store into a full cache (a
    cold epoch larger than its caches stores into full ones on every miss)."""

    __slots__ = ("name", "items", "bytes", "max_entries", "bound", "_sizes", "_weigh", "_lock", "__weakref__")

    def __init__(self, name: str, entries: int = 0, weigh: Callable[[K, V], int] = weigh_item,
                 registry: Caches | None = None) -> None:
        self.name = name
        self.items: dict[K, V] = {}
        self._sizes: OrderedDict[K, int] = OrderedDict()
        self.bytes = 0
        self.max_entries = entries
        self._weigh = weigh
        self._lock = threading.Lock()
        self.bound = 0
        (registry or CACHES).join(self)

    def __len__(self) -> int:
        return len(self.items)

    def get(self, key: K) -> V | None:
        return self.items.get(key)

    def put(self, key: K, value: V) -> bool:
        """Store ``value`` (replacing one kept under ``key``), then drop the
        oldest entries until the cache is within its bounds. False when the
        entry alone is over the bound, and not kept."""
        size = self._weigh(key, value)
        with self._lock:
            self._pop(key)
            if size > self.bound:
                return False
            self.items[key] = value
            self._sizes[key] = size
            self.bytes += size
            self._shrink(self.bound)
        return True

    def pop(self, key: K) -> None:
        with self._lock:
            self._pop(key)

    def pop_if(self, key: K, test: Callable[[V], bool]) -> None:
        """Drop ``key``'s entry if ``test`` says yes of its value."""
        with self._lock:
            value = self.items.get(key)
            if value is not None and test(value):
                self._pop(key)

    def clear(self) -> None:
        with self._lock:
            self.items.clear()
            self._sizes.clear()
            self.bytes = 0

    def fit(self, bound: int) -> None:
        """Hold at most ``bound`` bytes from now on, dropping what is over."""
        with self._lock:
            self.bound = bound
            self._shrink(bound)

    def _pop(self, key: K) -> None:
        size = self._sizes.pop(key, None)
        if size is not None:
            del self.items[key]
            self.bytes -= size

    def _shrink(self, bound: int) -> None:
        """Under the lock: drop the oldest while over a bound."""
        items, sizes = self.items, self._sizes
        while items and (self.bytes > bound or (self.max_entries and len(items) > self.max_entries)):
            oldest, size = sizes.popitem(last=False)
            del items[oldest]
            self.bytes -= size


class Caches:
    """Every live :class:`Kept` of the process, and the bound of each kind.

    The effective bound of a cache is its kind's bound times the squeeze
    (1 unless the memory budget asked for less)."""

    def __init__(self) -> None:
        self._caches: weakref.WeakSet[Kept[Any, Any]] = weakref.WeakSet()
        self._bounds: dict[str, int] = {}
        self.squeezed = 1.0
        self._lock = threading.Lock()

    def join(self, cache: Kept[Any, Any]) -> None:
        """Register ``cache`` and give it its kind's bound."""
        with self._lock:
            self._caches.add(cache)
        cache.fit(self.bound(cache.name))

    def bound(self, name: str) -> int:
        """The bound in force for a cache of kind ``name``."""
        return int(self._bounds.get(name, UNCONFIGURED) * self.squeezed)

    def configure(self, bounds: Mapping[str, int]) -> None:
        """Set the bounds of the kinds named (the others keep theirs)."""
        self._bounds.update(bounds)
        self._refit()

    def squeeze(self, fraction: float) -> None:
        """Every cache to ``fraction`` of its bound (1: as configured),
        dropping its oldest entries over it now."""
        self.squeezed = min(1.0, max(MIN_SQUEEZE, fraction))
        self._refit()

    def _refit(self) -> None:
        for kept in self._live():
            kept.fit(self.bound(kept.name))

    def _live(self) -> Iterable[Kept[Any, Any]]:
        with self._lock:
            return list(self._caches)

    def total(self) -> int:
        """The configured bounds of every kind, added up: what the caches
        may hold unsqueezed, one cache a kind."""
        return sum(self._bounds.values())

    def stats(self) -> dict[str, dict[str, int]]:
        """By kind: bytes and entries held (the caches of a kind added up),
        and the bound in force and the one configured for each cache."""
        out = {name: {"bytes": 0, "entries": 0, "caches": 0} for name in self._bounds}
        for kept in self._live():
            row = out.setdefault(kept.name, {"bytes": 0, "entries": 0, "caches": 0})
            row["bytes"] += kept.bytes
            row["entries"] += len(kept)
            row["caches"] += 1
        for name, row in out.items():
            row["bound"] = self.bound(name)
            row["configured"] = self._bounds.get(name, UNCONFIGURED)
        return dict(sorted(out.items()))


CACHES = Caches()


# Records a ByIdentity remembers as derived once (their ids, about 1 MiB at most).
SEEN = 16384


class ByIdentity(Generic[K, V]):
    """Derived values of records, at most ``size`` of them (0: any
    number) and at most the bound of kind ``name`` in bytes, the oldest
    going first, and none longer than its record lives.

    The record is held by a weak reference: once the record cache (or the
    request that had it) lets it go, its value goes too, rather than
    keeping a dead version alive until the bound pushes it out. Strong
    references made every overwrite leave its old record and value here:
    under the hostile soak the heads, tar headers and batch places grew
    by about 2 MiB a minute between them, on 150 live keys, until their
    bounds (docs/reliability.md). An ``id()`` reused by another object
    is never mistaken for the record: the reference must return it. A
    record that takes no weak references is held as before, strongly,
    and weighed with the value.

    A value is kept from its record's second derivation on: the first is
    only remembered (the record's ``id()``, among at most ``SEEN`` of
    them). An epoch reads each object once, so a hinted or cold epoch's
    records are derived once each, and keeping their values cost a store,
    a weak reference and a drop with no hit to pay for them: a hinted
    epoch's object cost the gateway 0.512-0.516 ms of CPU with nothing
    kept against 0.522-0.571 with everything (three alternating pairs).
    An ``id()`` reused by a new record may have it kept at its first
    derivation: a value kept early, never a wrong one."""

    def __init__(self, size: int = 0, name: str = "memos", weigh_value: Callable[[V], int] = weigh) -> None:
        """``weigh_value``: the bytes a derived value keeps alive that its
        record does not (by default :func:`weigh` of the whole value). A
        value built of its record's own strings and dicts is weighed by
        what it adds: walking it all cost a miss more than deriving it."""
        self._weigh_value = weigh_value
        self._kept: Kept[int, tuple[Any, V]] = Kept(name, size, self._weigh_derived)
        # (id, reference) of records gone: appended by the references'
        # callbacks, which run on whichever thread dropped the record,
        # maybe inside another cache's lock, so they take no lock; the
        # next store drops their entries.
        self._gone: deque[tuple[int, Any]] = deque()
        self._seen: set[int] = set()  # ids of records derived once, not kept

    def get(self, record: K, derive: Callable[[K], V]) -> V:
        key = id(record)
        kept = self._kept.items.get(key)
        if kept is not None and kept[0]() is record:
            return kept[1]
        value = derive(record)
        seen = self._seen
        if key not in seen:  # the first time: remembered, not kept
            if len(seen) >= SEEN:
                seen.clear()
            seen.add(key)
            return value
        seen.discard(key)
        gone = self._gone
        try:
            held: Callable[[], Any] = weakref.ref(record, lambda ref: gone.append((key, ref)))
        except TypeError:  # no weak references to it: held strongly, by a closure
            held = _strongly(record)
        self._drop_gone()
        self._kept.put(key, (held, value))
        return value

    def _drop_gone(self) -> None:
        gone = self._gone
        while gone:
            key, ref = gone.popleft()
            self._kept.pop_if(key, lambda kept, ref=ref: kept[0] is ref)

    def __len__(self) -> int:
        return len(self._kept)

    def _weigh_derived(self, key: int, kept: tuple[Any, V]) -> int:
        """The derived value and its record's reference (the record is the
        record cache's, weighed there, and walking it on every miss, on the
        event loop, cost several times the derivation)."""
        held, value = kept
        return _getsizeof(kept) + _getsizeof(held) + self._weigh_value(value) + _SLOT + 32  # the id key: an int


def _strongly(record: Any) -> Callable[[], Any]:
    """A reference to ``record`` that holds it, called as a weak one is."""
    return lambda: record
