"""AWS Signature Version 4 verification for S3 requests (sans-I/O).

:func:`authenticate` checks the ``Authorization: AWS4-HMAC-SHA256`` header or a
presigned URL's ``X-Amz-*`` query (S3 API reference, "Authenticating
Requests") and returns an :class:`AuthContext`, or raises :class:`S3Error`.
SigV2 requests (``Authorization: AWS ...`` or an ``AWSAccessKeyId`` and
``Signature`` query) go to :mod:`gateway.auth.sigv2` from the same entry point.
The body is not read: the declared payload hash is returned and the gateway
checks it, or the aws-chunked chunk signatures, while it streams the body.

Inputs are as on the wire: ``raw_path`` and ``raw_query`` with their
percent-encoding; header values decoded from bytes as latin-1 (what botocore's
HTTP stack writes for the str values it signs).
"""

from __future__ import annotations

import functools
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import quote

from gateway.auth import sigv2
from gateway.auth.signing import (
    AMZ_DATE_FORMAT,
    MAX_SKEW,
    UNSIGNED_PAYLOAD,
    AuthContext,
    candidate_uris,
    iso,
    parse_amz_date,
    split_query,
)
from gateway.s3.errors import S3Error
from gateway.s3.headers import decimal, parse_http_datetime
from tiering.capacity.sigv4 import (
    ALGORITHM,
    SERVICE,
    TERMINATOR,
    credential_scope,
    signature,
    signing_key,
    string_to_sign,
)

__all__ = ["AuthContext", "authenticate"]

_PAYLOAD_MODES = frozenset({
    UNSIGNED_PAYLOAD, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER", "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
})
# A presigned URL lives at most 7 days (X-Amz-Expires, query-auth reference).
MAX_EXPIRES = 604800
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_UNRESERVED = re.compile(rb"[A-Za-z0-9_.~-]*")  # what URI encoding leaves as is (RFC 3986)
_SCOPE_DATE = re.compile(r"[0-9]{8}")
# A header name as HTTP defines it (RFC 9110's token), lower case: what a
# SignedHeaders entry must be, exactly (no blank or control inside or around).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")
# Presigned-URL parameters every V4 query signature must carry.
_QUERY_AUTH_PARAMS = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature",
                      "X-Amz-Date", "X-Amz-SignedHeaders", "X-Amz-Expires")
_NOT_V4 = ("The authorization mechanism you have provided is not supported. "
           "Please use AWS4-HMAC-SHA256.")
_BAD_DATE = "AWS authentication requires a valid Date or x-amz-date header"


@dataclass(frozen=True, slots=True)
class _Signer:
    """Who signs and what: the same for every request a client signs in a
    day with the same headers, so a header's is parsed once (cached by its
    text) and what verification derives from it is kept with it."""
    access_key: str
    date: str
    region: str
    headers: tuple[str, ...]  # the signed header names, as listed
    names: frozenset[str]
    listed: str  # the names joined by ";", as the canonical request lists them
    scope: str


def _signer(access_key: str, date: str, region: str, headers: tuple[str, ...]) -> _Signer:
    return _Signer(access_key, date, region, headers, frozenset(headers), ";".join(headers),
                   credential_scope(date, region))


@dataclass(slots=True)
class _Claim:
    """What the client says it signed, from the header or the query (not
    frozen: made once per request, and a frozen dataclass pays a
    ``object.__setattr__`` per field)."""
    signer: _Signer
    amz_date: str
    signature: str
    payload_hash: str
    presigned: bool


