"""The one document of identities: users and their keys, named policies,
bucket policies and canned ACLs, and the changes to it.

The whole state is one JSON document (``identity/state`` in the capacity
store, ``store.py``): a change is a compare-and-swap of the whole of it,
so any change is atomic and every node reads one consistent version. It
stays small (users, keys, policies of a few KiB each); object ACLs are
bounded per bucket (``MAX_OBJECT_ACLS``) because they live here too.

Every method that changes the state checks what it is given and raises an
``IdentityError`` (or ``PolicyError``) before changing anything.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tiering.identity import builtin
from tiering.identity.errors import (
    InvalidName,
    NoSuchAccessKey,
    NoSuchPolicy,
    NoSuchUser,
    PolicyInUse,
    UserExists,
)
from tiering.identity.policy import parse

FORMAT = 1
# IAM's characters for user and policy names; a ":" is left to the
# ready-made policies (``read-only:<bucket>``).
_USER_NAME = re.compile(r"[A-Za-z0-9+=,.@_-]{1,64}")
_POLICY_NAME = re.compile(r"[A-Za-z0-9+=,.@_-]{1,128}")
CANNED = ("private", "public-read")
# Objects of one bucket with an ACL of their own (public-read): kept in the
# document, so bounded; a public data set is a bucket policy or the bucket's ACL.
MAX_OBJECT_ACLS = 10_000
MAX_KEYS_PER_USER = 10
MAX_POLICIES_PER_USER = 20


@dataclass(slots=True)
class Key:
    access_key: str
    sealed: str  # the secret, sealed (sealing.py)
    created_ms: int
    enabled: bool = True


@dataclass(slots=True)
class User:
    name: str
    created_ms: int
    enabled: bool = True
    policies: list[str] = field(default_factory=list)
    keys: dict[str, Key] = field(default_factory=dict)


@dataclass(slots=True)
class NamedPolicy:
    document: str  # JSON text, as given
    created_ms: int


@dataclass(slots=True)
class BucketAccess:
    """A bucket's policy and canned ACLs: ``acl`` the bucket's own, ``objects``
    those of its objects that are not private."""

    policy: str | None = None
    acl: str = "private"
    objects: dict[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.policy is None and self.acl == "private" and not self.objects


@dataclass(slots=True)
class State:
    version: int = 0  # goes up by one at every change
    key_check: str = ""  # the check value of the key the secrets are sealed under
    nonce: str = ""  # the writer's mark: tells our own write from another's
    users: dict[str, User] = field(default_factory=dict)
    policies: dict[str, NamedPolicy] = field(default_factory=dict)
    buckets: dict[str, BucketAccess] = field(default_factory=dict)

    # -- encoding --------------------------------------------------------------------------

    def encode(self) -> bytes:
        plain = {
            "format": FORMAT, "version": self.version, "key_check": self.key_check, "nonce": self.nonce,
            "users": {n: {"created_ms": u.created_ms, "enabled": u.enabled, "policies": u.policies,
                          "keys": {k.access_key: {"sealed": k.sealed, "created_ms": k.created_ms,
                                                  "enabled": k.enabled} for k in u.keys.values()}}
                      for n, u in self.users.items()},
            "policies": {n: {"document": p.document, "created_ms": p.created_ms} for n, p in self.policies.items()},
            "buckets": {n: {"policy": b.policy, "acl": b.acl, "objects": b.objects}
                        for n, b in self.buckets.items() if not b.empty},
        }
        return json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> State:
        """ValueError if ``data`` is not a document of this format."""
        try:
            plain: dict[str, Any] = json.loads(data)
            if plain.get("format") != FORMAT:
                raise ValueError(f"identity document of format {plain.get('format')!r}, expected {FORMAT}")
            users = {
                name: User(name, int(u["created_ms"]), bool(u["enabled"]), [str(p) for p in u["policies"]],
                           {ak: Key(ak, str(k["sealed"]), int(k["created_ms"]), bool(k["enabled"]))
                            for ak, k in u["keys"].items()})
                for name, u in plain["users"].items()
            }
            policies = {n: NamedPolicy(str(p["document"]), int(p["created_ms"])) for n, p in plain["policies"].items()}
            buckets = {n: BucketAccess(None if b["policy"] is None else str(b["policy"]), str(b["acl"]), {str(k): str(v) for k, v in b["objects"].items()})
                       for n, b in plain["buckets"].items()}
            return cls(int(plain["version"]), str(plain["key_check"]), str(plain["nonce"]), users, policies, buckets)
        except (KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise ValueError(f"malformed identity document: {exc!r}") from None

    def copy(self) -> State:
        return State.decode(self.encode())

    # -- users -----------------------------------------------------------------------------

    def user(self, name: str) -> User:
        found = self.users.get(name)
        if found is None:
            raise NoSuchUser(f"no user {name!r}")
        return found

    def create_user(self, name: str, policies: list[str], now_ms: int) -> User:
        if not _USER_NAME.fullmatch(name):
            raise InvalidName(f"invalid user name {name!r}: 1 to 64 of A-Z a-z 0-9 + = , . @ _ -")
        if name in self.users:
            raise UserExists(f"a user {name!r} exists")
        self._check_policies(policies)
        user = self.users[name] = User(name, now_ms, policies=list(dict.fromkeys(policies)))
        return user

    def delete_user(self, name: str) -> None:
        self.user(name)
        del self.users[name]

    def update_user(self, name: str, enabled: bool | None = None, policies: list[str] | None = None) -> User:
        user = self.user(name)
        if policies is not None:
            self._check_policies(policies)
            user.policies = list(dict.fromkeys(policies))
        if enabled is not None:
            user.enabled = enabled
        return user

    def attach(self, name: str, policy: str) -> User:
        user = self.user(name)
        if policy not in user.policies:
            self._check_policies([*user.policies, policy])
            user.policies.append(policy)
        return user

    def detach(self, name: str, policy: str) -> User:
        user = self.user(name)
        if policy not in user.policies:
            raise NoSuchPolicy(f"user {name!r} has no policy {policy!r}")
        user.policies.remove(policy)
        return user

    def _check_policies(self, names: list[str]) -> None:
        if len(set(names)) > MAX_POLICIES_PER_USER:
            raise InvalidName(f"a user has at most {MAX_POLICIES_PER_USER} policies")
        for name in names:
            if name not in self.policies and builtin.document(name) is None:
                raise NoSuchPolicy(f"no policy {name!r} (ready-made: read-only, read-write, "
                                   "read-only:<bucket>, read-write:<bucket>)")

    # -- keys ------------------------------------------------------------------------------

    def owner_of(self, access_key: str) -> User | None:
        return next((u for u in self.users.values() if access_key in u.keys), None)

    def key(self, name: str, access_key: str) -> Key:
        found = self.user(name).keys.get(access_key)
        if found is None:
            raise NoSuchAccessKey(f"user {name!r} has no access key {access_key!r}")
        return found

    def add_key(self, name: str, access_key: str, sealed: str, now_ms: int) -> Key:
        user = self.user(name)
        if len(user.keys) >= MAX_KEYS_PER_USER:
            raise InvalidName(f"a user has at most {MAX_KEYS_PER_USER} access keys; revoke one first")
        if self.owner_of(access_key) is not None:  # 90 random bits: never, but never twice either
            raise UserExists(f"access key {access_key} exists")
        key = user.keys[access_key] = Key(access_key, sealed, now_ms)
        return key

    def set_key(self, name: str, access_key: str, enabled: bool) -> Key:
        key = self.key(name, access_key)
        key.enabled = enabled
        return key

    def revoke_key(self, name: str, access_key: str) -> None:
        self.key(name, access_key)
        del self.users[name].keys[access_key]

    # -- named policies ----------------------------------------------------------------------

    def put_policy(self, name: str, document: str, now_ms: int) -> NamedPolicy:
        if not _POLICY_NAME.fullmatch(name) or builtin.is_builtin(name):
            raise InvalidName(f"invalid policy name {name!r}: 1 to 128 of A-Z a-z 0-9 + = , . @ _ -, "
                              "and not a ready-made one's")
        parse(document)  # PolicyError: malformed
        old = self.policies.get(name)
        named = self.policies[name] = NamedPolicy(document, old.created_ms if old else now_ms)
        return named

    def delete_policy(self, name: str) -> None:
        if name not in self.policies:
            raise NoSuchPolicy(f"no policy {name!r}")
        users = sorted(u.name for u in self.users.values() if name in u.policies)
        if users:
            raise PolicyInUse(f"policy {name!r} is attached to {', '.join(users[:5])}"
                              + (f" and {len(users) - 5} more" if len(users) > 5 else ""))
        del self.policies[name]

    def policy_document(self, name: str) -> str:
        named = self.policies.get(name)
        if named is not None:
            return named.document
        text = builtin.document(name)
        if text is None:
            raise NoSuchPolicy(f"no policy {name!r}")
        return text

    # -- buckets ---------------------------------------------------------------------------

    def _bucket(self, bucket: str) -> BucketAccess:
        return self.buckets.setdefault(bucket, BucketAccess())

    def put_bucket_policy(self, bucket: str, document: str | None) -> None:
        if document is not None:
            parse(document, bucket)
        self._bucket(bucket).policy = document
        self._tidy(bucket)

    def set_bucket_acl(self, bucket: str, acl: str) -> None:
        _check_canned(acl)
        self._bucket(bucket).acl = acl
        self._tidy(bucket)

    def set_object_acl(self, bucket: str, key: str, acl: str) -> None:
        _check_canned(acl)
        access = self._bucket(bucket)
        if acl == "private":
            access.objects.pop(key, None)
        else:
            if key not in access.objects and len(access.objects) >= MAX_OBJECT_ACLS:
                raise InvalidName(f"bucket {bucket!r} has {MAX_OBJECT_ACLS} objects with an ACL of their own: "
                                  "make the bucket public with its ACL or a bucket policy instead")
            access.objects[key] = acl
        self._tidy(bucket)

    def forget_bucket(self, bucket: str) -> None:
        """A deleted bucket's policy and ACLs go with it, as in S3."""
        self.buckets.pop(bucket, None)

    def _tidy(self, bucket: str) -> None:
        if self.buckets[bucket].empty:
            del self.buckets[bucket]


def _check_canned(acl: str) -> None:
    if acl not in CANNED:
        raise InvalidName(f"canned ACL {acl!r}: this gateway has {' and '.join(CANNED)}")
