"""Request bodies: framing, declared digests and lengths, for PUT-like calls.

Turns a request into the plain byte stream the object service stores and
the ``Integrity`` claims it verifies: aws-chunked bodies are unframed (chunk
signatures checked as they pass), trailing checksums are handed over when
the trailer arrives, signed payloads get their SHA-256 checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import AsyncIterator

from gateway.s3 import chunked
from gateway.s3.errors import S3Error
from gateway.s3.headers import decimal
from gateway.s3.http import S3Request
from tiering.model import checksums
from tiering.model.inputs import Integrity

_NOT_CHECKSUMS = {"x-amz-checksum-mode", "x-amz-checksum-type", "x-amz-checksum-algorithm"}


def checksum_claim(headers: dict[str, str]) -> tuple[str | None, str | None]:
    """(algorithm, value) the client declared; value None if it comes in a trailer."""
    found = [
        (name, value)
        for name, value in headers.items()
        if name.startswith("x-amz-checksum-") and name not in _NOT_CHECKSUMS
    ]
    if len(found) > 1:
        raise S3Error("InvalidRequest", "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.")
    if found:
        name, value = found[0]
        algorithm = checksums.algorithm_from_header(name)
        if algorithm is None:
            raise S3Error("InvalidRequest", f"Unsupported checksum header {name}")
        return algorithm, value.strip()
    trailer = headers.get("x-amz-trailer", "").strip().lower()
    if trailer:
        algorithm = checksums.algorithm_from_header(trailer)
        if algorithm is None:
            raise S3Error("InvalidRequest", f"Unsupported trailer {trailer}")
        return algorithm, None
    sdk = headers.get("x-amz-sdk-checksum-algorithm")
    if sdk:
        # S3 wants the value itself (a header or a trailer) beside the
        # algorithm's name; the name alone is refused, not computed.
        algorithm = sdk.strip().upper()
        if algorithm not in checksums.ALGORITHMS:
            raise S3Error("InvalidRequest", f"Checksum algorithm {sdk} is not supported")
        raise S3Error("InvalidRequest", "x-amz-sdk-checksum-algorithm specified, but no corresponding "
                      "x-amz-checksum-* or x-amz-trailer headers were found.")
    return None, None


def _content_md5(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        if len(base64.b64decode(value.strip(), validate=True)) != 16:
            raise ValueError
    except (binascii.Error, ValueError) as exc:
        raise S3Error("InvalidDigest", "The Content-MD5 you specified was invalid.") from exc
    return value.strip()


def _length(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    length = decimal(value.strip())
    if length is None:
        raise S3Error("InvalidArgument", f"Invalid {name}", ArgumentName=name, ArgumentValue=value)
    return length


def prepare(req: S3Request) -> tuple[AsyncIterator[bytes], Integrity]:
    """The decoded body stream of ``req`` and what must hold of it."""
    h = req.headers
    algorithm, value = checksum_claim(h)
    if algorithm is not None and value is not None:
        checksums.decode_digest(algorithm, value)  # InvalidRequest if malformed
    integrity = Integrity(
        content_md5=_content_md5(h.get("content-md5")),
        checksum_algorithm=algorithm,
        checksum_value=value,
    )
    mode = req.auth.payload_hash if req.auth is not None else "UNSIGNED-PAYLOAD"
    if mode in chunked.MODES:
        decoded = _length(h.get("x-amz-decoded-content-length"), "x-amz-decoded-content-length")
        if decoded is None:
            raise S3Error("MissingContentLength", "You must provide the Content-Length HTTP header.")
        integrity.expected_size = decoded
        signer = req.auth if mode != chunked.UNSIGNED_TRAILER else None
        return _unchunk(req, chunked.AwsChunkedDecoder(mode, signer), integrity), integrity
    integrity.expected_size = _length(h.get("content-length"), "Content-Length")
    if len(mode) == 64:  # a hex SHA-256 of the payload, signed by the client
        integrity.payload_sha256 = mode.lower()
    return req.stream(), integrity


async def _unchunk(
    req: S3Request, decoder: chunked.AwsChunkedDecoder, integrity: Integrity
) -> AsyncIterator[bytes]:
    async for raw in req.stream():
        for piece in decoder.feed(raw):
            yield bytes(piece)
    decoder.finish()
    if integrity.checksum_algorithm is not None:
        trailer = decoder.trailers.get(checksums.header_name(integrity.checksum_algorithm))
        if trailer is not None:
            checksums.decode_digest(integrity.checksum_algorithm, trailer)  # InvalidRequest if malformed
            integrity.checksum_value = trailer
        elif integrity.checksum_value is None and req.headers.get("x-amz-trailer"):
            raise S3Error("InvalidRequest", "The trailing checksum announced in x-amz-trailer was not sent.")


async def read_small(req: S3Request, limit: int) -> bytes:
    """A small request body (XML), read whole and checked against the
    signed SHA-256, Content-MD5 and x-amz-checksum-* the client sent."""
    data = await req.read(limit)
    signed = req.auth.payload_hash if req.auth is not None else ""
    if len(signed) == 64 and hashlib.sha256(data).hexdigest() != signed.lower():
        raise S3Error("XAmzContentSHA256Mismatch",
                      "The provided 'x-amz-content-sha256' header does not match what was computed.")
    md5 = _content_md5(req.headers.get("content-md5"))
    if md5 is not None and base64.b64encode(hashlib.md5(data).digest()).decode() != md5:
        raise S3Error("BadDigest", "The Content-MD5 you specified did not match what we received.")
    algorithm, value = checksum_claim(req.headers)
    if algorithm is not None and value is not None:
        hasher = checksums.new_hasher(algorithm)
        hasher.update(data)
        if hasher.b64() != value:
            raise S3Error("BadDigest", f"The {algorithm} you specified did not match the calculated checksum.")
    return data
