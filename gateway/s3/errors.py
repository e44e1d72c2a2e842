"""S3 errors: the one table from failure to (S3 code, HTTP status).

Domain failures are raised as ``tiering.errors`` classes and translated here
by walking the class's MRO; failures that only exist at the HTTP edge (auth,
XML, headers) are raised directly as :class:`S3Error` with a code from
``STATUS``. Rendering lives in ``gateway/s3/xml.py``.
"""

from __future__ import annotations

from email.utils import formatdate

from tiering import errors as t

# S3 error code -> HTTP status. Codes and statuses follow the S3 API
# reference's list of error responses.
STATUS: dict[str, int] = {
    "AccessDenied": 403,
    "AuthorizationHeaderMalformed": 400,
    "AuthorizationQueryParametersError": 400,
    "BadDigest": 400,
    "BadRequest": 400,
    "BucketAlreadyExists": 409,
    "BucketAlreadyOwnedByYou": 409,
    "BucketNotEmpty": 409,
    "ConditionalRequestConflict": 409,
    "EntityTooLarge": 400,
    "EntityTooSmall": 400,
    "ExpiredToken": 400,
    "IncompleteBody": 400,
    "InvalidObjectState": 403,
    # Not an AWS code (S3 never runs out of room): RFC 4918's status, the
    # one MinIO and Ceph RGW answer for a full disk. docs/s3-compatibility.md.
    "InsufficientStorage": 507,
    "InternalError": 500,
    "InvalidAccessKeyId": 403,
    "InvalidArgument": 400,
    "InvalidBucketName": 400,
    "InvalidDigest": 400,
    "InvalidPart": 400,
    "InvalidPartOrder": 400,
    "InvalidRange": 416,
    "InvalidRequest": 400,
    "InvalidStorageClass": 400,
    "InvalidTag": 400,
    "InvalidURI": 400,
    "KeyTooLongError": 400,
    "MalformedACLError": 400,
    "MalformedPolicy": 400,
    "MalformedXML": 400,
    "MaxMessageLengthExceeded": 400,
    "MetadataTooLarge": 400,
    "MethodNotAllowed": 405,
    "MissingContentLength": 411,
    "MissingSecurityHeader": 400,
    "NoSuchBucket": 404,
    "NoSuchBucketPolicy": 404,
    "NoSuchKey": 404,
    "NoSuchUpload": 404,
    "NoSuchVersion": 404,
    "NotImplemented": 501,
    "NotModified": 304,
    "PreconditionFailed": 412,
    "RequestHeaderSectionTooLarge": 400,
    "RequestTimeTooSkewed": 403,
    "RequestTimeout": 400,
    "ServiceUnavailable": 503,
    "SignatureDoesNotMatch": 403,
    "SlowDown": 503,
    "UnexpectedContent": 400,
    "XAmzContentSHA256Mismatch": 400,
}

# Domain failure -> S3 error code. Looked up along the MRO, so a subclass
# inherits its parent's code unless it is listed itself.
CODE_OF: dict[type[t.TierstoreError], str] = {
    t.NoSuchBucket: "NoSuchBucket",
    t.BucketNotEmpty: "BucketNotEmpty",
    t.BucketAlreadyOwnedByYou: "BucketAlreadyOwnedByYou",
    t.InvalidBucketName: "InvalidBucketName",
    t.DeletedKey: "NoSuchKey",  # the key's latest version is a delete marker
    t.NoSuchKey: "NoSuchKey",
    t.NoSuchVersion: "NoSuchVersion",
    t.DeleteMarkerVersion: "MethodNotAllowed",  # a delete marker named by its versionId
    t.MalformedVersioning: "MalformedXML",
    t.NoSuchUpload: "NoSuchUpload",
    t.KeyTooLong: "KeyTooLongError",
    t.InvalidArgument: "InvalidArgument",
    t.InvalidRequest: "InvalidRequest",
    t.InvalidRange: "InvalidRange",
    t.InvalidTag: "InvalidTag",
    t.TooManyTags: "BadRequest",
    t.PreconditionFailed: "PreconditionFailed",
    t.NotModified: "NotModified",
    t.ConditionalConflict: "ConditionalRequestConflict",
    # A BadDigest with its own S3 code (the MRO walk finds it first): the
    # body does not hash to the signed x-amz-content-sha256.
    t.PayloadHashMismatch: "XAmzContentSHA256Mismatch",
    t.BadDigest: "BadDigest",
    t.InvalidDigest: "InvalidDigest",
    t.IncompleteBody: "IncompleteBody",
    t.EntityTooSmall: "EntityTooSmall",
    t.EntityTooLarge: "EntityTooLarge",
    t.InvalidPart: "InvalidPart",
    t.InvalidPartOrder: "InvalidPartOrder",
    t.SlowDown: "SlowDown",
    t.InsufficientStorage: "InsufficientStorage",
    t.AccessDenied: "AccessDenied",
    # A read replica: writes go to the node named in the error's <Writer>.
    # 405, which S3 clients do not retry; with no live writer (a takeover
    # under way) it is ServiceUnavailable instead, which they do.
    t.NotWriter: "MethodNotAllowed",
    t.NotSupported: "NotImplemented",
    # The capacity store failed after retries: the client may retry (503),
    # the message says which store and why (never its credentials).
    t.CapacityError: "ServiceUnavailable",
    t.InvalidObjectState: "InvalidObjectState",  # before its base class ServiceUnavailable
    t.ServiceUnavailable: "ServiceUnavailable",
    t.TierstoreError: "InternalError",
}

