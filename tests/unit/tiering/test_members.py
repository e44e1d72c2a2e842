"""The node registry (``tiering/cluster/members.py``) over one capacity
directory, and the peer client following it. Rounds are driven by hand and
time by an injected wall clock: nothing sleeps."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from tiering.capacity import LocalDirStore
from tiering.capacity.store import Listed
from tiering.cluster import peers as peers_module
from tiering.cluster.members import BEATS, COLLECT, JITTER, NODES, SKEW, Member, Membership
from tiering.cluster.peers import Keys, PeerClient, PeerGroup, PeerRefused
from tiering.node import Node
from tiering.settings import TierSettings

INTERVAL = 2.0


class Clock:
    """A wall clock the test moves."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def membership(store: LocalDirStore, node: str, clock: Clock) -> Membership:
    return Membership(store, node, f"http://{node}:9100", INTERVAL, wall=clock)


def test_members_see_each_other_and_a_stopped_one_leaves_at_once(tmp_path: Path) -> None:
    async def go() -> None:
        store, clock = LocalDirStore(tmp_path / "capacity"), Clock()
        a, b, c = (membership(store, name, clock) for name in ("a", "b", "c"))
        assert a.ttl == BEATS * INTERVAL + SKEW  # the default
        assert set(await a.round()) == {"a"}  # alone so far
        await b.round()
        await c.round()
        for m in (a, b, c):
            live = await m.refresh()
            assert {n: x.endpoint for n, x in live.items()} == {
                "a": "http://a:9100", "b": "http://b:9100", "c": "http://c:9100"}
        status = {s.node: s for s in a.status()}
        assert status["a"].me and not status["b"].me and all(s.live for s in status.values())

        await b.stop()  # a clean stop deletes its entry
        assert [name async for name, _ in store.list(NODES)] == [NODES + "a", NODES + "c"]
        assert set(await a.refresh()) == {"a", "c"}
        assert set(await c.refresh()) == {"a", "c"}

    asyncio.run(go())


def test_a_node_is_judged_as_of_the_last_listing_not_between_listings(tmp_path: Path) -> None:
    """Between two listings a node's entry does not age: with a listing
    interval close to the ttl, every node would look dead just before each
    listing (and the pusher, which asks between listings, would skip it)."""
    async def go() -> None:
        store, clock = LocalDirStore(tmp_path / "capacity"), Clock()
        a, b = membership(store, "a", clock), membership(store, "b", clock)
        await b.round()
        assert set(await a.round()) == {"a", "b"}
        clock.now += a.ttl + 1  # no listing meanwhile: b may well have beaten since
        assert set(a.live()) == {"a", "b"}
        assert set(await a.refresh()) == {"a"}  # listed: it did not
        assert set(a.live()) == {"a"}

    asyncio.run(go())


def test_a_node_that_stops_heartbeating_leaves_after_the_ttl(tmp_path: Path) -> None:
    async def go() -> None:
        store, clock = LocalDirStore(tmp_path / "capacity"), Clock()
        a, b = membership(store, "a", clock), membership(store, "b", clock)
        await a.round()
        await b.round()
        assert set(await a.refresh()) == {"a", "b"}
        # b stops beating (killed, paused, cut off): its entry stays in the store.
        clock.now += a.ttl
        await a.round()
        assert set(a.live()) == {"a", "b"}  # exactly ttl old: still live
        clock.now += 0.5
        assert set(await a.refresh()) == {"a"}
        shown = {s.node: s for s in a.status()}
        assert not shown["b"].live and shown["b"].heartbeat_age == pytest.approx(a.ttl + 0.5)
        # b comes back: live again at once, with a new heartbeat.
        await b.round()
        assert set(await a.refresh()) == {"a", "b"}

    asyncio.run(go())


def test_a_second_process_with_the_same_node_id_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> None:
        store, clock = LocalDirStore(tmp_path / "capacity"), Clock()
        first, second = membership(store, "a", clock), Membership(store, "a", "http://elsewhere:9100", wall=clock)
        await first.round()
        clock.now += 1
        await second.round()  # takes the entry over: an earlier run of "a", as far as it can tell
        assert second.conflicts == 0
        clock.now += 1
        with caplog.at_level(logging.ERROR, logger="tierstore.cluster.members"):
            await first.round()  # its If-Match fails: someone else wrote the entry
        assert first.conflicts == 1
        assert any("node id a is used by another gateway" in r.getMessage() and "http://elsewhere:9100"
                   in r.getMessage() for r in caplog.records)
        await first.round()  # keeps going with a fresh read: this write lands
        assert first.conflicts == 1
        await second.round()
        assert second.conflicts == 1  # and the other one reports it too
        await second.round()  # its write lands: the entry is the second's now
        # A stop deletes the entry only if it is still this process's.
        await first.stop()
        data, _ = await store.read_versioned(NODES + "a")
        assert Member.decode(data).endpoint == "http://elsewhere:9100"
        await second.stop()
        assert [name async for name, _ in store.list(NODES)] == []

    asyncio.run(go())


