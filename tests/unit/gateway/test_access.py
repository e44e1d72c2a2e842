"""The authorisation point (gateway/auth/access.py) without a server: every
routed operation has its IAM action, decisions are kept until the
identities change, and what each kind of caller may do."""

from __future__ import annotations

import json
import os

import pytest

from gateway import routes
from gateway.auth.access import ACTIONS, Access, signed
from gateway.s3.errors import S3Error
from gateway.s3.http import S3Request
from tiering.identity.directory import Directory
from tiering.identity.sealing import Sealer
from tiering.identity.state import State
from tiering.memo import Caches

# Operations a handler renames a request to (gateway/routes.py's docstring).
RENAMED = {"CopyObject", "ListObjectsV2", "UploadPartCopy"}


def test_every_operation_has_an_action() -> None:
    ops = {route.op for route in routes.TABLE.values()} | RENAMED
    assert ops - set(ACTIONS) == set(), "operations the authorisation table does not know"
    assert set(ACTIONS) - ops == set(), "actions of operations nothing routes"


def request(method: str, path: str, query: str = "", headers: dict[str, str] | None = None) -> S3Request:
    scope = {"method": method, "path": path, "raw_path": path.encode(), "query_string": query.encode(),
             "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()]}
    req = S3Request.from_scope(scope, None, "0")
    routes.address(req, None)
    req.op = routes.resolve(req).op
    return req


class Snapshots:
    """The identities as the app sees them: one snapshot, replaced on change."""

    def __init__(self) -> None:
        self.sealer = Sealer(os.urandom(32))
        self.state = State()
        self.directory = Directory(self.state, self.sealer)
        self.made = 1

    def change(self, mutate) -> None:  # type: ignore[no-untyped-def]
        mutate(self.state)
        self.state.version += 1
        self.directory = Directory(self.state, self.sealer)
        self.made += 1

    def __call__(self) -> Directory:
        return self.directory


@pytest.fixture
def snapshots() -> Snapshots:
    return Snapshots()


def user(snapshots: Snapshots, name: str, *policies: str) -> str:
    key = f"AK{name.upper()}"

    def add(state: State) -> None:
        state.create_user(name, list(policies), 0)
        state.add_key(name, key, snapshots.sealer.seal(key, "secret"), 0)

    snapshots.change(add)
    return key


def allowed(access: Access, key: str | None, method: str, path: str, query: str = "",
            headers: dict[str, str] | None = None) -> bool:
    req = request(method, path, query, headers)
    try:
        access.authorize(access.caller(key), req, req.op)
    except S3Error as exc:
        assert exc.code == "AccessDenied"
        return False
    return True


def test_root_users_and_anonymous(snapshots: Snapshots) -> None:
    access = Access({"ROOT": "root-secret"}, snapshots)
    reader = user(snapshots, "reader", "read-only:data")
    assert access.secret_for("ROOT") == "root-secret" and access.secret_for(reader) == "secret"
    assert access.secret_for("NOBODY") is None
    assert allowed(access, "ROOT", "DELETE", "/data")
    assert allowed(access, reader, "GET", "/data/k") and allowed(access, reader, "HEAD", "/data/k")
    assert allowed(access, reader, "GET", "/data", "list-type=2&prefix=a/")
    assert allowed(access, reader, "GET", "/data/k", "versionId=abc")  # s3:GetObjectVersion is a Get*
    assert not allowed(access, reader, "PUT", "/data/k")
    assert not allowed(access, reader, "GET", "/other/k")
    assert not allowed(access, reader, "GET", "/")
    # A copy needs read of its source; the source's bucket is another here.
    writer = user(snapshots, "writer", "read-write:data")
    assert allowed(access, writer, "PUT", "/data/copy", headers={"x-amz-copy-source": "/data/k"})
    assert not allowed(access, writer, "PUT", "/data/copy", headers={"x-amz-copy-source": "/other/k"})
    assert not allowed(access, writer, "PUT", "/data/copy", query="partNumber=1&uploadId=u",
                       headers={"x-amz-copy-source": "other/k%3Fx"})
    # A write that sets an ACL or tags needs those actions too (read-write has them).
    assert allowed(access, writer, "PUT", "/data/k", headers={"x-amz-acl": "public-read", "x-amz-tagging": "a=b"})
    assert not allowed(access, None, "GET", "/data/k")
    assert not allowed(access, None, "POST", "/data", "delete")
    assert not allowed(access, None, "POST", "/data", "batch")


def test_a_disabled_user_is_refused_whatever_it_asks(snapshots: Snapshots) -> None:
    access = Access({}, snapshots)
    key = user(snapshots, "off", "read-write")
    assert allowed(access, key, "GET", "/any/k")
    snapshots.change(lambda state: state.update_user("off", enabled=False))
    assert not allowed(access, key, "GET", "/any/k")
    assert access.secret_for(key) == "secret"  # its signature still checks: the refusal names it
    snapshots.change(lambda state: state.set_key("off", key, False))
    assert access.secret_for(key) is None  # a disabled key is unknown


def test_decisions_are_kept_until_the_identities_change(snapshots: Snapshots, monkeypatch) -> None:
    access = Access({}, snapshots)
    key = user(snapshots, "kept", "read-only:data")
    asked = []
    real = Directory.allows

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Directory, "allows", counting)
    for _ in range(100):
        assert allowed(access, key, "GET", "/data/k")
    assert len(asked) == 1
    snapshots.change(lambda state: state.put_policy("deny", json.dumps(
        {"Statement": {"Effect": "Deny", "Action": "*", "Resource": "*"}}), 0))
    snapshots.change(lambda state: state.attach("kept", "deny"))
    assert not allowed(access, key, "GET", "/data/k")
    assert len(asked) == 2


