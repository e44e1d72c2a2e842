"""What staying a cluster costs the store at 4 to 1,024 nodes: a simulation.

Many nodes in one process over one in-memory capacity store
(``_memory_store.MemoryStore``: S3's ETags, LastModified, conditional
writes, reads and deletes, listings in pages of 1,000, every request
counted by operation and prefix), on a simulated clock: the event loop's
clock (``SimLoop``) jumps to the next timer whenever nothing is ready, so
simulated minutes take seconds. Each node runs the real code of what an
idle node does:

- ``Membership`` (``tiering/cluster/members.py``) whole: heartbeats,
  listings, reads of changed entries, collection, its own timers.
- Following: the loop of ``Cluster._run`` with the real ``Head`` and
  ``Watch`` (``head.py``, ``news.py``): a tick every ``min(follow_interval,
  lease_ttl / 6)``, the conditional read of the follow head every
  ``follow_fallback``. A follow round itself (listing terms and segments,
  applying footers) needs a node's index and is not run: it is counted
  (``rounds``), and an idle node runs none.
- The writer of one bucket (node 0): its ``Lease`` taken with a term
  claimed by ``Terms``, and renewed as ``Cluster._renew`` does (every
  ``lease_ttl / 3``, checked each tick); its ``Publisher`` updates the head
  and "pushes" by nudging the other nodes' ``Watch`` directly (the peer
  channel is HTTP between nodes, not the store).
- ``Identities`` (``tiering/identity/store.py``) whole, wired to the head
  as ``gateway/node.py`` wires it: one user created by node 0, whose new
  version the head names; each node reads the document itself every
  ``BESIDE_HEAD`` fallbacks. The pool's thread hop runs inline
  (``tiering.pool.run`` patched), as nothing here may wait for a thread
  while the clock jumps.

Per node count: after a warm-up, ``--seconds`` of idle time counted; then,
``--events`` times, a node joins, leaves cleanly, and another crashes (its
tasks cancelled, its entry left), each timed until every other node's
membership subscribers (what the peer client follows) have been told; the
longest of each kind is reported.

Reported: store requests per node per second by kind, for the cluster, $/day
at S3's request prices (us-east-1 Standard: PUT, COPY, POST, LIST $0.005 per
1,000; GET and HEAD $0.0004 per 1,000; DELETE free), the busiest prefix
against S3's per-prefix limits (3,500 PUT/COPY/POST/DELETE and 5,500
GET/HEAD a second; LISTs counted with GETs, an assumption: S3 publishes no
separate LIST rate), and against the same limits for the bucket as a whole
(a bucket S3 has not partitioned yet), and the join, leave and crash times.

Run:  .venv/bin/python benchmarks/cluster_cost.py [--nodes 4 16 64 256 1024] [--seconds 300]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import random
import selectors
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from _common import machine, table, touches, write_results  # first: puts the repo root on sys.path
from _memory_store import MemoryStore, prefix_of

from tiering import pool
from tiering.cluster.head import Change, Head
from tiering.cluster.lease import Lease, check_conditional_writes
from tiering.cluster.members import Member, Membership
from tiering.cluster.news import Publisher, Watch
from tiering.cluster.terms import Terms
from tiering.errors import CapacityError
from tiering.identity.sealing import Sealer
from tiering.identity.store import BESIDE_HEAD, Identities
from tiering.settings import TierSettings

BUCKET = "data"
EVENT_LIMIT = 600.0  # simulated seconds an event may take to be seen before it counts as never
# S3 request prices, us-east-1 Standard (dollars per request), and per-prefix rates (per second).
PRICE = {"PUT": 0.005 / 1000, "POST": 0.005 / 1000, "LIST": 0.005 / 1000,
         "GET": 0.0004 / 1000, "HEAD": 0.0004 / 1000, "DELETE": 0.0}
WRITES_LIMIT, READS_LIMIT = 3500.0, 5500.0
WRITES = {"PUT", "POST", "DELETE"}  # against 3,500/s; the rest (GET, HEAD, LIST) against 5,500/s


# -- a simulated clock ------------------------------------------------------------------


class _Idle(selectors.BaseSelector):
    """A selector with nothing to wait for: asked to wait, it moves the
    loop's clock on by the wait instead (no socket here ever becomes ready)."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj, events, data=None):  # type: ignore[no-untyped-def]
        key = selectors.SelectorKey(fileobj, self._fd(fileobj), events, data)
        self._keys[key.fd] = key
        return key

    def unregister(self, fileobj):  # type: ignore[no-untyped-def]
        return self._keys.pop(self._fd(fileobj))

    def select(self, timeout: float | None = None) -> list:
        if timeout is None:
            raise RuntimeError("the simulation waits for nothing: no timer and nothing ready")
        self._loop.now += timeout
        return []

    def get_map(self):  # type: ignore[no-untyped-def]
        return self._keys

    @staticmethod
    def _fd(fileobj) -> int:  # type: ignore[no-untyped-def]
        return fileobj if isinstance(fileobj, int) else fileobj.fileno()


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is simulated: ``time()`` is ``now``, which
    moves only when every task waits, straight to the next timer."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(selector=_Idle(self))

    def time(self) -> float:
        return self.now


