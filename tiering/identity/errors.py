"""The identity room's failures, in the one hierarchy (``tiering.errors``).

The admin API maps each to its JSON error code (``gateway/admin/errors.py``);
none reaches the S3 port, where a refusal is always AccessDenied."""

from __future__ import annotations

from tiering.errors import InvalidRequest, TierstoreError


class IdentityError(TierstoreError):
    """A change to users, keys or policies that cannot be made."""


class NoSuchUser(IdentityError):
    pass


class NoSuchAccessKey(IdentityError):
    pass


class NoSuchPolicy(IdentityError):
    pass


class UserExists(IdentityError):
    pass


class PolicyInUse(IdentityError):
    """A named policy still attached to users cannot be deleted."""


class InvalidName(IdentityError, InvalidRequest):
    """A user or policy name outside IAM's characters, or a reserved one; a
    limit reached (keys of a user, object ACLs of a bucket). An
    InvalidRequest too, should it reach the S3 port."""


class SecretsKeyMismatch(IdentityError):
    """The secrets in the store were sealed with another key than this node's."""
