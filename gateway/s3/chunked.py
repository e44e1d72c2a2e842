"""Sans-I/O decoder for ``Content-Encoding: aws-chunked`` request bodies.

S3 clients that stream a body of unknown hash send it framed in chunks
(https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming.html and
sigv4-streaming-trailers.html). The mode is named by ``x-amz-content-sha256``:

``STREAMING-AWS4-HMAC-SHA256-PAYLOAD``
    ``<hex-size>;chunk-signature=<sig>\\r\\n<data>\\r\\n`` ..., ending with a
    zero-size chunk ``0;chunk-signature=<sig>\\r\\n\\r\\n``. Each signature
    chains on the previous one, the first on the request's seed signature.
``STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER``
    The same, but the zero-size chunk is followed by trailer lines
    ``name:value\\r\\n``, then ``x-amz-trailer-signature:<sig>\\r\\n``, then
    ``\\r\\n``. The trailer signature covers the trailers in canonical form
    (``name:value\\n`` each), chained on the zero-size chunk's signature.
``STREAMING-UNSIGNED-PAYLOAD-TRAILER``
    Plain HTTP/1.1 chunked framing: ``<hex-size>\\r\\n<data>\\r\\n`` ..., then
    ``0\\r\\n``, trailer lines, ``\\r\\n``. botocore sends exactly this (1 MiB
    chunks, no extensions, one ``x-amz-checksum-*`` trailer) for PutObject and
    UploadPart over https.

Like h11, the decoder never touches a socket: feed it bytes, get payload
pieces back. Every buffer is bounded, and real S3 answers every framing error
with 400 IncompleteBody, so we do too; a wrong signature is 403
SignatureDoesNotMatch. Trailer values (checksums) are only parsed here; the
PUT path verifies them against what it hashed.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Final, Protocol

from gateway.s3.errors import S3Error
from tiering.capacity.sigv4 import EMPTY_SHA256

SIGNED: Final = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
SIGNED_TRAILER: Final = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
UNSIGNED_TRAILER: Final = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
MODES: Final = frozenset({SIGNED, SIGNED_TRAILER, UNSIGNED_TRAILER})

# A legal size line is at most ~100 bytes (16 hex digits + ";chunk-signature="
# + 64 hex). 4 KiB leaves room for unknown extensions in the unsigned mode
# while making sure a peer that never sends CRLF cannot grow our buffer.
MAX_LINE: Final = 4 * 1024
# Trailers carry a checksum or two; 16 KiB bounds a peer streaming headers.
MAX_TRAILERS: Final = 16 * 1024

TRAILER_SIGNATURE: Final = "x-amz-trailer-signature"
_HEX_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")
_SIGNED_EXT = re.compile(rb";chunk-signature=([0-9a-fA-F]{64})")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_SIGNATURE = re.compile(r"[0-9a-fA-F]{64}")

_SIZE, _DATA, _DATA_CRLF, _TRAILER, _DONE, _FAILED = range(6)


class ChunkSigner(Protocol):
    """Computes the SigV4 signatures a signed aws-chunked body must carry."""

    seed_signature: str

    def chunk_signature(self, previous_signature: str, chunk_sha256_hex: str) -> str: ...

    def trailer_signature(self, previous_signature: str, trailer_bytes: bytes) -> str: ...


def _malformed(message: str) -> S3Error:
    return S3Error("IncompleteBody", message)


class AwsChunkedDecoder:
    """Turns an aws-chunked body into payload pieces, verifying signatures.

    ``feed`` returns memoryviews: slices of the fed bytes where possible (no
    copy), otherwise one buffer per chunk. In the unsigned mode data is
    returned as soon as it arrives; in signed modes only after the chunk's
    signature has been verified, so at most one chunk is buffered.
    """

    def __init__(
        self,
        mode: str,
        signer: ChunkSigner | None = None,
        *,
        max_chunk_size: int = 64 * 1024 * 1024,
    ) -> None:
        if mode not in MODES:
            raise S3Error("NotImplemented", f"x-amz-content-sha256 {mode} is not supported")
        self.signed = mode != UNSIGNED_TRAILER
        if self.signed and signer is None:
            raise ValueError(f"{mode} needs a signer")
        self.mode = mode
        self.max_chunk_size = max_chunk_size
        self.trailers: dict[str, str] = {}
        self.decoded_length = 0
        self._signer = signer
        self._previous = signer.seed_signature if signer is not None else ""
        self._state = _SIZE
        self._line = bytearray()
        self._trailer_bytes = 0
        self._trailer_signature: str | None = None
        self._remaining = 0  # bytes of the current chunk still to come
        self._crlf_seen = 0  # bytes of the CRLF after chunk data already seen
        self._chunk_signature = ""
        self._sha = hashlib.sha256()
        self._buffer = bytearray()
        self._error: S3Error | None = None

    @property
    def done(self) -> bool:
        """True once the final chunk and the trailer section were parsed."""
        return self._state == _DONE

    def feed(self, data: bytes) -> list[memoryview]:
        """Consume ``data``; return the payload pieces it completed."""
        if self._error is not None:
            raise self._error
        if not isinstance(data, bytes):
            # Returned slices must not change if the caller reuses its buffer.
            data = bytes(data)
        try:
            return self._feed(data)
        except S3Error as exc:
            self._state, self._error = _FAILED, exc
            raise

    def finish(self) -> None:
        """Call at end of input: the body must have ended exactly here."""
        if self._error is not None:
            raise self._error
        if self._state != _DONE:
            self._state = _FAILED
            self._error = S3Error("IncompleteBody", "The request body terminated unexpectedly")
            raise self._error

    # -- state machine -----------------------------------------------------

    def _feed(self, data: bytes) -> list[memoryview]:
        out: list[memoryview] = []
        view = memoryview(data)
        pos, end = 0, len(data)
        while pos < end:
            state = self._state
            if state == _SIZE or state == _TRAILER:
                pos, line = self._read_line(data, pos)
                if line is None:
                    break
                if state == _SIZE:
                    self._on_size_line(line)
                else:
                    self._on_trailer_line(line)
            elif state == _DATA:
                pos = self._read_data(view, pos, out)
            elif state == _DATA_CRLF:
                while pos < end and self._crlf_seen < 2:
                    if data[pos] != b"\r\n"[self._crlf_seen]:
                        raise _malformed("chunk data is not followed by CRLF")
                    pos += 1
                    self._crlf_seen += 1
                if self._crlf_seen == 2:
                    self._state = _SIZE
            else:  # _DONE
                raise _malformed("data after the end of the aws-chunked body")
        return out

    def _read_line(self, data: bytes, pos: int) -> tuple[int, bytes | None]:
        """Accumulate up to LF; return (new pos, line without CRLF or None)."""
        limit = MAX_LINE
        if self._state == _TRAILER:
            limit = min(limit, MAX_TRAILERS - self._trailer_bytes)
        # Search no further than the limit allows: a peer that never sends
        # LF costs us at most MAX_LINE bytes, not a scan of the whole feed.
        stop = min(len(data), pos + limit - len(self._line))
        idx = data.find(b"\n", pos, stop)
        if idx < 0:
            self._line += data[pos:stop]
            if len(self._line) >= limit:
                what = "trailer section" if self._state == _TRAILER else "chunk-size line"
                raise _malformed(f"aws-chunked {what} is too long")
            return stop, None
        self._line += data[pos : idx + 1]
        line = bytes(self._line)
        self._line.clear()
        if self._state == _TRAILER:
            self._trailer_bytes += len(line)
        if not line.endswith(b"\r\n"):
            raise _malformed("aws-chunked line does not end with CRLF")
        return idx + 1, line[:-2]

    def _on_size_line(self, line: bytes) -> None:
        m = _HEX_SIZE.match(line)
        if m is None:
            raise _malformed("invalid aws-chunked chunk size")
        size = int(m.group(), 16)
        ext = line[m.end() :]
        if self.signed:
            sig = _SIGNED_EXT.fullmatch(ext)
            if sig is None:
                raise _malformed("chunk-signature missing or malformed")
            self._chunk_signature = sig.group(1).decode("ascii").lower()
        elif ext and not ext.startswith(b";"):
            # Unsigned mode is RFC 9112 chunking: extensions are ignored.
            raise _malformed("invalid aws-chunked chunk size")
        if size > self.max_chunk_size:
            # Signed chunks are held in memory until verified; an absurd size
            # would let one request pin gigabytes. Clients use 64 KiB - 1 MiB.
            raise S3Error(
                "InvalidRequest",
                f"aws-chunked chunk of {size} bytes exceeds the limit of "
                f"{self.max_chunk_size} bytes",
            )
        if size == 0:
            if self.signed:
                self._verify_chunk(EMPTY_SHA256)
            self._state = _TRAILER
        else:
            self._remaining = size
            self._sha = hashlib.sha256()
            self._state = _DATA

    def _read_data(self, view: memoryview, pos: int, out: list[memoryview]) -> int:
        take = min(self._remaining, len(view) - pos)
        piece = view[pos : pos + take]
        self._remaining -= take
        if not self.signed:
            out.append(piece)
            self.decoded_length += take
        else:
            self._sha.update(piece)
            if self._remaining == 0 and not self._buffer:
                whole = piece  # whole chunk in this feed: verify in place
            else:
                self._buffer += piece
                whole = memoryview(self._buffer) if self._remaining == 0 else None
            if whole is not None:
                self._verify_chunk(self._sha.hexdigest())
                out.append(whole)
                self.decoded_length += len(whole)
                self._buffer = bytearray()  # the old one now belongs to the caller
        if self._remaining == 0:
            self._state, self._crlf_seen = _DATA_CRLF, 0
        return pos + take

    def _verify_chunk(self, chunk_sha256_hex: str) -> None:
        assert self._signer is not None
        expected = self._signer.chunk_signature(self._previous, chunk_sha256_hex)
        if not hmac.compare_digest(expected.lower(), self._chunk_signature):
            raise S3Error("SignatureDoesNotMatch")
        self._previous = self._chunk_signature

    def _on_trailer_line(self, line: bytes) -> None:
        if not line:
            if self.mode == SIGNED_TRAILER and self._trailer_bytes == 2:
                # A blank line right after the zero-size chunk: the S3 docs'
                # example can be read that way (SDKs send none). It cannot be
                # the end, as the trailer signature is mandatory, so skip it.
                return
            self._end_trailers()
            return
        if self._trailer_signature is not None:
            raise _malformed("trailer after x-amz-trailer-signature")
        if self.mode == SIGNED:
            raise _malformed("trailers are not allowed with " + SIGNED)
        try:
            text = line.decode("ascii")
        except UnicodeDecodeError:
            raise _malformed("trailer is not ASCII") from None
        name, sep, value = text.partition(":")
        name, value = name.lower(), value.strip(" \t")
        if not sep or _TOKEN.fullmatch(name) is None:
            raise _malformed("malformed trailer line")
        if name == TRAILER_SIGNATURE:
            if not self.signed or _SIGNATURE.fullmatch(value) is None:
                raise _malformed("unexpected or malformed x-amz-trailer-signature")
            self._trailer_signature = value.lower()
        elif name in self.trailers:
            raise _malformed(f"duplicate trailer {name}")
        else:
            self.trailers[name] = value

    def _end_trailers(self) -> None:
        if self.mode == SIGNED_TRAILER:
            if self._trailer_signature is None:
                raise _malformed("x-amz-trailer-signature is missing")
            assert self._signer is not None
            # Canonical trailer form, as the SDKs sign it: "name:value\n" each.
            canonical = "".join(f"{k}:{v}\n" for k, v in self.trailers.items())
            expected = self._signer.trailer_signature(self._previous, canonical.encode())
            if not hmac.compare_digest(expected.lower(), self._trailer_signature):
                raise S3Error("SignatureDoesNotMatch")
        self._state = _DONE