DEFAULT_MESSAGE: dict[str, str] = {
    "AccessDenied": "Access Denied",
    "NoSuchBucketPolicy": "The bucket policy does not exist",
    "BucketAlreadyOwnedByYou": "Your previous request to create the named bucket succeeded and you already own it.",
    "BucketNotEmpty": "The bucket you tried to delete is not empty",
    "InsufficientStorage": "The gateway's disk has no room for this write, and nothing it can free would make some.",
    "InternalError": "We encountered an internal error. Please try again.",
    "InvalidAccessKeyId": "The AWS Access Key Id you provided does not exist in our records.",
    "InvalidBucketName": "The specified bucket is not valid.",
    "InvalidObjectState": "The operation is not valid for the object's storage class",
    "InvalidRange": "The requested range is not satisfiable",
    "KeyTooLongError": "Your key is too long",
    "MalformedXML": "The XML you provided was not well-formed or did not validate against our published schema",
    "NoSuchBucket": "The specified bucket does not exist",
    "NoSuchKey": "The specified key does not exist.",
    "NoSuchUpload": "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.",
    "NotImplemented": "A header you provided implies functionality that is not implemented",
    "PreconditionFailed": "At least one of the pre-conditions you specified did not hold",
    "SignatureDoesNotMatch": "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
    "SlowDown": "Please reduce your request rate.",
    "ServiceUnavailable": "Service is unable to handle request.",
}


class S3Error(Exception):
    """An error response: code, status, message and extra XML fields."""

    def __init__(self, code: str, message: str | None = None, /, **fields: object) -> None:
        # Positional-only: a domain error's detail may carry a field named
        # "code" or "message" (the capacity store's own error code).
        if code not in STATUS:
            raise ValueError(f"unknown S3 error code {code!r}")
        self.code = code
        self.status = STATUS[code]
        self.message = message or DEFAULT_MESSAGE.get(code, code)
        # Extra elements of the <Error> body (BucketName, Key, RangeRequested, ...).
        self.fields = {k: str(v) for k, v in fields.items() if v is not None}
        # Headers the error answer carries (a delete marker's, for one).
        self.headers: list[tuple[str, str]] = []
        super().__init__(f"{code}: {self.message}")


def to_s3_error(exc: BaseException) -> S3Error:
    """Translate any exception into the S3Error the client sees."""
    if isinstance(exc, S3Error):
        return exc
    if isinstance(exc, t.TierstoreError):
        for cls in type(exc).__mro__:
            code = CODE_OF.get(cls)  # type: ignore[arg-type]
            if code is not None:
                err = S3Error(code, exc.message or None, **exc.detail)
                if isinstance(exc, t.DeleteMarkerError):
                    err.headers = delete_marker_headers(exc)
                return err
    return S3Error("InternalError")


def delete_marker_headers(exc: t.DeleteMarkerError) -> list[tuple[str, str]]:
    """What S3 says of a delete marker a read met: that it is one, its
    version id and, when it was named by its id, its Last-Modified."""
    out = [("x-amz-delete-marker", "true"), ("x-amz-version-id", exc.version)]
    if isinstance(exc, t.DeleteMarkerVersion):
        out.append(("last-modified", formatdate(exc.last_modified_ms // 1000, usegmt=True)))
    return out