def authenticate(method: str, raw_path: str, raw_query: str, headers: Mapping[str, str],
                 secret_for: Callable[[str], str | None], now: datetime,
                 host_bucket: str = "") -> AuthContext:
    """Verify a request's SigV4 (or SigV2) signature; raise :class:`S3Error` if it fails.

    ``headers`` has lower-cased names; ``secret_for`` maps an access key to
    its secret (None if unknown); ``now`` is an aware UTC datetime;
    ``host_bucket`` is the bucket the Host named (virtual-hosted style), which
    SigV2 signs as part of the resource.
    """

    params = split_query(raw_query) if raw_query else []
    query = {n.decode("utf-8", "replace"): v.decode("utf-8", "replace")
             for n, v in reversed(params)} if params else {}  # the first of repeated names wins
    v2_query = "Signature" in query and "AWSAccessKeyId" in query
    if "authorization" in headers:
        if "X-Amz-Algorithm" in query or v2_query:
            raise S3Error("InvalidArgument", "Only one auth mechanism allowed; only the "
                          "X-Amz-Algorithm query parameter, Signature query string parameter "
                          "or the Authorization header should be specified")
        if headers["authorization"].startswith("AWS "):  # SigV2: "AWS AccessKeyId:Signature"
            return sigv2.authenticate(method, raw_path, raw_query, headers, secret_for, now,
                                      host_bucket)
        claim = _claim_from_header(headers, now)
    elif "X-Amz-Algorithm" in query:
        claim = _claim_from_query(query, headers, now)
    elif v2_query:  # a SigV2 presigned URL (boto3's default for a custom us-east-1 endpoint)
        return sigv2.authenticate(method, raw_path, raw_query, headers, secret_for, now,
                                  host_bucket)
    else:
        raise S3Error("AccessDenied", "Anonymous access is not allowed; sign the request "
                      "with AWS4-HMAC-SHA256")
    _check_signed_headers(claim.signer, headers)
    secret = secret_for(claim.signer.access_key)
    if secret is None:
        raise S3Error("InvalidAccessKeyId", AWSAccessKeyId=claim.signer.access_key)
    return _verify(method, raw_path, params, headers, claim, secret)


def _verify(method: str, raw_path: str, params: list[tuple[bytes, bytes]],
            headers: Mapping[str, str], claim: _Claim, secret: str) -> AuthContext:
    signer = claim.signer
    key = signing_key(secret, signer.date, signer.region)
    if claim.presigned:  # the signature cannot sign itself (query-auth reference)
        params = [(n, v) for n, v in params if n != b"X-Amz-Signature"]
    rest = (f"{_canonical_query(params) if params else ''}\n{_canonical_headers(signer.headers, headers)}\n"
            f"{signer.listed}\n{claim.payload_hash}")
    # The signature is hex: one that is not ASCII matches nothing (and
    # compare_digest takes str only when both are ASCII).
    provided = claim.signature if claim.signature.isascii() else ""
    tried: list[tuple[str, str]] = []
    for uri in candidate_uris(raw_path):
        canonical_request = f"{method}\n{uri}\n{rest}"
        to_sign = string_to_sign(claim.amz_date, signer.scope, canonical_request)
        if hmac.compare_digest(signature(key, to_sign), provided):
            payload = claim.payload_hash  # checked by _payload_hash: a mode, or 64 hex digits
            return AuthContext(signer.access_key, payload if payload in _PAYLOAD_MODES else payload.lower(),
                               key, claim.amz_date, signer.scope, claim.signature)
        tried.append((canonical_request, to_sign))
    # S3 echoes what it signed so a client can diff it against its own.
    raise S3Error("SignatureDoesNotMatch", AWSAccessKeyId=signer.access_key,
                  StringToSign=tried[0][1], SignatureProvided=claim.signature,
                  CanonicalRequest=tried[0][0])


def _claim_from_header(headers: Mapping[str, str], now: datetime) -> _Claim:
    algorithm, _, rest = headers["authorization"].strip().partition(" ")
    if algorithm != ALGORITHM:  # e.g. SigV4a
        raise S3Error("InvalidRequest", _NOT_V4)
    # Everything but the signature is the same for a client's requests of a
    # day: parsed once (clients put the signature last).
    signed_part, _, last = rest.rpartition(",")
    name, _, signature_value = last.strip().partition("=")
    if name == "Signature" and signature_value and "Signature=" not in signed_part:
        signer = _signed_part(signed_part)
    else:
        parts = _auth_parts(rest)
        signer = _components(parts)
        signature_value = parts["Signature"]
    amz_date, when = _header_time(headers)
    if abs(now - when) > MAX_SKEW:
        raise S3Error("RequestTimeTooSkewed", "The difference between the request time and "
                      "the current time is too large.", RequestTime=amz_date,
                      ServerTime=iso(now), MaxAllowedSkewMilliseconds=900000)
    if signer.date != amz_date[:8]:
        raise _header_malformed("Invalid credential date. Date is not the same as X-Amz-Date.")
    return _Claim(signer, amz_date, signature_value, _payload_hash(headers.get("x-amz-content-sha256")),
                  presigned=False)


def _auth_parts(text: str) -> dict[str, str]:
    """``name=value`` items of an Authorization header, separated by commas."""
    parts: dict[str, str] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        if sep:
            parts[name.strip()] = value.strip()
    return parts


