"""Opening the node's storage from the configuration: the capacity store
client, the tiering node, and the offline rebuild (`tierstore recover`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.client.admin import client_tls
from gateway.config.values import Config, tier_settings
from tiering.capacity import CapacityStore, open_capacity
from tiering.cluster.peers import Keys, PeerClient, PeerGroup
from tiering.cluster.push import Pusher
from tiering.index.db import Index
from tiering.maintenance.recover import RecoveryReport, recover
from tiering.node import Node


def capacity_store(config: Config) -> CapacityStore:
    return open_capacity(
        config.capacity_url,
        endpoint=config.capacity_endpoint,
        region=config.capacity_region,
        access_key=config.capacity_access_key,
        secret_key=config.capacity_secret_key,
        part_size=config.part_size,
        connections=tier_settings(config).store_connections,
    )


def open_node(config: Config) -> Node:
    """The node's tiering (not started yet), with peers when this gateway
    is one of several (read misses then ask an extent's owner first): the
    fixed ``peers``, or, with a node id and no peers, the live nodes of the
    node registry, this one alone until others are listed."""
    peers = None
    settings = tier_settings(config)
    if config.node_id is not None and config.node_id in config.peers and len(config.peers) > 1:
        peers = peer_client(config, config.peers)
    elif config.registry and settings.advertise_url is not None:
        peers = peer_client(config, {config.node_id: settings.advertise_url})  # type: ignore[dict-item]
    return Node(config.data_dir, settings, capacity_store(config), config.region, peers, pusher(config))


def pusher(config: Config) -> Pusher | None:
    """With a node id: the notices this node sends the others when it
    changes what they follow, signed as ``peer_client``'s requests are; to
    the fixed ``peers``, or (set by the node) the live nodes of the registry."""
    if config.node_id is None:
        return None
    access_key, secret_key = next(iter(config.credentials.items()))
    sent = Pusher(config.node_id, config.region, Keys(access_key, secret_key, None), client_tls(config.tls_ca))
    if config.peers:
        peers = dict(config.peers)
        sent.use(lambda: peers)
    return sent


def peer_client(config: Config, endpoints: Mapping[str, str]) -> PeerClient:
    """Requests to the other gateways of ``endpoints`` (this one, by its
    node id, among them), signed with this gateway's first key pair: the
    nodes of one group accept the same pairs. https peers are verified
    with ``tls_ca`` (else the system's CAs)."""
    assert config.node_id is not None
    access_key, secret_key = next(iter(config.credentials.items()))
    keys = Keys(access_key, secret_key, None)
    return PeerClient(PeerGroup(config.node_id, dict(endpoints)), config.region, keys, tls=client_tls(config.tls_ca),
                      connections=config.peer_connections)


async def run_recover(config: Config, progress: Callable[[int, int], None] | None = None) -> RecoveryReport:
    """Rebuild ``config.data_dir``'s index from the capacity store."""
    store = capacity_store(config)
    await store.start()
    try:
        index = Index(config.data_dir / "index")
        try:
            return await recover(store, index, config.region, progress)
        finally:
            index.close()
    finally:
        await store.close()