async def _inline(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    """``tiering.pool.run`` without the thread: a thread's answer would
    come on a clock that does not move while the loop waits for it."""
    return fn(*args, **kwargs)


# -- the nodes ----------------------------------------------------------------------


@dataclass
class Watching:
    """One event: ``node`` should appear in (``present``) or vanish from
    the live set each of ``pending`` is told."""

    node: str
    present: bool
    pending: set[str]
    started: float
    seen: dict[str, float] = field(default_factory=dict)  # observer -> seconds after the event


@dataclass
class Node:
    name: str
    membership: Membership
    head: Head
    watch: Watch
    identities: Identities
    lease: Lease | None = None
    renewed: float = 0.0
    rounds: int = 0
    task: asyncio.Task[None] | None = None


class Sim:
    """N nodes over one store, on the loop's simulated clock."""

    def __init__(self, loop: SimLoop, settings: TierSettings, latency: float) -> None:
        self.loop = loop
        self.settings = settings
        self.epoch = time.time()  # the simulated wall clock starts now
        self.store = MemoryStore(clock=self.wall, latency=latency)
        self.sealer = Sealer(os.urandom(32))
        self.nodes: dict[str, Node] = {}
        self.watching: Watching | None = None

    def wall(self) -> float:
        return self.epoch + self.loop.now

    def _told(self, observer: str) -> Callable[[dict[str, Member]], object]:
        async def told(live: dict[str, Member]) -> None:
            w = self.watching
            if w is not None and observer in w.pending and (w.node in live) == w.present:
                w.pending.discard(observer)
                w.seen[observer] = self.loop.now - w.started
        return told

    async def start(self, name: str) -> Node:
        """A node's start as ``Cluster.start`` and the gateway's make it."""
        s = self.settings
        await check_conditional_writes(self.store, name)
        membership = Membership(self.store, name, f"http://{name}:9100", s.heartbeat_interval,
                                listing=s.members_interval, wall=self.wall)
        membership.subscribe(self._told(name))
        await membership.start()
        head = Head(self.store)
        node = Node(name, membership, head, Watch(head, s.follow_interval, s.follow_fallback,
                                                  monotonic=self.loop.time),
                    Identities(self.store, self.sealer, s.follow_fallback * BESIDE_HEAD))
        node.watch.on_identity(node.identities.nudge)  # as gateway/node.py wires them
        version = await node.watch.due(now=True)
        if version is not None:
            node.rounds += 1
            node.watch.done(version)
        await node.identities.start()
        node.task = asyncio.create_task(self._follow(node))
        self.nodes[name] = node
        return node

    async def _follow(self, node: Node) -> None:
        """``Cluster._run``: renewals, then following when there is news."""
        s = self.settings
        while True:
            await node.watch.wait(min(s.follow_interval, s.lease_ttl / 6))
            try:
                if node.lease is not None and (self.loop.now - node.renewed >= s.lease_ttl / 3
                                               or not node.lease.held):
                    started = self.loop.now
                    if await node.lease.renew():
                        node.renewed = started
                version = await node.watch.due()
                if version is not None:
                    node.rounds += 1  # a follow round: lists and reads what changed (not simulated)
                    node.watch.done(version)
            except (CapacityError, OSError) as exc:
                print(f"  {node.name}: round failed ({exc})", file=sys.stderr)

    async def write(self, node: Node) -> None:
        """``node`` takes the bucket's lease (a new term), publishes it, and
        creates a user: what the other nodes then follow."""
        s = self.settings
        terms = Terms(self.store)
        node.lease = Lease(self.store, BUCKET, node.name, s.lease_ttl, skew=min(5.0, s.lease_ttl / 4),
                           wall=self.wall, monotonic=self.loop.time)
        assert await node.lease.acquire(lambda above: terms.claim(BUCKET, node.name, above))
        node.renewed = self.loop.now
        publisher = Publisher(node.head)
        others = [n for n in self.nodes.values() if n is not node]
        publisher.tell(lambda: [n.watch.nudge() for n in others])
        publisher.add(BUCKET, Change(node.lease.record.term))  # type: ignore[union-attr]
        node.identities.tell(lambda: [n.identities.nudge() for n in others])
        node.identities.tell(lambda: publisher.identity(node.identities.tag))
        await node.identities.change(lambda st: st.create_user("trainer", [], int(self.wall() * 1000)))

    async def stop(self, node: Node, clean: bool = True) -> None:
        """A clean stop (the registry entry deleted), or a crash: every task
        of the node just ends, and its entry stays for the others to judge."""
        del self.nodes[node.name]
        assert node.task is not None
        node.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await node.task
        await node.identities.stop()
        if clean:
            await node.membership.stop()
            return
        for task in node.membership._tasks:  # the process is gone: no last words
            task.cancel()

    async def event(self, node: str, present: bool, action: Callable[[], object]) -> dict:
        """Seconds until every other node is told ``node`` is (not) live."""
        watching = Watching(node, present, {n for n in self.nodes if n != node}, self.loop.now)
        self.watching = watching
        await action()  # type: ignore[misc]
        while watching.pending and self.loop.now - watching.started < EVENT_LIMIT:
            await asyncio.sleep(0.5)
        self.watching = None
        times = list(watching.seen.values())
        return {"all": None if watching.pending else round(max(times), 1),
                "median": round(statistics.median(times), 1) if times else None}


def _node(i: int) -> str:
    return f"n{i:05d}"


async def simulate(loop: SimLoop, count: int, seconds: float, warmup: float, settings: TierSettings,
                   latency: float, events: int) -> dict:
    sim = Sim(loop, settings, latency)

    async def start_later(i: int) -> None:
        await asyncio.sleep(random.uniform(0, settings.members_interval))  # nodes start over a listing interval
        await sim.start(_node(i))

    await asyncio.gather(*(start_later(i) for i in range(count)))
    await sim.write(sim.nodes[_node(0)])
    await asyncio.sleep(warmup)
    sim.store.reset()
    rounds = sum(n.rounds for n in sim.nodes.values())
    started = loop.now
    await asyncio.sleep(seconds)
    elapsed = loop.now - started
    requests = dict(sim.store.requests)
    rounds = sum(n.rounds for n in sim.nodes.values()) - rounds
    live = [len(n.membership.live()) for n in sim.nodes.values()]
    times: dict[str, list[dict]] = {"join_s": [], "leave_s": [], "crash_s": []}
    for k in range(min(events, count - 1)):  # one after the other, other nodes, other moments of their timers
        joiner, crashed = _node(count + k), _node(count - 1 - k)
        times["join_s"].append(await sim.event(joiner, True, lambda: sim.start(joiner)))
        times["leave_s"].append(await sim.event(joiner, False, lambda: sim.stop(sim.nodes[joiner])))
        times["crash_s"].append(await sim.event(crashed, False, lambda: sim.stop(sim.nodes[crashed], clean=False)))
    for node in list(sim.nodes.values()):
        await sim.stop(node)
    return summary(count, elapsed, requests) | {
        "follow_rounds": rounds, "live_seen": [min(live), max(live)],
        **{what: _worst(seen) for what, seen in times.items()},
    }


def _worst(seen: list[dict]) -> dict:
    """Over several events of a kind: the longest until all were told (None
    if one never was), and the median of the medians."""
    alls = [s["all"] for s in seen]
    return {"all": None if None in alls else max(alls),
            "median": statistics.median(s["median"] for s in seen if s["median"] is not None),
            "events": len(seen)}


def summary(count: int, elapsed: float, requests: dict[tuple[str, str], int]) -> dict:
    """Rates, cost and the busiest prefix of what was counted."""
    by_kind: collections.Counter[str] = collections.Counter()
    by_operation: collections.Counter[str] = collections.Counter()
    writes: collections.Counter[str] = collections.Counter()
    reads: collections.Counter[str] = collections.Counter()
    for (operation, name), n in requests.items():
        by_kind[f"{operation} {touches(name)}"] += n
        by_operation[operation] += n
        (writes if operation in WRITES else reads)[name if operation == "LIST" else prefix_of(name)] += n
    total = sum(by_operation.values())
    per_day = 86400 / elapsed
    prefixes = [(max(writes[p] / WRITES_LIMIT, reads[p] / READS_LIMIT) / elapsed, p)
                for p in set(writes) | set(reads)]
    busiest, prefix = max(prefixes) if prefixes else (0.0, "")
    bucket = max(sum(writes.values()) / WRITES_LIMIT, sum(reads.values()) / READS_LIMIT) / elapsed
    return {
        "nodes": count, "seconds": round(elapsed, 1), "requests": total,
        "per_node_per_s": total / elapsed / count, "cluster_per_s": total / elapsed,
        "by_kind_per_node_per_s": {k: n / elapsed / count for k, n in by_kind.most_common()},
        "dollars_per_day": sum(PRICE[op] * n for op, n in by_operation.items()) * per_day,
        "busiest_prefix": prefix, "busiest_prefix_share": busiest, "bucket_share": bucket,
    }


def report(args: argparse.Namespace, results: list[dict]) -> str:
    s = results[0]["settings"]
    lines = [machine(),
             f"simulated: {args.seconds:g} s counted after {args.warmup:g} s, store latency {args.latency:g} s; "
             f"heartbeat {s['heartbeat_interval']:g} s, listing {s['members_interval']:g} s, "
             f"fallback {s['follow_fallback']:g} s, lease ttl {s['lease_ttl']:g} s; one writer, one user"]
    kinds = sorted({k for r in results for k in r["by_kind_per_node_per_s"]})
    lines.append(table(
        ["nodes", "requests / node / s", *kinds, "cluster / s", "$ / day", "busiest prefix (% of limit)",
         "bucket (% of limit)", "join / leave / crash seen by all (s)"],
        [[f"{r['nodes']:,}", f"{r['per_node_per_s']:.3f}",
          *(f"{r['by_kind_per_node_per_s'].get(k, 0):.3f}" for k in kinds),
          f"{r['cluster_per_s']:,.1f}", f"{r['dollars_per_day']:,.2f}",
          f"{r['busiest_prefix']} {100 * r['busiest_prefix_share']:.2f}%", f"{100 * r['bucket_share']:.2f}%",
          " / ".join(str(r[e]["all"]) for e in ("join_s", "leave_s", "crash_s"))]
         for r in results]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 16, 64, 256, 1024])
    ap.add_argument("--seconds", type=float, default=300.0, help="simulated idle seconds counted (default 300)")
    ap.add_argument("--warmup", type=float, default=60.0, help="simulated seconds before counting (default 60)")
    ap.add_argument("--latency", type=float, default=0.02, help="seconds a store request takes (default 0.02)")
    ap.add_argument("--heartbeat", type=float, help="heartbeat_interval (default: the settings' default)")
    ap.add_argument("--listing", type=float, help="members_interval (default: the settings' default)")
    ap.add_argument("--fallback", type=float, help="follow_fallback (default: the settings' default)")
    ap.add_argument("--events", type=int, default=3,
                    help="joins, leaves and crashes timed, each kind (default 3; the longest is reported)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    overrides = {name: value for name, value in (("heartbeat_interval", args.heartbeat),
                 ("members_interval", args.listing), ("follow_fallback", args.fallback)) if value is not None}
    settings = TierSettings(**overrides)
    pool.run = _inline  # type: ignore[assignment]
    results = []
    for count in args.nodes:
        random.seed(args.seed)
        loop = SimLoop()
        began = time.monotonic()
        try:
            result = loop.run_until_complete(simulate(loop, count, args.seconds, args.warmup, settings,
                                                      args.latency, args.events))
        finally:
            loop.close()
        result["settings"] = {k: getattr(settings, k) for k in
                              ("heartbeat_interval", "members_interval", "follow_fallback", "lease_ttl")}
        result["real_seconds"] = round(time.monotonic() - began, 1)
        results.append(result)
        print(f"{count:,} nodes: {result['per_node_per_s']:.3f} requests per node per second; "
              f"{result['follow_rounds']} follow rounds while idle; live sets {result['live_seen']}; "
              f"join {result['join_s']}, leave {result['leave_s']}, crash {result['crash_s']} "
              f"({result['real_seconds']} s to simulate)", flush=True)
    print(report(args, results))
    write_results(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