@functools.lru_cache(maxsize=1024)
def _signed_part(text: str) -> _Signer:
    """:func:`_components` of the items before the signature (cached)."""
    return _components(_auth_parts(text) | {"Signature": "-"})


def _components(parts: dict[str, str]) -> _Signer:
    """Access key, date, region and signed header names of an Authorization header."""
    if not all(parts.get(k) for k in ("Credential", "SignedHeaders", "Signature")):
        raise _header_malformed("the authorization header requires three components: "
                                "Credential, SignedHeaders, and Signature.")
    access_key, date, region = _parse_credential(parts["Credential"], _header_malformed)
    return _signer(access_key, date, region, _signed_headers(parts["SignedHeaders"], _header_malformed))


def _claim_from_query(query: Mapping[str, str], headers: Mapping[str, str],
                      now: datetime) -> _Claim:
    if any(not query.get(name) for name in _QUERY_AUTH_PARAMS):
        raise _query_error("Query-string authentication version 4 requires the "
                           + ", ".join(_QUERY_AUTH_PARAMS[:-1]) + ", and X-Amz-Expires parameters.")
    if query["X-Amz-Algorithm"] != ALGORITHM:
        raise _query_error('X-Amz-Algorithm only supports "AWS4-HMAC-SHA256"')
    access_key, date, region = _parse_credential(query["X-Amz-Credential"], _credential_error)
    amz_date = query["X-Amz-Date"]
    when = parse_amz_date(amz_date)
    if when is None:
        raise _query_error("X-Amz-Date must be in the ISO8601 Long Format "
                           "\"yyyyMMdd'T'HHmmss'Z'\"")
    expires = _expires(query["X-Amz-Expires"])
    if date != amz_date[:8]:
        raise _query_error("Invalid credential date. Date is not the same as X-Amz-Date.")
    if when - now > MAX_SKEW:
        raise S3Error("AccessDenied", "Request is not valid yet", ServerTime=iso(now))
    # In whole seconds, as X-Amz-Date counts them: a URL is good through the
    # last second of its lifetime. S3 takes lifetimes of 1 to 604800 seconds
    # and answers X-Amz-Expires=0 as expired at once, even in its first second.
    if not expires or now.replace(microsecond=0) > when + timedelta(seconds=expires):
        raise S3Error("AccessDenied", "Request has expired", **{"X-Amz-Expires": expires},
                      Expires=iso(when + timedelta(seconds=expires)), ServerTime=iso(now))
    # Presigned URLs carry no payload hash unless the client chose to sign one
    # (as a header, as botocore does, or as a query parameter).
    declared = headers.get("x-amz-content-sha256")
    if declared is None:
        declared = next((v for k, v in query.items() if k.lower() == "x-amz-content-sha256"),
                        UNSIGNED_PAYLOAD)
    signer = _signer(access_key, date, region, _signed_headers(query["X-Amz-SignedHeaders"], _query_error))
    return _Claim(signer, amz_date, query["X-Amz-Signature"], _payload_hash(declared), presigned=True)


def _parse_credential(value: str, error: Callable[[str], S3Error]) -> tuple[str, str, str]:
    """Split ``AK/YYYYMMDD/region/s3/aws4_request``; any region is accepted."""
    parts = value.rsplit("/", 4)
    if len(parts) != 5 or not all(parts[:3]) or not _SCOPE_DATE.fullmatch(parts[1]):
        raise error('the Credential is mal-formed; expecting '
                    '"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request".')
    access_key, date, region, service, terminator = parts
    if service != SERVICE:
        raise error(f'incorrect service "{service}". This endpoint belongs to "{SERVICE}".')
    if terminator != TERMINATOR:
        raise error(f'incorrect terminal "{terminator}". This endpoint uses "{TERMINATOR}".')
    return access_key, date, region


def _signed_headers(value: str, error: Callable[[str], S3Error]) -> tuple[str, ...]:
    """The names of ``SignedHeaders``: header names joined by ``;``, nothing
    else. A name with a blank or a control character in it is refused, not
    trimmed: no two spellings of one list are accepted."""
    names = tuple(name.lower() for name in value.split(";"))
    if not all(_HEADER_NAME.fullmatch(name) for name in names):
        raise error(f"SignedHeaders is malformed: {value!r}")
    return names


