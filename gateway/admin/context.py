"""What admin routes share: the configuration and the running data plane."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.admin.errors import AdminError
from gateway.config import Config
from gateway.metrics import Metrics
from tiering.objects import ObjectService


class S3Status(Protocol):
    """What the admin API needs of the S3 data plane (``gateway.app.S3App``)."""

    @property
    def started(self) -> bool: ...

    @property
    def service(self) -> ObjectService | None: ...

    @property
    def metrics(self) -> Metrics: ...


@dataclass(frozen=True, slots=True)
class AdminContext:
    config: Config
    s3: S3Status

    def service(self) -> ObjectService:
        """The object service, or 503 while the gateway starts or stops."""
        service = self.s3.service
        if service is None:
            raise AdminError("Unavailable", "the gateway is starting or stopping; retry shortly")
        return service
