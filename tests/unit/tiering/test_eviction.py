"""The SIEVE queue, checked by hand-worked examples, against a list-based
model, and against LRU on a scan; and the hot tier's hinted eviction."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tiering.cluster.peers import PeerGroup
from tiering.hot.sieve import EvictionAdvisor, Sieve
from tiering.hot.tier import HotTier


def _queue(*names: str) -> Sieve:
    sieve = Sieve()
    for name in names:
        sieve.insert(name, 1)
    return sieve


def _drain(sieve: Sieve) -> list[str]:
    order = []
    while (picked := sieve.victim()) is not None:
        order.append(picked[0])
    return order


# -- Sieve -------------------------------------------------------------------


def test_visited_items_are_passed_over_and_the_hand_stays_where_it_stopped() -> None:
    sieve = _queue("a", "b", "c", "d")  # tail a ... head d
    assert sieve.touch("a") and sieve.touch("c")
    assert not sieve.touch("missing")
    assert list(sieve.names()) == ["a", "b", "c", "d"], "a hit does not reorder"
    assert sieve.victim() == ("b", 1), "a loses its bit, b is the first unvisited"
    assert sieve.victim() == ("d", 1), "the hand resumes at c, not at the tail"
    assert sieve.victim() == ("a", 1), "past the head the hand wraps to the tail"
    assert list(sieve.names()) == ["c"] and len(sieve) == 1 and sieve.total == 1
    assert sieve.victim() == ("c", 1)
    assert sieve.victim() is None and len(sieve) == 0 and sieve.total == 0


def test_the_hand_wraps_when_every_item_is_visited() -> None:
    sieve = _queue("a", "b", "c")
    for name in "abc":
        sieve.touch(name)
    assert sieve.victim() == ("a", 1), "one full turn clears every bit"
    sieve.insert("d", 1)  # at the head, behind the hand
    sieve.touch("b")
    assert sieve.victim() == ("c", 1), "the hand was at b; b was read again"
    assert _drain(sieve) == ["d", "b"]


def test_removing_the_item_under_the_hand_moves_the_hand_toward_the_head() -> None:
    sieve = _queue("a", "b", "c", "d")
    sieve.touch("a")
    assert sieve.victim() == ("b", 1)  # the hand now rests on c
    assert sieve.remove("c") == 1
    assert sieve.victim() == ("d", 1), "the hand moved on to d, not back to the tail"
    sieve = _queue("a", "b")
    sieve.touch("a")
    sieve.touch("b")
    sieve.remove("a")
    assert sieve.victim() == ("b", 1)
    sieve = _queue("a", "b", "c")
    sieve.touch("a")
    sieve.touch("b")
    assert sieve.victim() == ("c", 1)  # the hand is past the head: wraps next time
    sieve.insert("d", 1)
    assert sieve.victim() == ("a", 1)
    assert sieve.remove("missing") is None


def test_reinserting_updates_the_size_and_keeps_the_place() -> None:
    sieve = Sieve()
    sieve.insert("a", 10)
    sieve.insert("b", 20)
    sieve.touch("a")
    sieve.insert("a", 5)
    assert sieve.total == 25 and list(sieve.names()) == ["a", "b"]
    assert sieve.victim() == ("b", 20), "a kept its bit"
    assert sieve.victim() == ("a", 5)


def test_skipped_items_keep_an_unset_bit_and_visited_ones_lose_it() -> None:
    sieve = _queue("a", "b", "c")
    sieve.touch("c")
    assert sieve.victim(skip=lambda name: name == "a") == ("b", 1)
    assert sieve.victim() == ("a", 1), "c lost its bit, the hand wrapped to a"
    sieve = _queue("a", "b", "c")
    sieve.touch("b")
    assert sieve.victim(skip=lambda name: True) is None, "every item skipped: no victim"
    assert len(sieve) == 3 and sieve.total == 3
    assert sieve.victim(skip=lambda name: name != "b") == ("b", 1), "b's bit was cleared"
    sieve = _queue("a", "b")
    sieve.touch("b")
    assert sieve.victim(skip=lambda name: name == "a") == ("b", 1), "found on the second turn"
    assert Sieve().victim() is None


def test_a_working_set_read_during_a_scan_survives_where_lru_loses_it() -> None:
    """Three names read after every six names of a long one-time scan, in a
    cache of eight: LRU sees a reuse distance of eight and always misses;
    SIEVE keeps the visited working set and evicts the scan."""
    capacity = 8
    working = ["w0", "w1", "w2"]
    trace = working * 2
    for i in range(60):
        trace.append(f"scan-{i}")
        if i % 6 == 5:
            trace += working

    sieve = Sieve()
    lru: OrderedDict[str, None] = OrderedDict()
    sieve_hits = lru_hits = 0
    for name in trace:
        if sieve.touch(name):
            sieve_hits += name in working
        else:
            sieve.insert(name, 1)
            while len(sieve) > capacity:
                sieve.victim()
        if name in lru:
            lru.move_to_end(name)
            lru_hits += name in working
        else:
            lru[name] = None
            while len(lru) > capacity:
                lru.popitem(last=False)
    reads = trace.count("w0") * len(working)
    assert lru_hits == len(working), "LRU only hits the warm-up's second read"
    assert sieve_hits > lru_hits
    assert sieve_hits >= reads - 2 * len(working), "SIEVE misses only while warming up"
    assert all(name in sieve for name in working)


class _Model:
    """SIEVE as a Python list (tail first) and an index for the hand: slow,
    obviously right, and nothing like the linked list under test."""

    def __init__(self) -> None:
        self.items: list[list] = []  # [name, size, visited]
        self.hand: int | None = None

    def find(self, name: str) -> int | None:
        return next((i for i, item in enumerate(self.items) if item[0] == name), None)

    def insert(self, name: str, size: int) -> None:
        i = self.find(name)
        if i is None:
            self.items.append([name, size, False])
        else:
            self.items[i][1] = size

    def touch(self, name: str) -> bool:
        i = self.find(name)
        if i is not None:
            self.items[i][2] = True
        return i is not None

    def pop(self, i: int) -> tuple[str, int]:
        name, size, _ = self.items.pop(i)
        if self.hand is not None:
            if i < self.hand:
                self.hand -= 1
            elif i == self.hand and i == len(self.items):
                self.hand = None
        return name, size

    def remove(self, name: str) -> int | None:
        i = self.find(name)
        return None if i is None else self.pop(i)[1]

    def victim(self, skip: frozenset[str]) -> tuple[str, int] | None:
        if not self.items:
            return None
        i = self.hand or 0
        for _ in range(2 * len(self.items) + 1):
            item = self.items[i]
            if item[2]:
                item[2] = False
            elif item[0] not in skip:
                self.hand = i
                return self.pop(i)
            i = (i + 1) % len(self.items)
        self.hand = i
        return None


_names = st.sampled_from("abcdefgh")
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), _names, st.integers(0, 100)),
        st.tuples(st.just("touch"), _names),
        st.tuples(st.just("remove"), _names),
        st.tuples(st.just("victim"), st.frozensets(_names)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_sieve_matches_a_list_model(ops: list[tuple]) -> None:
    sieve, model = Sieve(), _Model()
    for op, *args in ops:
        if op == "victim":
            skip = args[0]
            got = sieve.victim(skip=skip.__contains__ if skip else None)
            expected = model.victim(skip)
            assert got == expected
            if got is None:
                assert all(item[0] in skip for item in model.items)
            else:
                assert got[0] not in skip and got[0] not in sieve
        else:
            assert getattr(sieve, op)(*args) == getattr(model, op)(*args)
        assert list(sieve.names()) == [item[0] for item in model.items]
        assert len(sieve) == len(model.items)
        assert sieve.total == sum(item[1] for item in model.items)


# -- the hot tier with an advisor ----------------------------------------------


class _Advisor:
    """A fixed future: ``order`` is furthest-needed first."""

    def __init__(self, hot: HotTier, order: list[str]) -> None:
        self._hot = hot
        self.order = order
        self.wanted_set = set(order)
        self.pulled: list[str] = []

    def wanted(self, name: str) -> bool:
        return name in self.wanted_set

    def furthest(self) -> Iterator[str]:
        for name in self.order:
            assert not self._hot._lock.locked(), "iterated while the hot tier's lock is held"
            self.pulled.append(name)
            yield name


def _cached(hot: HotTier, names: str) -> set[str]:
    return {name for name in names if hot.is_cached(name)}


def test_hinted_eviction_takes_unwanted_files_then_the_furthest_needed(tmp_path: Path) -> None:
    hot = HotTier(tmp_path, budget=2000, high=0.9, low=0.5)
    for name in "abcdef":
        assert hot.fill(name, b"x" * 100)
    assert hot.fill("p", b"p" * 100, pin=True)
    assert hot.read_cached("a", 100) is not None  # a hit does not make "a" wanted
    advisor = _Advisor(hot, ["x", "p", "e", "c", "f"])  # x is not cached, p is pinned
    advisor_protocol: EvictionAdvisor = advisor
    hot.advisor = advisor_protocol
    assert hot.evict(400) == 300
    assert _cached(hot, "abcdefp") == {"c", "e", "f", "p"}, "unwanted files go first"
    assert advisor.pulled == [], "no hint needed while unwanted files remain"
    assert hot.evict(200) == 200
    assert _cached(hot, "cefp") == {"f", "p"}, "then the one needed furthest ahead"
    assert advisor.pulled == ["x", "p", "e", "c"], "names pulled lazily, one per step"
    assert hot.evict(0) == 100 and _cached(hot, "fp") == {"p"}, "pinned files never go"
    assert hot.evict(0) == 0
    assert (hot.cached, hot.pinned, hot.evicted) == (100, 100, 600)
    assert not hot.cache_path("c").exists() and hot.cache_path("p").exists()


def test_wanted_files_the_advisor_cannot_order_fall_back_to_sieve(tmp_path: Path) -> None:
    hot = HotTier(tmp_path, budget=2000)
    for name in "abc":
        hot.fill(name, b"x" * 100)
    advisor = _Advisor(hot, ["a"])
    advisor.wanted_set = {"a", "b", "c"}  # wants more than it can order
    hot.advisor = advisor
    assert hot.evict(200) == 100 and _cached(hot, "abc") == {"b", "c"}
    assert hot.evict(0) == 200 and hot.cached == 0, "then plain SIEVE"


def test_without_an_advisor_a_file_read_again_outlives_the_others(tmp_path: Path) -> None:
    hot = HotTier(tmp_path, budget=2000)
    for name in "abcd":
        hot.fill(name, b"x" * 100)
    assert hot.read_cached("a", 100) is not None
    assert hot.read_cached("c", 100) is not None
    hot.evict(200)
    assert _cached(hot, "abcd") == {"a", "c"}


# -- copies of other nodes' pieces --------------------------------------------


def _extent_name(segment: int, offset: int) -> str:
    return f"{segment:016x}-{offset:x}-64"  # as Extent.cache_name


def test_copies_of_other_nodes_extents_go_before_this_nodes_share(tmp_path: Path) -> None:
    """The owner table (a PeerGroup of three nodes) says which cached
    extents are this node's; the others go first, even those filled after
    the own ones and read again since, and even with an advisor that wants
    them; a mounted piece's name is never judged a copy."""
    group = PeerGroup("n1", {"n1": "http://a", "n2": "http://b", "n3": "http://c"})
    hot = HotTier(tmp_path, budget=1 << 20, high=0.9, low=0.5)
    hot.rank_copies(group.keeps_elsewhere)
    names = [_extent_name(7, 100 * i) for i in range(30)]
    own = [name for name in names if not group.keeps_elsewhere(name)]
    copies = [name for name in names if group.keeps_elsewhere(name)]
    assert own and copies
    mount_piece = "m" + "ab" * 20 + "-0"
    for name in [*own, mount_piece, *copies]:  # the copies newest: plain SIEVE would take the own ones first
        assert hot.fill(name, b"x" * 100)
    for name in copies:
        assert hot.read_cached(name, 100) is not None  # a hit does not save a copy
    advisor = _Advisor(hot, [])
    advisor.wanted_set = set(copies)
    hot.advisor = advisor
    assert not group.keeps_elsewhere(mount_piece)
    kept = len(own) + 1
    assert hot.evict(100 * kept) == 100 * len(copies)
    assert _cached(hot, names) == set(own) and hot.is_cached(mount_piece), "only the copies went"
    assert hot.evict(100 * (kept - 2)) == 200, "then this node's own share, as SIEVE picks"


def test_copies_are_judged_again_when_the_owners_change(tmp_path: Path) -> None:
    """Alone, a node owns everything; when two more join, what they now own
    is a copy here once judged again (the node calls ``judge_copies`` when
    its peers change), and goes first."""
    group = PeerGroup("n1", {"n1": "http://a"})
    hot = HotTier(tmp_path, budget=1 << 20, high=0.9, low=0.5)
    hot.rank_copies(lambda name: group.keeps_elsewhere(name))
    names = [_extent_name(9, 100 * i) for i in range(30)]
    for name in names:
        assert hot.fill(name, b"x" * 100)
    assert hot.judge_copies() == 0
    group = PeerGroup("n1", {"n1": "http://a", "n2": "http://b", "n3": "http://c"})
    moved = {name for name in names if group.keeps_elsewhere(name)}
    assert moved and hot.judge_copies() == len(moved)
    hot.evict(100 * (len(names) - len(moved)))
    assert _cached(hot, names) == set(names) - moved
