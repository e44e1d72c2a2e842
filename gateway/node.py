"""The gateway process's root: what its S3 app, admin API and read workers share.

gateway/server.py builds one :class:`Node` and hands it to each of them; the
node starts and stops the object service, and nothing else builds or holds
one.
"""

from __future__ import annotations

import logging

from gateway.auth.access import Access
from gateway.config.values import Config
from gateway.handlers.context import Context
from gateway.observability.accesslog import AccessLog
from gateway.observability.metrics import Metrics
from gateway.serving.listener import StartupError
from gateway.serving.memory import MemoryBudget
from gateway.storage import open_node
from tiering import pool
from tiering.cluster.push import IDENTITY, SEGMENTS
from tiering.errors import CapacityError
from tiering.identity.errors import SecretsKeyMismatch
from tiering.identity.sealing import Sealer, load_key, loose_permissions
from tiering.identity.store import BESIDE_HEAD, Identities
from tiering.maintenance.tiers import ForeignSegments
from tiering.memo import CACHES
from tiering.node import Node as Tiering

log = logging.getLogger("tierstore.node")


class Node:
    """One gateway's configuration, metrics and access log, and, between
    :meth:`start` and :meth:`stop`, its tiering (``tiering.node.Node``:
    the object service and everything behind it).

    ``tiering`` and ``context`` (what the S3 handlers get) are None while
    the service is down: before start, during start-up and from the
    beginning of stop. They are plain attributes, read once per request,
    and only :meth:`start` and :meth:`stop` set them.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = Metrics()
        self.access_log = AccessLog(config.access_log)
        # The process's memory against its budget (gateway/serving/memory.py).
        self.memory = MemoryBudget(config.memory_limit)
        self.tiering: Tiering | None = None
        self.context: Context | None = None
        # Users, keys and policies (tiering/identity), in the capacity store.
        self.identities: Identities | None = None
        # With read workers, nothing answers on the S3 port until they
        # listen (gateway/server.py says when).
        self._workers_listening = config.workers <= 1

    @property
    def started(self) -> bool:
        """Serving S3: the service is up, and the read workers listen if there are any."""
        return self.context is not None and self._workers_listening

    def workers_listening(self) -> None:
        """The read workers listen on the S3 port."""
        self._workers_listening = True

    async def start(self) -> None:
        """Open the data directory and start the object service."""
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        CACHES.configure(self.config.cache_sizes)
        tiering = open_node(self.config)
        try:
            await tiering.start()
        except (ForeignSegments, CapacityError) as exc:
            # Not serving is the safe answer; say why in one line.
            await tiering.close()
            raise StartupError(str(exc)) from exc
        try:
            identities = await self._identities(tiering)
        except BaseException:
            await tiering.close()
            raise
        self.tiering, self.identities = tiering, identities
        access = Access(self.config.credentials, lambda: identities.directory)
        self.context = Context(self.config, tiering.objects, access, identities, self._heard)
        epochs = tiering.epochs
        self.metrics.unmatched_reads = lambda: epochs.unmatched_reads
        await self.memory.start()

    async def _identities(self, tiering: Tiering) -> Identities:
        """The identities document of the capacity store, read, and followed
        when other nodes may change it: at once when one of them says it
        did, else when the follow head, read every follow fallback, says so
        (and read itself every BESIDE_HEAD fallbacks)."""
        path = self.config.secrets_key_path
        try:
            key = await pool.run(load_key, path)
        except ValueError as exc:
            raise StartupError(str(exc)) from exc
        if await pool.run(loose_permissions, path):
            log.warning("the secrets key file %s may be read by others than its owner: chmod 600 it", path)
        cluster = tiering.tiers.cluster
        interval = self.config.follow_fallback * BESIDE_HEAD if cluster is not None else None
        identities = Identities(tiering.tiers.capacity, Sealer(key), interval)
        pusher = tiering.pusher
        if pusher is not None:
            identities.tell(lambda: pusher.push(IDENTITY))
        if cluster is not None:
            identities.tell(lambda: cluster.publisher.identity(identities.tag))
            cluster.watch.on_identity(identities.nudge)
        try:
            await identities.start()
        except SecretsKeyMismatch as exc:
            raise StartupError(f"{exc} (this node's: {path})") from exc
        except (CapacityError, ValueError) as exc:
            raise StartupError(f"cannot read the identities document from the capacity store: {exc}") from exc
        return identities

    def _heard(self, news: str) -> bool:
        """Another node's notice (``gateway/handlers/news.py``) that what
        this one follows changed; False for news it does not know."""
        tiering, identities = self.tiering, self.identities
        cluster = tiering.tiers.cluster if tiering is not None else None
        if news == SEGMENTS and cluster is not None:
            cluster.watch.nudge()
        elif news == IDENTITY and identities is not None and identities.interval is not None:
            identities.nudge()
        else:
            return False
        return True

    async def stop(self) -> None:
        """Close the object service."""
        # Dropped first: while the service closes, the S3 app and the admin
        # API answer 503 rather than reach into an index being closed.
        self.context = None
        identities, self.identities = self.identities, None
        if identities is not None:
            await identities.stop()
        tiering, self.tiering = self.tiering, None
        if tiering is not None:
            await tiering.close()
        await self.memory.stop()
