"""The identities document in a local-directory capacity store: changes by
compare-and-swap from several nodes at once, followed, sealed; the key file."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from tiering.capacity import LocalDirStore
from tiering.errors import CapacityConflict
from tiering.identity.errors import NoSuchUser, SecretsKeyMismatch, UserExists
from tiering.identity.policy import PolicyError, Principal
from tiering.identity.sealing import Sealer, load_key
from tiering.identity.state import State
from tiering.identity.store import NAME, Identities


async def _nodes(root: Path, count: int, key: bytes | None = None) -> list[Identities]:
    key = key or os.urandom(32)
    nodes = []
    for _ in range(count):
        store = LocalDirStore(root)
        await store.start()
        node = Identities(store, Sealer(key))
        await node.start()
        nodes.append(node)
    return nodes


def test_concurrent_changes_from_several_nodes_all_land(tmp_path: Path) -> None:
    async def scenario() -> None:
        nodes = await _nodes(tmp_path / "store", 4)
        # Every node creates users at once, from a document it read before the others wrote.
        await asyncio.gather(*(node.change(lambda s, i=i, n=n: s.create_user(f"u{i}-{n}", ["read-only"], 0))
                               for i, node in enumerate(nodes) for n in range(5)))
        for node in nodes:
            await node.refresh()
        assert {frozenset(node.state.users) for node in nodes} == {
            frozenset(f"u{i}-{n}" for i in range(4) for n in range(5))}
        assert len({node.state.version for node in nodes}) == 1
        assert nodes[0].state.version == 20  # one version per change, none lost
        with pytest.raises(UserExists):
            await nodes[1].change(lambda s: s.create_user("u0-0", [], 0))
        with pytest.raises(NoSuchUser):
            await nodes[2].change(lambda s: s.delete_user("ghost"))
        with pytest.raises(PolicyError):
            await nodes[3].change(lambda s: s.put_bucket_policy("b", '{"Statement": []}'))

    asyncio.run(scenario())


def test_a_key_made_on_one_node_is_served_by_another_after_it_reads(tmp_path: Path) -> None:
    async def scenario() -> None:
        one, two = await _nodes(tmp_path / "store", 2)
        await one.change(lambda s: s.create_user("alice", ["read-only:data"], 0))
        access_key, secret = await one.add_key("alice")
        assert one.directory.secret(access_key) == secret
        assert two.directory.secret(access_key) is None  # not read yet
        assert await two.refresh()
        assert two.directory.secret(access_key) == secret
        assert two.directory.allows(Principal("user", "alice"), "s3:GetObject", "data", "k")
        assert not await two.refresh()  # unchanged: nothing rebuilt
        # At rest the secret is sealed, the access key id is not.
        stored = (tmp_path / "store" / NAME).read_bytes()
        assert access_key.encode() in stored and secret.encode() not in stored
        pushed: list[bytes] = []
        two.subscribe(pushed.append)
        new_key, _ = await two.add_key("alice", replacing=access_key)
        assert pushed and new_key.encode() in pushed[-1]
        await one.refresh()
        assert one.directory.secret(access_key) is None

    asyncio.run(scenario())


def test_a_retried_write_that_landed_is_recognised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conditional write whose answer was lost and that was retried is told
    it conflicted with itself: the change is not made twice."""
    async def scenario() -> None:
        (node,) = await _nodes(tmp_path / "store", 1)
        real = LocalDirStore.put_conditional

        async def landed_then_conflict(self, name, data, expect):  # type: ignore[no-untyped-def]
            await real(self, name, data, expect)
            raise CapacityConflict("lost answer", name=name)

        monkeypatch.setattr(LocalDirStore, "put_conditional", landed_then_conflict)
        await node.change(lambda s: s.create_user("once", [], 0))
        monkeypatch.setattr(LocalDirStore, "put_conditional", real)
        assert node.state.version == 1 and "once" in node.state.users

    asyncio.run(scenario())


def test_another_secrets_key_is_refused_at_start_and_ignored_later(tmp_path: Path) -> None:
    async def scenario() -> None:
        (first,) = await _nodes(tmp_path / "store", 1)
        await first.change(lambda s: s.create_user("bob", [], 0))
        await first.add_key("bob")
        with pytest.raises(SecretsKeyMismatch):
            await _nodes(tmp_path / "store", 1)
        # A node already serving keeps its version when the document turns unusable.
        store = LocalDirStore(tmp_path / "store")
        await store.start()
        data, tag = await store.read_versioned(NAME)
        state = State.decode(data)
        state.key_check = "0" * 16
        await store.put_conditional(NAME, state.encode(), tag)
        version = first.state.version
        assert not await first.refresh()
        assert first.state.version == version

    asyncio.run(scenario())


def test_the_key_file_is_made_once_private_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "secrets.key"
    key = load_key(path)
    assert len(key) == 32 and load_key(path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("not a key\n")
    with pytest.raises(ValueError, match="does not hold"):
        load_key(path)
    sealer = Sealer(key)
    sealed = sealer.seal("AK1", "s3cret")
    assert sealer.open("AK1", sealed) == "s3cret"
    with pytest.raises(SecretsKeyMismatch):
        sealer.open("AK2", sealed)  # bound to its key id
    with pytest.raises(SecretsKeyMismatch):
        Sealer(os.urandom(32)).open("AK1", sealed)
