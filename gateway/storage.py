"""Opening the node's storage from the configuration: the capacity store
client, the object service, and the offline rebuild (`tierstore recover`)."""

from __future__ import annotations

from collections.abc import Callable

from gateway.config import Config, tier_settings
from tiering.capacity import CapacityStore, open_capacity
from tiering.index import Index
from tiering.objects import ObjectService
from tiering.recover import RecoveryReport, recover


def capacity_store(config: Config) -> CapacityStore:
    return open_capacity(
        config.capacity_url,
        endpoint=config.capacity_endpoint,
        region=config.capacity_region,
        access_key=config.capacity_access_key,
        secret_key=config.capacity_secret_key,
        part_size=config.part_size,
    )


def object_service(config: Config) -> ObjectService:
    return ObjectService(config.data_dir, tier_settings(config), capacity_store(config), config.region)


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
