"""What SigV4 and SigV2 verification share: the verified request's context
and the wire-level helpers both signature versions need."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, unquote_to_bytes

from tiering.capacity.sigv4 import EMPTY_SHA256, signature, utf8

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# S3 refuses a request whose time is more than 15 minutes from its clock.
MAX_SKEW = timedelta(minutes=15)
AMZ_DATE_FORMAT = "%Y%m%dT%H%M%SZ"
_AMZ_DATE = re.compile(r"[0-9]{8}T[0-9]{6}Z")


@dataclass(slots=True)
class AuthContext:
    """What a verified request proves, and the key to check its aws-chunked body.
    Not changed once made (not frozen: one is made per request, and a
    frozen dataclass pays an ``object.__setattr__`` per field).

    ``payload_hash`` is the declared x-amz-content-sha256: a hex digest (lower
    case), ``UNSIGNED-PAYLOAD`` (always so for presigned URLs unless the client
    signed one) or a ``STREAMING-*`` mode.
    """

    access_key: str
    payload_hash: str
    signing_key: bytes = field(repr=False)
    amz_date: str
    scope: str
    seed_signature: str

    def chunk_signature(self, previous_signature: str, chunk_sha256_hex: str) -> str:
        """One aws-chunked chunk's signature, chained on the previous one (the
        seed is the request's; the empty-string hash stands for no headers)."""
        return signature(self.signing_key, "\n".join((
            "AWS4-HMAC-SHA256-PAYLOAD", self.amz_date, self.scope,
            previous_signature, EMPTY_SHA256, chunk_sha256_hex,
        )))

    def trailer_signature(self, previous_signature: str, trailer_bytes: bytes) -> str:
        """The trailing headers' signature, chained on the last (empty) chunk's.

        ``trailer_bytes`` is each trailer as ``name:value\n`` (LF, not the wire's
        CRLF), as in AWS's "Signature calculations for trailing headers" example.
        """
        return signature(self.signing_key, "\n".join((
            "AWS4-HMAC-SHA256-TRAILER", self.amz_date, self.scope,
            previous_signature, hashlib.sha256(trailer_bytes).hexdigest(),
        )))


@functools.lru_cache(maxsize=256)
def parse_amz_date(value: str) -> datetime | None:
    """``20261203T165600Z`` as an aware UTC datetime; None if malformed.

    Cached: requests signed in the same second carry the same value, and
    this runs for every request (strptime alone cost a third of a SigV4
    check)."""
    if not _AMZ_DATE.fullmatch(value):  # exactly 8 digits, T, 6 digits, Z
        return None
    try:
        return datetime(
            int(value[0:4]), int(value[4:6]), int(value[6:8]),
            int(value[9:11]), int(value[11:13]), int(value[13:15]), tzinfo=UTC,
        )
    except ValueError:  # e.g. month 13, or second 60
        return None


def split_query(raw_query: str) -> list[tuple[bytes, bytes]]:
    """Decoded (name, value) pairs; a parameter without '=' has an empty value.

    A raw '+' is a space, as in form encoding (botocore's AWSRequest sends
    spaces so and signs them as %20); a literal plus arrives as %2B. The
    router must read the query the same way (``urllib.parse.parse_qsl`` does).
    """
    pairs = []
    for item in raw_query.split("&"):
        if item:
            name, _, value = item.replace("+", " ").partition("=")
            pairs.append((_unquote(name), _unquote(value)))
    return pairs


def _unquote(text: str) -> bytes:
    return unquote_to_bytes(utf8(text)) if "%" in text else utf8(text)


def candidate_uris(raw_path: str) -> Iterator[str]:
    """The path as sent, then re-encoded once, for clients that sign one but send the other.

    S3 neither normalizes the path (no '//' or '.' removal) nor double-encodes
    it: the canonical URI is the key URI-encoded once. Most clients send exactly
    what they signed; some send characters such as '+' or '=' raw but sign them
    encoded, which only the re-encoded form matches.
    """
    as_sent = raw_path or "/"
    yield as_sent
    reencoded = quote(unquote_to_bytes(utf8(as_sent)), safe="/")  # only when the first did not match
    if reencoded != as_sent:
        yield reencoded


def iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
