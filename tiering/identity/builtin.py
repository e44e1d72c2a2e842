"""Ready-made policies, by name: ``read-only`` and ``read-write``, for every
bucket or, as ``read-only:<bucket>`` and ``read-write:<bucket>``, for one.

They are documents like any other (docs/users-and-policies.md prints them),
made from their name when a user names them, so they cannot be changed or
deleted, and a named policy of one's own cannot take their names (a name of
one's own has no ``:``)."""

from __future__ import annotations

import json
import re

from tiering.identity.policy import ARN

READ_ONLY = "read-only"
READ_WRITE = "read-write"
# What a reader needs: objects, their tags and ACLs, listings and the
# bucket's own description (location, versioning, ACL, policy).
READ_ACTIONS = ["s3:Get*", "s3:List*"]
# What a writer adds: objects in and out, multipart uploads, tags and ACLs
# of objects. Not buckets themselves (create, delete, policy, versioning):
# that is an administrator's, given by a policy of one's own ("s3:*").
WRITE_ACTIONS = [
    "s3:PutObject", "s3:PutObjectTagging", "s3:PutObjectVersionTagging", "s3:PutObjectAcl",
    "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:DeleteObjectTagging", "s3:DeleteObjectVersionTagging",
    "s3:AbortMultipartUpload",
]
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def is_builtin(name: str) -> bool:
    return document(name) is not None or name.split(":", 1)[0] in (READ_ONLY, READ_WRITE)


def document(name: str) -> str | None:
    """The ready-made policy of that name as JSON text, or None."""
    kind, _, bucket = name.partition(":")
    if kind not in (READ_ONLY, READ_WRITE) or (bucket and not _BUCKET.fullmatch(bucket)):
        return None
    if ":" in name and not bucket:
        return None
    actions = READ_ACTIONS + (WRITE_ACTIONS if kind == READ_WRITE else [])
    resources = [f"{ARN}{bucket}", f"{ARN}{bucket}/*"] if bucket else [f"{ARN}*"]
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": name, "Effect": "Allow", "Action": actions, "Resource": resources},
    ]}, indent=2)
