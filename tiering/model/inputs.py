"""What a client hands the object service along with a body."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tiering.model.conditions import WriteConditions


@dataclass(slots=True)
class Integrity:
    """What the client claims about a body, checked once it has been read.

    ``checksum_value`` may be filled in by the caller while the body streams
    (aws-chunked trailers arrive after the data); it is read only after the
    body iterator is exhausted.
    """

    content_md5: str | None = None  # base64, from Content-MD5
    checksum_algorithm: str | None = None
    checksum_value: str | None = None  # base64, header or trailer
    payload_sha256: str | None = None  # hex, when the payload was signed
    expected_size: int | None = None  # Content-Length or x-amz-decoded-content-length


@dataclass(slots=True)
class NewObject:
    """Metadata a client supplies with PutObject / CreateMultipartUpload."""

    content_type: str = "binary/octet-stream"
    headers: dict[str, str] = field(default_factory=dict)
    user_meta: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)  # x-amz-tagging


@dataclass(slots=True)
class Write:
    """One object write as a bucket backend takes it: the key, the body and
    what the client says of it, and S3's write conditions."""

    key: str
    body: AsyncIterator[bytes]
    new: NewObject
    integrity: Integrity
    conditions: WriteConditions = WriteConditions()
