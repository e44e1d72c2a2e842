"""The SigV4 arithmetic both sides of the gateway use (sans-I/O).

The gateway verifies its clients' signatures (``gateway.sigv4``) and signs
its own ranged GETs to the capacity store (``tiering._s3_get``): the same
derived key, scope and string to sign. Text is encoded as UTF-8 with
surrogateescape, so bytes a caller decoded that way go back out unchanged.
"""

from __future__ import annotations

import hashlib
import hmac
from functools import lru_cache

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "s3"
TERMINATOR = "aws4_request"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


@lru_cache(maxsize=64)
def signing_key(secret: str, date: str, region: str) -> bytes:
    """kSigning: the HMAC chain over date, region, service and terminator.
    Cached, because every request of a day in a region derives the same key."""
    key = hmac.digest(utf8("AWS4" + secret), utf8(date), "sha256")
    for part in (region, SERVICE, TERMINATOR):
        key = hmac.digest(key, utf8(part), "sha256")
    return key


def credential_scope(date: str, region: str) -> str:
    return f"{date}/{region}/{SERVICE}/{TERMINATOR}"


def string_to_sign(amz_date: str, scope: str, canonical_request: str) -> str:
    digest = hashlib.sha256(utf8(canonical_request)).hexdigest()
    return f"{ALGORITHM}\n{amz_date}\n{scope}\n{digest}"


def signature(key: bytes, to_sign: str) -> str:
    return hmac.digest(key, utf8(to_sign), "sha256").hex()  # one-shot: no HMAC object
