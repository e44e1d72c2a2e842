"""The data plane's one authorisation point.

``gateway/app.py`` authenticates a request (SigV4 or SigV2, header or
presigned: the key that signed it) or takes it as anonymous when it is not
signed at all, then asks :meth:`Access.authorize` before any handler runs:
who is asking (:class:`Caller`), and may they take the IAM action this
operation is, on this bucket or object? The table :data:`ACTIONS` maps S3's
operation names (``gateway/routes.py``) to IAM's actions, as AWS's "Actions,
resources, and condition keys for Amazon S3" does. Some operations name
more than one thing: a copy needs read permission on its source too, a
write that sets an ACL or tags needs those actions as well. Operations on
many objects at once authorise each of them in their handler
(``DeleteObjects``: ``s3:DeleteObject`` per key; ``GetBatch``:
``s3:GetObject`` per member, ``gateway/handlers/batch.py``).

A refusal is S3's AccessDenied. The decisions themselves are
``tiering.identity``'s (an explicit Deny wins, then an Allow, then a
canned ACL, else no; root may do everything). Each decision is kept per
(principal, action, resource, conditions) until the identities change
(a new snapshot), so a hot GET by a user pays a dictionary lookup; the
decisions kept are bounded in bytes (the ``decisions`` kind of
``tiering/memo.py``): keys and listing prefixes are the client's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote_to_bytes

from gateway.s3.errors import S3Error
from gateway.s3.http import S3Request
from tiering.identity.directory import Directory
from tiering.identity.policy import ANONYMOUS, ROOT, Principal
from tiering.memo import Kept

# S3 operation -> IAM action. None: decided per object by the handler.
ACTIONS: dict[str, str | None] = {
    "ListBuckets": "s3:ListAllMyBuckets",
    "CreateBucket": "s3:CreateBucket",
    "DeleteBucket": "s3:DeleteBucket",
    "HeadBucket": "s3:ListBucket",
    "ListObjects": "s3:ListBucket",
    "ListObjectsV2": "s3:ListBucket",
    "ListObjectVersions": "s3:ListBucketVersions",
    "GetBucketLocation": "s3:GetBucketLocation",
    "GetBucketVersioning": "s3:GetBucketVersioning",
    "PutBucketVersioning": "s3:PutBucketVersioning",
    "GetBucketAcl": "s3:GetBucketAcl",
    "PutBucketAcl": "s3:PutBucketAcl",
    "GetBucketPolicy": "s3:GetBucketPolicy",
    "PutBucketPolicy": "s3:PutBucketPolicy",
    "DeleteBucketPolicy": "s3:DeleteBucketPolicy",
    "ListMultipartUploads": "s3:ListBucketMultipartUploads",
    "DeleteObjects": None,  # s3:DeleteObject per key (gateway/handlers/objects.py)
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "CopyObject": "s3:PutObject",
    "DeleteObject": "s3:DeleteObject",
    "GetObjectAcl": "s3:GetObjectAcl",
    "PutObjectAcl": "s3:PutObjectAcl",
    "GetObjectTagging": "s3:GetObjectTagging",
    "PutObjectTagging": "s3:PutObjectTagging",
    "DeleteObjectTagging": "s3:DeleteObjectTagging",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "UploadPartCopy": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "ListParts": "s3:ListMultipartUploadParts",
    "GetBatch": None,  # s3:GetObject per member; a manifest is read with s3:GetObject (handlers/batch.py)
    "PeerNews": None,  # root's only: another gateway of the cluster (handlers/news.py)
}
ROOT_ONLY = frozenset({"PeerNews"})
# The action of an operation on one version named by ?versionId=.
VERSIONED = {
    "s3:GetObject": "s3:GetObjectVersion",
    "s3:DeleteObject": "s3:DeleteObjectVersion",
    "s3:GetObjectTagging": "s3:GetObjectVersionTagging",
    "s3:PutObjectTagging": "s3:PutObjectVersionTagging",
    "s3:DeleteObjectTagging": "s3:DeleteObjectVersionTagging",
    "s3:GetObjectAcl": "s3:GetObjectVersionAcl",
    "s3:PutObjectAcl": "s3:PutObjectVersionAcl",
}
_LISTINGS = frozenset({"ListObjects", "ListObjectsV2", "ListObjectVersions"})
_WRITES = frozenset({"PutObject", "CopyObject", "CreateMultipartUpload"})
# Query parameters that make a request signed (checked by gateway/auth/sigv4.py);
# without them and without an Authorization header, a request is anonymous.
_SIGNED_QUERY = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature", "Signature", "AWSAccessKeyId")
# Decisions kept, at most, within the decisions' byte bound; the oldest go
# first (a new snapshot drops them all).
MAX_KEPT = 65536


def signed(req: S3Request) -> bool:
    """Whether the request carries a signature to check (else it is anonymous)."""
    return "authorization" in req.headers or any(name in req.query for name in _SIGNED_QUERY)


def denied(what: str = "Access Denied") -> S3Error:
    return S3Error("AccessDenied", what)


def _copy_source(raw: str) -> tuple[str, str, bool]:
    """(bucket, key, names a version) of an x-amz-copy-source value
    (``[/]bucket/key[?versionId=...]``, URL-encoded). One that does not
    parse names nothing here; its handler refuses it with S3's error."""
    path, _, query = raw.partition("?")
    try:
        path = unquote_to_bytes(path.encode("latin-1")).decode("utf-8").lstrip("/")
    except UnicodeError:
        return "", "", False
    bucket, _, key = path.partition("/")
    return bucket, key, "versionId" in parse_qs(query, keep_blank_values=True)


