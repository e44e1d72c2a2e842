"""The snapshot of identities the data plane asks, once per request.

Built from one version of the document (``state.py``), its secrets opened
and its policies parsed once, so that a question costs dictionary lookups:
whose is this access key and what is its secret (signature checks), and
may this principal take this action on this bucket or object
(:meth:`Directory.allows`, by ``policy.decide``). A snapshot never
changes; a new version of the document makes a new one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from tiering.identity.errors import SecretsKeyMismatch
from tiering.identity.policy import ARN, Policy, PolicyError, Principal, decide, parse
from tiering.identity.sealing import Sealer
from tiering.identity.state import State

log = logging.getLogger("tierstore.identity")


@dataclass(frozen=True, slots=True)
class KeyEntry:
    user: str
    secret: str | None  # None: it could not be opened (another secrets key)
    enabled: bool


@dataclass(frozen=True, slots=True)
class UserEntry:
    principal: Principal
    enabled: bool
    policies: tuple[Policy, ...]


@dataclass(frozen=True, slots=True)
class BucketEntry:
    policy: Policy | None
    public: bool  # the bucket's canned ACL is public-read: anyone may list it
    objects: frozenset[str]  # its objects whose canned ACL is public-read


def resource(bucket: str, key: str = "") -> str:
    """The ARN of a bucket, of an object, or (no bucket) of every bucket."""
    if not bucket:
        return ARN + "*"
    return f"{ARN}{bucket}/{key}" if key else ARN + bucket


class Directory:
    """One version of the identities, ready to be asked."""

    def __init__(self, state: State, sealer: Sealer | None) -> None:
        self.version = state.version
        self.problems: list[str] = []  # what could not be used, said once in the log
        self.keys: dict[str, KeyEntry] = {}
        self.users: dict[str, UserEntry] = {}
        self.buckets: dict[str, BucketEntry] = {}
        for user in state.users.values():
            policies = []
            for name in user.policies:
                try:
                    policies.append(parse(state.policy_document(name)))
                except Exception as exc:  # noqa: BLE001  (a policy deleted or broken by hand: the rest holds)
                    self.problems.append(f"user {user.name}: policy {name}: {exc}")
            self.users[user.name] = UserEntry(Principal("user", user.name), user.enabled, tuple(policies))
            for key in user.keys.values():
                secret = None
                if sealer is not None:
                    try:
                        secret = sealer.open(key.access_key, key.sealed)
                    except (SecretsKeyMismatch, ValueError) as exc:
                        self.problems.append(str(exc))
                self.keys[key.access_key] = KeyEntry(user.name, secret, key.enabled)
        for name, access in state.buckets.items():
            policy = None
            if access.policy is not None:
                try:
                    policy = parse(access.policy, name)
                except PolicyError as exc:
                    self.problems.append(f"bucket {name}: policy: {exc}")
            public = frozenset(k for k, acl in access.objects.items() if acl == "public-read")
            self.buckets[name] = BucketEntry(policy, access.acl == "public-read", public)

    def secret(self, access_key: str) -> str | None:
        """The secret of an enabled key (of an enabled or disabled user)."""
        entry = self.keys.get(access_key)
        return entry.secret if entry is not None and entry.enabled else None

    def user_of(self, access_key: str) -> UserEntry | None:
        entry = self.keys.get(access_key)
        return self.users.get(entry.user) if entry is not None else None

    def public(self, bucket: str) -> bool:
        """Whether anything of the bucket may be read by anyone (its policy
        allows "*", or an ACL of it or of one of its objects is public-read)."""
        entry = self.buckets.get(bucket)
        return entry is not None and (entry.public or bool(entry.objects)
                                      or (entry.policy is not None and entry.policy.public))

    def allows(self, who: Principal, action: str, bucket: str, key: str = "",
               context: Mapping[str, str] | None = None) -> bool:
        """Whether ``who`` may take ``action`` (``s3:...``) on the bucket,
        or on its object ``key`` when given."""
        policies: tuple[Policy, ...] = ()
        if who.kind == "user":
            user = self.users.get(who.name)
            if user is None or not user.enabled:
                return False
            policies = user.policies
        entry = self.buckets.get(bucket) if bucket else None
        grants = False
        if entry is not None:
            if entry.policy is not None:
                policies = (*policies, entry.policy)
            grants = (action == "s3:ListBucket" and not key and entry.public) or (
                action == "s3:GetObject" and key in entry.objects)
        if who.kind == "anonymous" and not policies and not grants:
            return False  # the common refusal, without building a resource name
        return decide(who, action, resource(bucket, key), context or {}, policies, grants)


EMPTY = Directory(State(), None)