def test_decisions_kept_stay_within_their_byte_bound(snapshots: Snapshots, monkeypatch) -> None:
    """Keys and listing prefixes are the client's: a scan of long keys fills
    the decisions kept to their bound, not past it."""
    registry = Caches()
    registry.configure({"decisions": 64 * 1024})
    monkeypatch.setattr("tiering.memo.CACHES", registry)
    access = Access({}, snapshots)
    key = user(snapshots, "scanner", "read-only:data")
    for i in range(2000):
        assert allowed(access, key, "GET", f"/data/{'k' * 500}{i}")
        assert registry.stats()["decisions"]["bytes"] <= 64 * 1024
    assert 50 < registry.stats()["decisions"]["entries"] < 2000


def test_public_buckets_for_anonymous_callers(snapshots: Snapshots) -> None:
    access = Access({}, snapshots)
    snapshots.change(lambda state: state.set_bucket_acl("open", "public-read"))
    snapshots.change(lambda state: state.set_object_acl("open", "shared", "public-read"))
    assert allowed(access, None, "GET", "/open", "list-type=2")
    assert allowed(access, None, "GET", "/open/shared")
    assert not allowed(access, None, "GET", "/open/private")
    assert not allowed(access, None, "PUT", "/open/shared")
    assert not allowed(access, None, "GET", "/open", "acl")
    assert allowed(access, None, "POST", "/open", "batch")  # its members are decided one by one
    policy = {"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:*",
                             "Resource": ["arn:aws:s3:::set", "arn:aws:s3:::set/*"]}]}
    snapshots.change(lambda state: state.put_bucket_policy("set", json.dumps(policy)))
    assert allowed(access, None, "GET", "/set/k") and allowed(access, None, "GET", "/set")
    assert not allowed(access, None, "DELETE", "/set/k")  # "s3:*" still gives anonymous callers reads only


def test_signed_or_anonymous() -> None:
    assert signed(request("GET", "/b/k", headers={"authorization": "AWS4-HMAC-SHA256 ..."}))
    assert signed(request("GET", "/b/k", "X-Amz-Signature=x"))
    assert signed(request("GET", "/b/k", "AWSAccessKeyId=a&Signature=s&Expires=1"))
    assert not signed(request("GET", "/b/k", "prefix=x"))