@dataclass(slots=True)
class Caller:
    """Who a request is from, and the questions a handler may ask for it."""

    principal: Principal
    access_key: str  # "" when anonymous
    access: Access
    enabled: bool = True  # False: a disabled user, refused whatever it asks

    @property
    def name(self) -> str:
        """For the access log and metrics: a user's name, ``root`` or ``anonymous``."""
        return self.principal.label

    def allows(self, action: str, bucket: str, key: str = "", context: Mapping[str, str] | None = None,
               keep: bool = True) -> bool:
        if self.principal.kind == "root":
            return True
        return self.enabled and self.access.allows(self.principal, action, bucket, key, context, keep)

    def check(self, action: str, bucket: str, key: str = "", context: Mapping[str, str] | None = None) -> None:
        """AccessDenied unless allowed."""
        if not self.allows(action, bucket, key, context):
            raise denied()


class Access:
    """Root's key pairs and the identities' snapshot (``directory()``: the
    current one, read per request), and the decisions kept."""

    def __init__(self, root: Mapping[str, str], directory: Callable[[], Directory]) -> None:
        self._root = dict(root)
        self._directory = directory
        self._kept: Kept[tuple[object, ...], bool] = Kept("decisions", MAX_KEPT)
        self._kept_for: Directory | None = None
        self._root_callers: dict[str, Caller] = {}
        self.anonymous = Caller(ANONYMOUS, "", self)

    def secret_for(self, access_key: str) -> str | None:
        """The secret a signature by ``access_key`` is checked with (None: unknown)."""
        secret = self._root.get(access_key)
        return secret if secret is not None else self._directory().secret(access_key)

    def caller(self, access_key: str | None) -> Caller:
        """The caller of a request signed by ``access_key`` (None: anonymous)."""
        if access_key is None:
            return self.anonymous
        if access_key in self._root:
            caller = self._root_callers.get(access_key)
            if caller is None:
                caller = self._root_callers[access_key] = Caller(ROOT, access_key, self)
            return caller
        user = self._directory().user_of(access_key)
        if user is None:  # revoked between the signature check and now
            raise S3Error("InvalidAccessKeyId", AWSAccessKeyId=access_key)
        return Caller(user.principal, access_key, self, user.enabled)

    def allows(self, who: Principal, action: str, bucket: str, key: str = "",
               context: Mapping[str, str] | None = None, keep: bool = True) -> bool:
        directory = self._directory()
        kept = self._kept
        if directory is not self._kept_for:
            kept.clear()
            self._kept_for = directory
        name = (who.ident, action, bucket, key, tuple(sorted(context.items())) if context else None)
        found = kept.items.get(name)
        if found is not None:
            return found
        found = directory.allows(who, action, bucket, key, context)
        if keep:
            kept.put(name, found)
        return found

    def authorize(self, caller: Caller, req: S3Request, op: str) -> None:
        """AccessDenied unless ``caller`` may run operation ``op`` as ``req`` asks."""
        if caller.principal.kind == "root":
            return
        if not caller.enabled:
            raise denied(f"Access Denied: user {caller.name} is disabled")
        action = ACTIONS.get(op)
        if action is None:
            anonymous = caller.principal.kind == "anonymous"
            if op == "GetBatch" and req.key:  # the manifest is read first
                caller.check(_versioned("s3:GetObject", req), req.bucket, req.key)
            elif op not in ACTIONS or op in ROOT_ONLY or (anonymous and op != "GetBatch"):
                raise denied()  # an operation the table does not know is root's only; anonymous callers only read
            elif anonymous and not self._directory().public(req.bucket):
                raise denied()  # nothing of the bucket is anyone's: refused before its body is read
            return
        if req.key:
            action = _versioned(action, req)
        context = _listing_context(req) if op in _LISTINGS else None
        caller.check(action, req.bucket, req.key, context)
        self._also(caller, req, op)

    def _also(self, caller: Caller, req: S3Request, op: str) -> None:
        """What a write asks besides its own action: read access to a copy's
        source, and the ACL and tagging actions of what it sets."""
        source = req.headers.get("x-amz-copy-source") if op in ("PutObject", "UploadPart") else None
        if source is not None:
            bucket, key, version = _copy_source(source)
            if bucket and key:
                caller.check("s3:GetObjectVersion" if version else "s3:GetObject", bucket, key)
        if op in _WRITES:
            acl = req.headers.get("x-amz-acl")
            if acl is not None and acl.strip() != "private":
                caller.check("s3:PutObjectAcl", req.bucket, req.key)
            if req.headers.get("x-amz-tagging"):
                caller.check("s3:PutObjectTagging", req.bucket, req.key)


def _versioned(action: str, req: S3Request) -> str:
    return VERSIONED.get(action, action) if "versionId" in req.query else action


def _listing_context(req: S3Request) -> dict[str, str]:
    """The condition keys of a listing: ``s3:prefix`` always (empty when the
    request names none), ``s3:delimiter`` and ``s3:max-keys`` when given."""
    q = req.query
    context = {"s3:prefix": q.get("prefix", "")}
    if "delimiter" in q:
        context["s3:delimiter"] = q["delimiter"]
    if "max-keys" in q:
        context["s3:max-keys"] = q["max-keys"]
    return context
