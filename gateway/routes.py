"""The S3 operation table: (resource, method, sub-resource) -> operation
name and handler.

Addressing is decided once, here: virtual-host style when the Host is
``<bucket>.<domain>``, path style otherwise. The handler is then picked by a
dictionary lookup, no pattern matching per request. The operation name (S3's
own, as in CloudTrail and the API reference) labels metrics and access-log
lines; the few handlers that turn into another operation rename the request
(PUT with x-amz-copy-source is CopyObject or UploadPartCopy, GET ?list-type=2
is ListObjectsV2).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple

from gateway.handlers import batch, buckets, listing, multipart, news, objects, permissions, tagging
from gateway.handlers.context import Context
from gateway.s3.errors import S3Error
from gateway.s3.http import Response, S3Request

Handler = Callable[[Context, S3Request], Awaitable[Response]]


class Route(NamedTuple):
    op: str  # the S3 operation name, e.g. "GetObject"
    handler: Handler


# Query parameters that name a sub-resource (they select the operation);
# all others (prefix, max-keys, response-*, X-Amz-*, ...) are arguments.
SUB_RESOURCES = frozenset({
    "accelerate", "acl", "analytics", "attributes", "batch", "cors", "delete", "encryption",
    "intelligent-tiering", "inventory", "legal-hold", "lifecycle", "location", "logging",
    "metadataTable", "metrics", "notification", "object-lock", "ownershipControls",
    "partNumber", "peer-news", "policy", "policyStatus", "publicAccessBlock", "replication",
    "requestPayment", "restore", "retention", "select", "session", "tagging", "torrent",
    "uploadId", "uploads", "versioning", "versions", "website",
})

TABLE: dict[tuple[str, str, str | None], Route] = {
    ("service", "GET", None): Route("ListBuckets", buckets.list_buckets),
    ("bucket", "PUT", None): Route("CreateBucket", buckets.create_bucket),
    ("bucket", "DELETE", None): Route("DeleteBucket", buckets.delete_bucket),
    ("bucket", "HEAD", None): Route("HeadBucket", buckets.head_bucket),
    ("bucket", "GET", None): Route("ListObjects", listing.list_objects),
    ("bucket", "GET", "location"): Route("GetBucketLocation", buckets.get_location),
    ("bucket", "GET", "versioning"): Route("GetBucketVersioning", buckets.get_versioning),
    ("bucket", "PUT", "versioning"): Route("PutBucketVersioning", buckets.put_versioning),
    ("bucket", "GET", "versions"): Route("ListObjectVersions", listing.list_versions),
    ("bucket", "GET", "acl"): Route("GetBucketAcl", permissions.get_acl),
    ("bucket", "PUT", "acl"): Route("PutBucketAcl", permissions.put_acl),
    ("bucket", "GET", "policy"): Route("GetBucketPolicy", permissions.get_policy),
    ("bucket", "PUT", "policy"): Route("PutBucketPolicy", permissions.put_policy),
    ("bucket", "DELETE", "policy"): Route("DeleteBucketPolicy", permissions.delete_policy),
    ("bucket", "GET", "uploads"): Route("ListMultipartUploads", multipart.list_uploads),
    ("bucket", "POST", "delete"): Route("DeleteObjects", objects.delete_objects),
    ("object", "GET", None): Route("GetObject", objects.get_object),
    ("object", "GET", "partNumber"): Route("GetObject", objects.get_object),
    ("object", "HEAD", None): Route("HeadObject", objects.head_object),
    ("object", "HEAD", "partNumber"): Route("HeadObject", objects.head_object),
    ("object", "PUT", None): Route("PutObject", objects.put_object),
    ("object", "DELETE", None): Route("DeleteObject", objects.delete_object),
    ("object", "GET", "acl"): Route("GetObjectAcl", permissions.get_acl),
    ("object", "PUT", "acl"): Route("PutObjectAcl", permissions.put_acl),
    ("object", "GET", "tagging"): Route("GetObjectTagging", tagging.get_tagging),
    ("object", "PUT", "tagging"): Route("PutObjectTagging", tagging.put_tagging),
    ("object", "DELETE", "tagging"): Route("DeleteObjectTagging", tagging.delete_tagging),
    ("object", "POST", "uploads"): Route("CreateMultipartUpload", multipart.create_upload),
    ("object", "PUT", "uploadId"): Route("UploadPart", multipart.upload_part),
    ("object", "POST", "uploadId"): Route("CompleteMultipartUpload", multipart.complete_upload),
    ("object", "DELETE", "uploadId"): Route("AbortMultipartUpload", multipart.abort_upload),
    ("object", "GET", "uploadId"): Route("ListParts", multipart.list_parts),
    # tierstore's extension: many objects as one tar stream (docs/batch.md).
    ("bucket", "POST", "batch"): Route("GetBatch", batch.post_batch),
    ("object", "GET", "batch"): Route("GetBatch", batch.get_batch),
    # Between the gateways of a cluster: "what you follow changed" (root only).
    ("service", "POST", "peer-news"): Route("PeerNews", news.post_news),
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


def resolve(req: S3Request) -> Route:
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
    route = TABLE.get((kind, req.method, sub))
    if route is not None:
        return route
    if req.method not in _KNOWN_METHODS:
        raise S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.",
                      Method=req.method, ResourceType=kind.upper())
    if sub is not None or kind == "service":
        what = f"?{sub}" if sub else "this operation"
        raise S3Error("NotImplemented", f"{req.method} {what} is not implemented by this gateway")
    raise S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.",
                  Method=req.method, ResourceType=kind.upper())
