"""The S3 operation table: (resource, method, sub-resource) -> handler.

Addressing is decided once, here: virtual-host style when the Host is
``<bucket>.<domain>``, path style otherwise. The handler is then picked by a
dictionary lookup, no pattern matching per request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gateway.context import Context
from gateway.errors import S3Error
from gateway.handlers import buckets, listing, multipart, objects
from gateway.http import Response, S3Request

Handler = Callable[[Context, S3Request], Awaitable[Response]]

# Query parameters that name a sub-resource (they select the operation);
# all others (prefix, max-keys, response-*, X-Amz-*, ...) are arguments.
SUB_RESOURCES = frozenset({
    "accelerate", "acl", "analytics", "attributes", "cors", "delete", "encryption",
    "intelligent-tiering", "inventory", "legal-hold", "lifecycle", "location", "logging",
    "metadataTable", "metrics", "notification", "object-lock", "ownershipControls",
    "partNumber", "policy", "policyStatus", "publicAccessBlock", "replication",
    "requestPayment", "restore", "retention", "select", "session", "tagging", "torrent",
    "uploadId", "uploads", "versioning", "versions", "website",
})

TABLE: dict[tuple[str, str, str | None], Handler] = {
    ("service", "GET", None): buckets.list_buckets,
    ("bucket", "PUT", None): buckets.create_bucket,
    ("bucket", "DELETE", None): buckets.delete_bucket,
    ("bucket", "HEAD", None): buckets.head_bucket,
    ("bucket", "GET", None): listing.list_objects,
    ("bucket", "GET", "location"): buckets.get_location,
    ("bucket", "GET", "versioning"): buckets.get_versioning,
    ("bucket", "GET", "versions"): listing.list_versions,
    ("bucket", "GET", "acl"): buckets.get_acl,
    ("bucket", "PUT", "acl"): buckets.put_acl,
    ("bucket", "GET", "uploads"): multipart.list_uploads,
    ("bucket", "POST", "delete"): objects.delete_objects,
    ("object", "GET", None): objects.get_object,
    ("object", "GET", "partNumber"): objects.get_object,
    ("object", "HEAD", None): objects.head_object,
    ("object", "HEAD", "partNumber"): objects.head_object,
    ("object", "PUT", None): objects.put_object,
    ("object", "DELETE", None): objects.delete_object,
    ("object", "GET", "acl"): buckets.get_acl,
    ("object", "PUT", "acl"): buckets.put_acl,
    ("object", "POST", "uploads"): multipart.create_upload,
    ("object", "PUT", "uploadId"): multipart.upload_part,
    ("object", "POST", "uploadId"): multipart.complete_upload,
    ("object", "DELETE", "uploadId"): multipart.abort_upload,
    ("object", "GET", "uploadId"): multipart.list_parts,
}

_KNOWN_METHODS = {"GET", "HEAD", "PUT", "POST", "DELETE"}


def address(req: S3Request, domain: str | None) -> bool:
    """Fill ``req.bucket`` and ``req.key`` from the Host and the path; True if
    the Host named the bucket (virtual-hosted style)."""
    host = req.headers.get("host", "")
    if host.startswith("["):  # IPv6 literal, never a virtual host
        host = ""
    host = host.rsplit(":", 1)[0].lower()
    if domain and host.endswith("." + domain):
        req.bucket = host[: -len(domain) - 1]
        req.key = req.path[1:]
        return True
    bucket, _, key = req.path[1:].partition("/")
    req.bucket, req.key = bucket, key
    return False


def resolve(req: S3Request) -> Handler:
    kind = "object" if req.key else "bucket" if req.bucket else "service"
    subs = [name for name in req.query if name in SUB_RESOURCES]
    # partNumber is also an argument of UploadPart (with uploadId).
    if "uploadId" in subs:
        sub: str | None = "uploadId"
    elif len(subs) == 1:
        sub = subs[0]
    elif not subs:
        sub = None
    else:
        raise S3Error("InvalidRequest", f"Conflicting sub-resources in query: {', '.join(sorted(subs))}")
    handler = TABLE.get((kind, req.method, sub))
    if handler is not None:
        return handler
    if req.method not in _KNOWN_METHODS:
        raise S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.",
                      Method=req.method, ResourceType=kind.upper())
    if sub is not None or kind == "service":
        what = f"?{sub}" if sub else "this operation"
        raise S3Error("NotImplemented", f"{req.method} {what} is not implemented by this gateway")
    raise S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.",
                  Method=req.method, ResourceType=kind.upper())