def _check_signed_headers(signer: _Signer, headers: Mapping[str, str]) -> None:
    """Every signed header must be present; host and x-amz-* ones must be signed.

    S3 refuses unsigned x-amz-* headers (HeadersNotSigned) so that nobody can
    add, say, x-amz-copy-source to a presigned URL; x-amz-content-sha256 is
    exempt, as on S3, because it is bound by the canonical request anyway.
    """
    signed = signer.names
    if not all(name in headers for name in signer.headers):
        raise S3Error("SignatureDoesNotMatch", "Signed header(s) missing from the request: "
                      + ", ".join(name for name in signer.headers if name not in headers))
    unsigned = [name for name in headers if name not in signed and name.startswith("x-amz-")
                and name != "x-amz-content-sha256"]
    if unsigned or "host" not in signed:
        raise S3Error("AccessDenied", "There were headers present in the request which were "
                      "not signed", HeadersNotSigned=", ".join(
                          (["host"] if "host" not in signed else []) + sorted(unsigned)))


def _payload_hash(value: str | None) -> str:
    """Validate x-amz-content-sha256 (S3 requires it with header auth)."""
    if value is None:
        raise S3Error("InvalidRequest",
                      "Missing required header for this request: x-amz-content-sha256")
    if value in _PAYLOAD_MODES or _HEX64.fullmatch(value):
        return value
    if value.startswith("STREAMING-AWS4-ECDSA-P256-SHA256"):
        raise S3Error("NotImplemented", "SigV4a (ECDSA) payload signing is not implemented; "
                      "use AWS4-HMAC-SHA256")
    raise S3Error("InvalidArgument", "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, "
                  "STREAMING-UNSIGNED-PAYLOAD-TRAILER, STREAMING-AWS4-HMAC-SHA256-PAYLOAD, "
                  "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER or a valid sha256 value.",
                  ArgumentName="x-amz-content-sha256", ArgumentValue=value)


def _header_time(headers: Mapping[str, str]) -> tuple[str, datetime]:
    """The request time: x-amz-date, else an RFC 7231 Date header (SigV4 allows either)."""
    if "x-amz-date" in headers:
        when = parse_amz_date(headers["x-amz-date"])
        if when is None:
            raise S3Error("AccessDenied", _BAD_DATE)
        return headers["x-amz-date"], when
    when = parse_http_datetime(headers.get("date"))
    if when is None:
        raise S3Error("AccessDenied", _BAD_DATE)
    return when.strftime(AMZ_DATE_FORMAT), when


def _expires(value: str) -> int:
    """X-Amz-Expires as S3 checks it, with S3's messages: a whole number of
    seconds from 0 to a week (0 is let through here: S3 answers it as an
    expired request, 403 rather than 400, which the expiry check does)."""
    negative = value.startswith("-")
    seconds = decimal(value[1:] if negative else value)
    if seconds is None:
        raise _query_error("X-Amz-Expires should be a number")
    if negative and seconds:
        raise _query_error("X-Amz-Expires must be non-negative")
    if seconds > MAX_EXPIRES:
        raise _query_error("X-Amz-Expires must be less than a week (in seconds); that is, the given "
                           "X-Amz-Expires must be less than 604800 seconds")
    return seconds


def _canonical_query(params: list[tuple[bytes, bytes]]) -> str:
    """Names and values re-encoded strictly (RFC 3986 unreserved kept, space as
    %20), then sorted by name, then value (SigV4 "CanonicalQueryString")."""
    encoded = sorted((_uri_encode(name), _uri_encode(value)) for name, value in params)
    return "&".join([f"{name}={value}" for name, value in encoded])


def _uri_encode(raw: bytes) -> str:
    """``quote(raw, safe="")``, without its per-byte work for the usual
    value made of unreserved characters only (a presigned URL's are)."""
    return raw.decode("ascii") if _UNRESERVED.fullmatch(raw) else quote(raw, safe="")


def _canonical_headers(signed: tuple[str, ...], headers: Mapping[str, str]) -> str:
    """``name:value\\n`` per signed header, values trimmed and inner whitespace
    runs collapsed to one space (SigV4 "Trimall")."""
    return "".join([f"{name}:{' '.join(headers[name].split())}\n" for name in signed])


def _header_malformed(detail: str) -> S3Error:
    return S3Error("AuthorizationHeaderMalformed",
                   "The authorization header is malformed; " + detail)


def _query_error(message: str) -> S3Error:
    return S3Error("AuthorizationQueryParametersError", message)


def _credential_error(detail: str) -> S3Error:
    return _query_error("Error parsing the X-Amz-Credential parameter; " + detail)
