"""AWS Signature Version 2 verification for S3 requests (sans-I/O).

Older tools sign ``Authorization: AWS <AccessKeyId>:<Signature>``, and boto3's
``generate_presigned_url`` against a custom us-east-1 endpoint makes SigV2
query-auth URLs (``AWSAccessKeyId``, ``Expires``, ``Signature``) unless told
``signature_version='s3v4'``. Per the S3 guide's "Signing and authenticating
REST requests (AWS signature version 2)"::

    Signature = Base64(HMAC-SHA1(secret, UTF-8(StringToSign)))
    StringToSign = VERB \\n Content-MD5 \\n Content-Type \\n Date-or-Expires \\n
                   CanonicalizedAmzHeaders CanonicalizedResource

The canonical strings are built exactly as botocore's ``HmacV1Auth`` and
``HmacV1QueryAuth`` build them. SigV2 never signs the payload, so the context
says ``UNSIGNED-PAYLOAD``; aws-chunked bodies are SigV4-only. Called through
:func:`gateway.auth.sigv4.authenticate`, with the same inputs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from urllib.parse import unquote

from gateway.auth.signing import (
    MAX_SKEW,
    UNSIGNED_PAYLOAD,
    AuthContext,
    candidate_uris,
    iso,
    parse_amz_date,
    split_query,
    utf8,
)
from gateway.s3.errors import S3Error
from gateway.s3.headers import decimal, parse_http_datetime

__all__ = ["SUB_RESOURCES", "UNSIGNABLE", "authenticate"]

# Query parameters that enter the CanonicalizedResource: the guide's
# sub-resources, response-* overrides and ``delete``, plus the ones botocore
# (HmacV1Auth.QSAOfInterest) added since. Any other parameter is unsigned, and
# one too many or too few here breaks every signature that uses it.
SUB_RESOURCES = frozenset({
    "accelerate", "acl", "analytics", "cors", "defaultObjectAcl", "delete", "inventory",
    "lifecycle", "location", "logging", "metrics", "notification", "object-lock", "partNumber",
    "policy", "replication", "requestPayment", "restore", "select", "select-type",
    "storageClass", "tagging", "torrent", "uploadId", "uploads", "versionId", "versioning",
    "versions", "website", "response-cache-control", "response-content-disposition",
    "response-content-encoding", "response-content-language", "response-content-type",
    "response-expires",
})
# Sub-resources that select an operation (gateway.routes) but that SigV2
# signers leave out of the CanonicalizedResource: a SigV2 request carrying one
# is refused, or anyone could add it to a signed URL and change the operation.
UNSIGNABLE = frozenset({
    "attributes", "batch", "encryption", "intelligent-tiering", "legal-hold", "metadataTable",
    "ownershipControls", "peer-news", "policyStatus", "publicAccessBlock", "retention", "session",
})
_BAD_DATE = "AWS authentication requires a valid Date or x-amz-date header"
_QUERY_PARAMS = ("Query-string authentication requires the Signature, Expires and "
                 "AWSAccessKeyId parameters")


def authenticate(method: str, raw_path: str, raw_query: str, headers: Mapping[str, str],
                 secret_for: Callable[[str], str | None], now: datetime,
                 host_bucket: str = "") -> AuthContext:
    """Verify a SigV2 request: header auth if it has an Authorization header,
    else query auth. ``host_bucket`` is the bucket the Host named (virtual-hosted
    style), which the CanonicalizedResource starts with."""
    query = {n.decode("utf-8", "surrogateescape"): v.decode("utf-8", "surrogateescape")
             for n, v in reversed(split_query(raw_query))}  # the first of repeated names wins
    amz = {n: v for n, v in headers.items() if n.startswith("x-amz-")}
    if "authorization" in headers:
        access_key, signature = _parse_header(headers["authorization"])
        dates = _check_header_time(headers, now)
        content = (headers.get("content-md5", ""), headers.get("content-type", ""))
    else:
        access_key, signature, expires = _check_query(query, now)
        dates = [(expires, False)]
        # botocore moves the x-amz-*, Content-MD5 and Content-Type headers it
        # signed into the query; what the request sends as headers comes first.
        lowered = {n.lower(): v for n, v in query.items()}
        amz = {**{n: v for n, v in lowered.items() if n.startswith("x-amz-")}, **amz}
        content = (headers.get("content-md5", lowered.get("content-md5", "")),
                   headers.get("content-type", lowered.get("content-type", "")))
    secret = secret_for(access_key)
    if secret is None:
        raise S3Error("InvalidAccessKeyId", AWSAccessKeyId=access_key)
    head = "\n".join((method, content[0].strip(), content[1].strip()))
    sub_resources = _sub_resources(raw_query)
    tried: list[str] = []
    for date_line, without_amz_date in dates:
        amz_lines = "".join(f"{name}:{amz[name].strip()}\n" for name in sorted(amz)
                            if not (without_amz_date and name == "x-amz-date"))
        for uri in _resource_paths(raw_path, host_bucket):
            resource = uri + sub_resources
            string_to_sign = f"{head}\n{date_line.strip()}\n{amz_lines}{resource}"
            if hmac.compare_digest(utf8(_sign(secret, string_to_sign)), utf8(signature)):
                _refuse_unsigned(query, headers)
                return AuthContext(access_key=access_key, payload_hash=UNSIGNED_PAYLOAD,
                                   signing_key=b"", amz_date="", scope="", seed_signature="")
            tried.append(string_to_sign)
    # S3 echoes what it signed so a client can diff it against its own.
    raise S3Error("SignatureDoesNotMatch", AWSAccessKeyId=access_key, StringToSign=tried[0],
                  SignatureProvided=signature)


def _parse_header(value: str) -> tuple[str, str]:
    """``AWS AccessKeyId:Signature``; neither part contains a colon."""
    access_key, sep, signature = value.strip()[len("AWS "):].strip().partition(":")
    if not sep or not access_key or not signature:
        raise S3Error("InvalidArgument", "AWS authorization header is invalid.  Expected "
                      "AwsAccessKeyId:signature", ArgumentName="Authorization",
                      ArgumentValue=value)
    return access_key, signature


def _check_header_time(headers: Mapping[str, str], now: datetime) -> list[tuple[str, bool]]:
    """Check the request time; return the Date lines a signer may have used,
    each with whether x-amz-date is then left out of CanonicalizedAmzHeaders.

    With x-amz-date, the guide's text says the Date line is empty (S3 ignores
    Date), its own Delete example puts x-amz-date's value there instead (and
    drops the header from the x-amz-* lines), and botocore always signs its Date
    header beside an x-amz-date.
    """
    stamp = headers.get("x-amz-date", headers.get("date"))
    when = _parse_time(stamp) if stamp is not None else None
    if when is None:
        raise S3Error("AccessDenied", _BAD_DATE)
    if abs(now - when) > MAX_SKEW:
        raise S3Error("RequestTimeTooSkewed", "The difference between the request time and "
                      "the current time is too large.", RequestTime=stamp,
                      ServerTime=iso(now), MaxAllowedSkewMilliseconds=900000)
    if "x-amz-date" not in headers:
        return [(headers["date"], False)]
    dates = [("", False), (headers["x-amz-date"], True)]
    if "date" in headers:
        dates.append((headers["date"], False))
    return dates


def _parse_time(value: str) -> datetime | None:
    """An RFC 7231 date, or the ISO 8601 basic form some clients put in x-amz-date."""
    return parse_amz_date(value.strip()) or parse_http_datetime(value)


def _check_query(query: Mapping[str, str], now: datetime) -> tuple[str, str, str]:
    """The access key, signature and Expires of a presigned URL that has not expired."""
    if not all(query.get(name) for name in ("AWSAccessKeyId", "Signature", "Expires")):
        raise S3Error("AccessDenied", _QUERY_PARAMS)
    expires = query["Expires"]
    seconds = decimal(expires)  # any digit string is valid; a huge one never expires
    if seconds is None:
        raise S3Error("AccessDenied", f"Invalid date (should be seconds since epoch): {expires}")
    if seconds < now.timestamp():
        raise S3Error("AccessDenied", "Request has expired",
                      Expires=iso(datetime.fromtimestamp(seconds, UTC)),
                      ServerTime=iso(now))
    # Base64 has no spaces: a '+' sent unencoded was read as one.
    return query["AWSAccessKeyId"], query["Signature"].replace(" ", "+"), expires


def _resource_paths(raw_path: str, host_bucket: str) -> list[str]:
    """The CanonicalizedResource's path: the Host's bucket, then the path as
    sent (or re-encoded, see :func:`gateway.auth.sigv4.candidate_uris`).

    S3 signs a path-style bucket as ``/bucket/`` (botocore's auth path, "the
    server will accept" only that), though clients send ``/bucket``.
    """
    if host_bucket:
        return [f"/{host_bucket}{uri}" for uri in candidate_uris(raw_path)]
    uris = list(candidate_uris(raw_path))
    if raw_path.count("/") == 1 and len(raw_path) > 1:
        uris.insert(0, raw_path + "/")
    return uris


def _sub_resources(raw_query: str) -> str:
    """``?name[=value]&...`` for the sub-resources in the query, sorted by name,
    as botocore's ``canonical_resource``.

    Names and values are percent-decoded ('+' as a space) as the router reads
    them, so that ``%61cl`` or ``a+b`` cannot mean one thing to the router and
    another (or nothing) to the signature. botocore encodes every '+' and
    percent-decodes the values it signs, so its signatures are unchanged.
    """
    pairs = []
    for item in raw_query.split("&"):
        raw_name, sep, value = item.partition("=")
        name = _decode(raw_name)
        if name in SUB_RESOURCES:
            pairs.append((name, f"{name}={_decode(value)}" if sep else name))
    pairs.sort(key=lambda pair: pair[0])  # stable: repeated names keep their order
    return "?" + "&".join(text for _, text in pairs) if pairs else ""


def _decode(text: str) -> str:
    return unquote(text.replace("+", " "), errors="surrogateescape")


def _refuse_unsigned(query: Mapping[str, str], headers: Mapping[str, str]) -> None:
    """Refuse what SigV2 verified but cannot protect.

    aws-chunked framing carries SigV4 chunk signatures: under SigV2 the body
    would be taken as the object, framing and all. An UNSIGNABLE sub-resource
    would select an operation the signature does not cover.
    """
    if headers.get("x-amz-content-sha256", "").startswith("STREAMING-"):
        raise S3Error("InvalidRequest", "aws-chunked payloads (x-amz-content-sha256: "
                      "STREAMING-*) require AWS4-HMAC-SHA256 signing")
    unsignable = sorted(UNSIGNABLE.intersection(query))
    if unsignable:
        raise S3Error("InvalidRequest", f"?{unsignable[0]} requires AWS4-HMAC-SHA256 signing: "
                      "Signature Version 2 does not sign it")


def _sign(secret: str, string_to_sign: str) -> str:
    digest = hmac.new(utf8(secret), utf8(string_to_sign), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")
