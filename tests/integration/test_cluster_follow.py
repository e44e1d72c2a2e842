"""Following by notice, with the follow head as the fallback, and what an
idle cluster costs the store for it.

Gateway processes with node ids over one moto server, finding each other
in the node registry. A write flushed on its bucket's writer is listed on
a follower long before that follower's fallback read of the follow head
(60 s) could have found it: the writer's notice made the round (the
follower counts the notices it got). A follower the notices cannot reach
(its advertised endpoint is a closed port) finds the write through the
head, at its short fallback, and a user created meanwhile through the
head too (it names the identities document's version). Idle, a node reads
one small object per fallback interval (the head, a 304), the identities
document itself once per ``BESIDE_HEAD`` of them, and lists nothing:
counted at a proxy in front of moto, request by request.
Visibility is polled with a bound, never timed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from tests.conftest import make_client
from tests.integration.helpers import counting_proxy
from tests.integration.test_scale_out import eventually
from tests.integration.test_users_cluster import client
from tests.servers import Gateway, free_port, free_ports
from tiering.identity.store import BESIDE_HEAD
from tiering.settings import TierSettings

FOLLOW = 0.3  # the least time between two rounds (and the registry's heartbeat)
SLOW = 60.0  # a fallback no poll below waits for
QUICK = 1.5  # the fallback of the node the notices cannot reach
BOUND = 20.0  # a third of SLOW: what is seen within it came by a notice
BUCKET = "followed"


def node(root: Path, name: str, store: str, moto: str, fallback: float, advertise: str | None = None) -> Gateway:
    port, admin_port = free_ports(2)
    gw = Gateway(root / name, extra_args=[
        "--capacity", f"s3://{store}", "--capacity-endpoint", moto,
        "--capacity-access-key", "testing", "--capacity-secret-key", "testing",
        "--node-id", name, "--follow-interval", str(FOLLOW), "--follow-fallback", str(fallback),
        "--flush-delay", "0.2", "--advertise-url", advertise or f"http://127.0.0.1:{port}",
        "--secrets-key-file", str(root / "secrets.key"),
    ])
    gw.port, gw.admin_port = port, admin_port
    return gw


def new_store(moto: str, name: str) -> str:
    make_client(moto).create_bucket(Bucket=name)  # moto takes any signed request
    return name


def cluster_status(gw: Gateway) -> dict[str, Any]:
    return gw.admin("GET", "/tiers").json()["cluster"]


def all_live(nodes: list[Gateway]) -> None:
    for gw in nodes:
        assert {m["node"] for m in cluster_status(gw)["members"] if m["live"]} == {g.data_dir.name for g in nodes}


@pytest.fixture(scope="module")
def nodes(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Gateway]]:
    """f1 writes, f2 gets its notices, f3 cannot be reached by them."""
    root = tmp_path_factory.mktemp("follow")
    store = new_store(moto_endpoint, "tierstore-follow")
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    planned = [node(root, "f1", store, moto_endpoint, SLOW), node(root, "f2", store, moto_endpoint, SLOW),
               node(root, "f3", store, moto_endpoint, QUICK, advertise=closed)]
    started: list[Gateway] = []
    try:
        for gw in planned:
            started.append(gw.start((gw.port, gw.admin_port)))
        eventually(lambda: all_live(started), BOUND)
        yield started
    finally:
        for gw in started:
            gw.stop()


def test_a_write_reaches_a_follower_by_notice_and_an_unreachable_one_by_the_head(nodes: list[Gateway]) -> None:
    writer, pushed, unreached = nodes
    s3 = make_client(writer.endpoint)
    s3.create_bucket(Bucket=BUCKET)
    eventually(lambda: make_client(pushed.endpoint).head_bucket(Bucket=BUCKET), BOUND)
    before = {gw.data_dir.name: cluster_status(gw) for gw in nodes}
    s3.put_object(Bucket=BUCKET, Key="k", Body=b"followed")
    writer.flush()
    flushed = time.monotonic()
    eventually(lambda: listed_in(pushed, BUCKET, "k"), BOUND)
    print(f"listed on the notified follower {time.monotonic() - flushed:.2f} s after the flush")
    assert make_client(pushed.endpoint).get_object(Bucket=BUCKET, Key="k")["Body"].read() == b"followed"
    after = cluster_status(pushed)
    assert after["pushes"] > before["f2"]["pushes"]  # it followed because it was told

    eventually(lambda: listed_in(unreached, BUCKET, "k"), BOUND)
    assert make_client(unreached.endpoint).get_object(Bucket=BUCKET, Key="k")["Body"].read() == b"followed"
    late = cluster_status(unreached)
    assert late["pushes"] == 0  # never told: the head, read every QUICK seconds, said so
    assert late["head_looks"] > before["f3"]["head_looks"]


def test_a_user_created_on_one_node_is_served_by_the_others(nodes: list[Gateway]) -> None:
    writer, pushed, unreached = nodes
    key = writer.admin("POST", "/users", json={"name": "told", "policies": ["read-only:" + BUCKET]}).json()["key"]
    for gw in (pushed, unreached):  # by notice, and through the fallback read
        eventually(lambda gw=gw: client(gw, key).list_objects_v2(Bucket=BUCKET), BOUND)


# -- what idle costs ------------------------------------------------------------------

IDLE_FALLBACK = 2.0
INTERVALS = 5  # fallback intervals counted


def kind(method: str, target: str) -> str:
    """What a store request is for: following and identities, or the registry, or a lease."""
    parts = urlsplit(target)
    path = unquote(parts.path)
    prefix = parse_qs(parts.query).get("prefix", [""])[0]
    name = path.split("/", 2)[2] if path.count("/") >= 2 else prefix
    if name.startswith("leases/_nodes/"):
        return "registry"
    if name.startswith("leases/_head") or name.startswith("identity/"):
        if method != "GET":
            return "update"
        return "head" if name.startswith("leases/_head") else "identity"
    if name.startswith("leases/") and "/_" not in name[len("leases"):]:
        return "lease"
    return "follow"  # segment and term listings, footers, seals, terms


@pytest.fixture(scope="module")
def counted(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Gateway], Any]]:
    root = tmp_path_factory.mktemp("idle")
    with counting_proxy(moto_endpoint) as proxy:
        seen: list[tuple[str, str]] = []
        count = proxy.note_request

        def note(method: str, target: str) -> None:
            seen.append((method, target))
            count(method, target)

        proxy.note_request = note
        proxy.seen = seen
        store = new_store(moto_endpoint, "tierstore-idle")
        started: list[Gateway] = []
        try:
            for name in ("i1", "i2", "i3"):
                gw = node(root, name, store, proxy.endpoint, IDLE_FALLBACK)
                started.append(gw.start((gw.port, gw.admin_port)))
            # Until the others have listed it, a new node reads the head every
            # follow interval (their notices miss it): idle is what comes after.
            proxy.settled = time.monotonic() + TierSettings().members_interval
            yield started, proxy
        finally:
            for gw in started:
                gw.stop()


def test_an_idle_node_reads_one_small_object_per_fallback_and_lists_nothing(
        counted: tuple[list[Gateway], Any]) -> None:
    nodes, proxy = counted
    s3 = make_client(nodes[0].endpoint)
    s3.create_bucket(Bucket="idle-set")
    s3.put_object(Bucket="idle-set", Key="k", Body=b"x")
    nodes[0].flush()
    nodes[0].admin("POST", "/users", json={"name": "idle", "policies": ["read-only:idle-set"]})
    for gw in nodes[1:]:
        eventually(lambda gw=gw: listed_in(gw, "idle-set", "k"), BOUND)
    time.sleep(2 * FOLLOW + 2 * IDLE_FALLBACK)  # the rounds the notices asked for are over
    time.sleep(max(0.0, proxy.settled - time.monotonic()))  # and the nodes' first listing interval
    rounds = [cluster_status(gw)["follow_rounds"] for gw in nodes]
    del proxy.seen[:]
    started = time.monotonic()
    time.sleep(INTERVALS * IDLE_FALLBACK)
    seen, elapsed = list(proxy.seen), time.monotonic() - started
    kinds: dict[str, int] = {}
    for method, target in seen:
        kinds[kind(method, target)] = kinds.get(kind(method, target), 0) + 1
    following = sum(kinds.get(k, 0) for k in ("head", "identity", "follow", "update"))
    per_node = following / len(nodes) / elapsed
    print(f"idle, {len(nodes)} nodes, {elapsed:.1f} s, fallback {IDLE_FALLBACK} s: {kinds}; following and "
          f"identities {per_node:.3f} requests per node per second "
          f"({per_node * IDLE_FALLBACK:.2f} per fallback interval)")
    assert kinds.get("follow", 0) == 0 and kinds.get("update", 0) == 0, kinds  # no listing, no round
    # At most the head per node and interval begun; the identities document
    # (named in the head) per BESIDE_HEAD of them.
    assert kinds.get("head", 0) <= len(nodes) * (elapsed / IDLE_FALLBACK + 1), kinds
    assert kinds.get("identity", 0) <= len(nodes) * (elapsed / (BESIDE_HEAD * IDLE_FALLBACK) + 1), kinds
    # The registry on its defaults: a heartbeat PUT and a listing of one page
    # per node and interval begun, no GET of an entry that did not change.
    beat, listing = TierSettings().heartbeat_interval, TierSettings().members_interval
    assert kinds.get("registry", 0) <= len(nodes) * (elapsed / beat + elapsed / listing + 2), kinds
    assert [cluster_status(gw)["follow_rounds"] for gw in nodes] == rounds  # nothing changed: no round


def listed_in(gw: Gateway, bucket: str, key: str) -> None:
    assert key in [o["Key"] for o in make_client(gw.endpoint).list_objects_v2(Bucket=bucket).get("Contents", [])]