def test_a_leftover_entry_of_a_crashed_run_is_taken_over_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> None:
        store, clock = LocalDirStore(tmp_path / "capacity"), Clock()
        await membership(store, "a", clock).round()  # then "crashes": no stop
        again = membership(store, "a", clock)
        with caplog.at_level(logging.ERROR, logger="tierstore.cluster.members"):
            await again.round()
            await again.round()
        assert again.conflicts == 0 and not caplog.records

    asyncio.run(go())


def _client(me: str, endpoints: dict[str, str]) -> PeerClient:
    return PeerClient(PeerGroup(me, endpoints), "us-east-1", Keys("AK", "SK", None), timeout=1.0)


def test_the_peer_client_follows_the_live_set(monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        client = _client("a", {"a": "http://a:1"})
        await client.start()
        try:
            await client.follow({"a": "http://a:1", "b": "http://b:1", "c": "http://c:1"})
            assert client.group.nodes == ["a", "b", "c"] and client.group.me == "a"
            group = client.group
            c_getter = client._getters["c"]
            await client.follow({"a": "http://a:1", "b": "http://b:1"})
            assert client.group.nodes == ["a", "b"]
            assert group.nodes == ["a", "b", "c"]  # a frozen value: replaced, never changed
            # A read that picked c before it left still gets its connection...
            assert client._getters["c"] is c_getter
            # ...until the grace period is over; then c is refused (the read goes to the store).
            monkeypatch.setattr(peers_module.time, "monotonic", lambda: 1e12)
            await client.follow({"a": "http://a:1", "b": "http://b:1"})
            with pytest.raises(PeerRefused, match="not a member"):
                await client.get("c", "bucket", "key", "etag", 0, 10)
            with pytest.raises(PeerRefused, match="not a member"):
                await client.get("d", "bucket", "key", "etag", 0, 10)
            # An unchanged set keeps the same group.
            same = client.group
            await client.follow({"b": "http://b:1"})  # this node is always in it
            assert client.group is same
        finally:
            await client.close()
        await client.follow({"a": "http://a:1", "e": "http://e:1"})  # after close: nothing
        assert "e" not in client._getters

    asyncio.run(go())


def test_a_node_that_failed_is_asked_again_once_it_restarted() -> None:
    async def go() -> None:
        client = _client("a", {"a": "http://a:1", "b": "http://127.0.0.1:9"})
        await client.start()
        try:
            await client.follow({"a": "http://a:1", "b": "http://127.0.0.1:9"}, {"a": 1, "b": 100})
            with pytest.raises(PeerRefused, match="cannot be reached"):
                await client.get("b", "bucket", "key", "etag", 0, 10)  # nothing listens on port 9
            with pytest.raises(PeerRefused, match="lately"):
                await client.get("b", "bucket", "key", "etag", 0, 10)  # paused
            assert peers_module._PAUSE <= 5
            await client.follow({"a": "http://a:1", "b": "http://127.0.0.1:9"}, {"a": 1, "b": 100})
            assert "b" in client._down_until  # the same run of b: still paused
            await client.follow({"a": "http://a:1", "b": "http://127.0.0.1:9"}, {"a": 1, "b": 200})
            assert "b" not in client._down_until  # b restarted: asked again at once
        finally:
            await client.close()

    asyncio.run(go())


def test_a_node_without_peers_follows_the_registry(tmp_path: Path) -> None:
    """Two Nodes with advertised endpoints: each one's status lists both,
    its peer group holds both, and a stopped one leaves the other's."""

    def build(name: str) -> Node:
        url = f"http://{name}.invalid:9100"
        settings = TierSettings(node_id=name, lease_ttl=2.0, follow_interval=3600.0, flush_delay=3600.0,
                                advertise_url=url)
        peers = PeerClient(PeerGroup(name, {name: url}), "us-east-1", Keys("AK", "SK", None))
        return Node(tmp_path / name, settings, LocalDirStore(tmp_path / "capacity"), peers=peers)

    async def go() -> None:
        a, b = build("a"), build("b")
        await a.start()
        await b.start()
        try:
            assert b.peers.group.nodes == ["a", "b"]  # b listed a at its start
            assert a.peers.group.nodes == ["a"]
            await a.tiers.cluster.members.round()  # a round a's timer would run
            assert a.peers.group.endpoints == {"a": "http://a.invalid:9100", "b": "http://b.invalid:9100"}
            members = (await a.tiers.status()).cluster.members
            assert [(m.node, m.endpoint, m.live, m.me) for m in members] == [
                ("a", "http://a.invalid:9100", True, True), ("b", "http://b.invalid:9100", True, False)]
        finally:
            await b.close()
        try:
            await a.tiers.cluster.members.round()
            assert a.peers.group.nodes == ["a"]  # b's entry was deleted at its stop
        finally:
            await a.close()

    asyncio.run(go())


def test_an_idle_listing_reads_no_entry_and_a_changed_one_is_read_once(tmp_path: Path) -> None:
    """What keeping the registry costs: a heartbeat is one PUT, a listing one
    LIST, and only entries that are new or changed (a restart) are read."""

    async def go() -> None:
        store, clock = LocalDirStore(tmp_path / "capacity"), Clock()
        nodes = [membership(store, f"n{i}", clock) for i in range(8)]
        for m in nodes:
            await m.round()
        for m in nodes:
            assert len(await m.refresh()) == 8
        before = (store.stats.puts, store.stats.lists, store.stats.gets)
        for _ in range(3):  # idle rounds: every node beats and lists
            clock.now += INTERVAL
            for m in nodes:
                await m.round()
        puts, lists, gets = (store.stats.puts - before[0], store.stats.lists - before[1],
                             store.stats.gets - before[2])
        assert (puts, lists, gets) == (3 * 8, 3 * 8, 0)
        assert all(len(m.live()) == 8 for m in nodes)

        # n3 restarts: a new record; each other node reads it once.
        clock.now += 1
        gets = store.stats.gets
        nodes[3] = membership(store, "n3", clock)
        await nodes[3].round()  # reads its old entry (its create conflicts), then every other entry
        for m in nodes:
            await m.refresh()
        for m in nodes:
            await m.refresh()
        assert store.stats.gets - gets == 1 + 7 + 7
        assert {m.live()["n3"].started_ms for m in nodes} == {nodes[3]._started_ms}

    asyncio.run(go())


class HookedStore(LocalDirStore):
    """A store that runs ``after_listing`` once a listing has been read."""

    after_listing: Callable[[], Awaitable[None]] | None = None

    async def list_entries(self, prefix: str = "") -> AsyncIterator[Listed]:
        async for entry in super().list_entries(prefix):
            yield entry
        if self.after_listing is not None:
            hook, self.after_listing = self.after_listing, None
            await hook()


def test_dead_entries_are_collected_by_one_node_and_never_one_that_came_back(tmp_path: Path) -> None:
    async def go() -> None:
        store, clock = HookedStore(tmp_path / "capacity"), Clock()
        a, b, c, d = (membership(store, name, clock) for name in ("a", "b", "c", "d"))
        for m in (a, b, c, d):
            await m.round()
        await a.refresh()
        await b.refresh()
        # c and d stop beating (crashed). Long after, both a and b list them:
        # only a (the live node with the lowest id) deletes them.
        clock.now += COLLECT * a.ttl + 1
        await a.beat()
        await b.beat()
        assert set(await b.refresh()) == {"a", "b"} and b.collected == 0
        # d comes back while a lists: a's delete of the entry it listed fails.
        store.after_listing = d.beat
        assert set(await a.refresh()) == {"a", "b"}
        assert a.collected == 1  # c's
        assert d._resumed_ms > d._started_ms  # a new run of heartbeats: a new record, a new ETag
        assert [name async for name, _ in store.list(NODES)] == [NODES + n for n in ("a", "b", "d")]
        assert set(await a.refresh()) == {"a", "b", "d"}
        assert set(await b.refresh()) == {"a", "b", "d"}
        # c, started again, registers anew.
        await membership(store, "c", clock).round()
        assert set(await a.refresh()) == {"a", "b", "c", "d"}

    asyncio.run(go())


def test_a_node_whose_entry_was_collected_writes_it_again_at_its_next_beat(tmp_path: Path) -> None:
    async def go() -> None:
        store, clock = LocalDirStore(tmp_path / "capacity"), Clock()
        a = membership(store, "a", clock)
        await a.round()
        await store.delete(NODES + "a")  # as a collector would
        await a.beat()  # If-Match fails on a missing entry: created again at once
        assert [name async for name, _ in store.list(NODES)] == [NODES + "a"]
        await a.beat()
        assert a.conflicts == 0

    asyncio.run(go())


def test_the_default_intervals_see_a_crash_within_45_seconds() -> None:
    """ttl (2 heartbeats + SKEW) plus one listing, waits never longer than
    their interval (docs/scale-out.md#membership)."""
    settings = TierSettings()
    m = Membership.of(LocalDirStore(Path("unused")), "a", "http://a:9100", settings)
    assert (m.interval, m.listing) == (10.0, 20.0)
    assert m.ttl + m.listing == 45.0
    assert JITTER < 1
