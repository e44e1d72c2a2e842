"""How the S3 capacity store reads S3's answers: which error codes mean a
missing object, a lost conditional write or a transient failure worth a
retry, and the checks of a GET's body. ``S3Store.call`` (``s3.py``) applies
this table once per request; failures are classified by code and status,
never by message text."""

from __future__ import annotations

import asyncio
import functools
import re
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from botocore.exceptions import (
    ClientError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

# ---- the code table: how each S3 answer is handled -----------------------

# A missing object. HEAD has no body, so its 404 carries the code "404".
# NoSuchBucket is not here: a missing bucket is a configuration failure.
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})

# A store asking for fewer requests, by code (botocore's throttling list).
THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
    }
)

# Transient by code (botocore's standard-mode lists); besides these, every
# HTTP 5xx and 429 is retried.
RETRY_CODES = THROTTLING_CODES | frozenset(
    {
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "InternalError",
        "ServiceUnavailable",
        # The store refused a body that no longer matched the digest sent
        # with it: damaged in transit. The body is still in hand; send it again.
        "BadDigest",
        "XAmzContentSHA256Mismatch",
    }
)

# A conditional write that lost: the object is not as expected (412), or
# another conditional write on it was in flight (409, AWS).
CONFLICT_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})

# Transport failures: connection refused/reset/closed, timeouts, a body cut
# short (aiobotocore checks Content-Length), plain socket errors.
TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    HTTPClientError,  # ReadTimeoutError, ConnectionClosedError, ResponseStreamingError
    BotoConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ...
    IncompleteReadError,
    # A body that does not match the checksum the store sent with it
    # (x-amz-checksum-*, checked by botocore): damaged in transit.
    FlexibleChecksumError,
    aiohttp.ClientError,
    asyncio.TimeoutError,
    OSError,  # ConnectionError and friends
)

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class BadBody(Exception):
    """A GET body of the wrong length (cut short, or not the range asked for):
    retried like a connection reset."""

    def __init__(self, got: int, want: int) -> None:
        super().__init__(f"short body: got {got} of {want} bytes")


def client_error_code(exc: ClientError) -> tuple[str, int]:
    error = exc.response.get("Error") or {}
    meta = exc.response.get("ResponseMetadata") or {}
    return str(error.get("Code") or ""), int(meta.get("HTTPStatusCode") or 0)


def retryable(code: str, status: int) -> bool:
    return code in RETRY_CODES or status == 429 or status >= 500


# Last-Modified dates as parsed: objects written together share their
# second, so a cold epoch parses a few distinct strings (6 us each) many times.
http_date = functools.lru_cache(maxsize=1024)(parsedate_to_datetime)


def parse_content_range(value: str) -> tuple[int, int, int | None]:
    match = _CONTENT_RANGE.match(value.strip())
    if match is None:
        raise BadBody(0, 0)
    total = None if match[3] == "*" else int(match[3])
    return int(match[1]), int(match[2]), total


async def read_body(response: dict[str, Any]) -> bytes:
    async with response["Body"] as body:
        data: bytes = await body.read()
    return data
