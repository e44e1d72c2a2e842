"""What every S3 handler gets besides its request."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from gateway.auth.access import Access
from gateway.config.values import Config
from gateway.s3.http import S3Request
from gateway.s3.xml import Owner
from tiering.identity.store import Identities
from tiering.objects import ObjectService


@dataclass(slots=True)
class Context:
    config: Config
    service: ObjectService
    # Who may do what (gateway/auth/access.py): asked before every handler, and by
    # the handlers of operations on many objects.
    access: Access
    # The identities a handler changes (bucket policies, ACLs); None in a read
    # worker, which serves no such operation.
    identities: Identities | None = None
    # Another gateway's notice that something this one follows changed
    # (gateway/handlers/news.py): False for news it does not follow. None
    # in a read worker, which passes notices on to its writer.
    news: Callable[[str], bool] | None = None


def owner_ids(req: S3Request) -> tuple[str, str]:
    """What ``x-amz-expected-bucket-owner`` may name for the caller's buckets:
    the canonical id of :func:`owner_of` or its display name (the access key)."""
    owner = owner_of(req)
    return owner.id, owner.display_name


def owner_of(req: S3Request) -> Owner:
    """The canonical owner shown in listings and ACLs: one per access key."""
    access_key = req.auth.access_key if req.auth is not None else "anonymous"
    return Owner(hashlib.sha256(access_key.encode()).hexdigest(), access_key)
