"""The gateway process's root: what its S3 app, admin API and read workers share.

gateway/server.py builds one :class:`Node` and hands it to each of them; the
node starts and stops the object service, and nothing else builds or holds
one.
"""

from __future__ import annotations

from gateway.accesslog import AccessLog
from gateway.config import Config
from gateway.context import Context
from gateway.listener import StartupError
from gateway.metrics import Metrics
from gateway.storage import open_node
from tiering.errors import CapacityError
from tiering.maintenance.tiers import ForeignSegments
from tiering.node import Node as Tiering


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
        self.tiering: Tiering | None = None
        self.context: Context | None = None
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
        tiering = open_node(self.config)
        try:
            await tiering.start()
        except (ForeignSegments, CapacityError) as exc:
            # Not serving is the safe answer; say why in one line.
            await tiering.close()
            raise StartupError(str(exc)) from exc
        self.tiering = tiering
        self.context = Context(self.config, tiering.objects)
        epochs = tiering.epochs
        self.metrics.unmatched_reads = lambda: epochs.unmatched_reads

    async def stop(self) -> None:
        """Close the object service."""
        # Dropped first: while the service closes, the S3 app and the admin
        # API answer 503 rather than reach into an index being closed.
        self.context = None
        tiering, self.tiering = self.tiering, None
        if tiering is not None:
            await tiering.close()
