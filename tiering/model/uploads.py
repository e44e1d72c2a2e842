"""Multipart uploads as S3 states them, whoever stores the parts: the size
and number limits, the checks of Create, UploadPart and Complete requests,
and the completed object's ETag and checksum. Managed buckets
(``tiering/managed/multipart.py``) and read-write mounts
(``tiering/mounts/uploads.py``) both apply them.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
from dataclasses import dataclass

from tiering.errors import EntityTooLarge, InvalidArgument, InvalidPartOrder, InvalidRequest
from tiering.meta import Checksum, Part, Upload
from tiering.model import checksums
from tiering.model.inputs import Integrity
from tiering.model.names import check_key

MIN_PART_SIZE = 5 * 1024**2  # every part but the last, as S3 requires
MAX_PART_NUMBER = 10_000
MAX_PART_SIZE = 5 * 1024**3
MAX_OBJECT_SIZE = 5 * 1024**4  # S3's largest object: what a Complete may add up to


@dataclass(frozen=True, slots=True)
class ChosenPart:
    """One <Part> of a CompleteMultipartUpload request."""

    part_number: int
    etag: str  # without quotes
    checksum: str | None = None  # base64 value of the upload's algorithm, if sent
    checksum_algorithm: str | None = None  # the algorithm the request named for it


def check_create(key: str, checksum_algorithm: str | None, checksum_type: str | None) -> str | None:
    """Check a CreateMultipartUpload's key and checksum headers; the
    checksum type the upload gets (S3's default for the algorithm when
    none was named)."""
    check_key(key)
    if checksum_type is not None:
        if checksum_type not in ("COMPOSITE", "FULL_OBJECT"):
            raise InvalidRequest(f"Value for x-amz-checksum-type header is invalid: {checksum_type}")
        if checksum_algorithm is None:
            raise InvalidRequest(
                "The x-amz-checksum-type header can only be used with the x-amz-checksum-algorithm header."
            )
    if checksum_algorithm is not None and checksum_type is None:
        # S3's defaults: CRC64NVME only exists as a full-object checksum;
        # the others default to composite (checksum of part checksums).
        checksum_type = "FULL_OBJECT" if checksum_algorithm == "CRC64NVME" else "COMPOSITE"
    if checksum_type == "FULL_OBJECT" and checksum_algorithm not in checksums.FULL_OBJECT_CAPABLE:
        raise InvalidRequest(f"The FULL_OBJECT checksum type cannot be used with the {checksum_algorithm} checksum algorithm.")
    if checksum_type == "COMPOSITE" and checksum_algorithm == "CRC64NVME":
        raise InvalidRequest("The COMPOSITE checksum type cannot be used with the CRC64NVME checksum algorithm.")
    return checksum_type


def check_part(part_number: int, integrity: Integrity) -> None:
    """An UploadPart's number, and its declared length, refused before a
    byte of the body is read."""
    _check_part_number(part_number)
    if integrity.expected_size is not None and integrity.expected_size > MAX_PART_SIZE:
        raise EntityTooLarge("Your proposed upload exceeds the maximum allowed size",
                             ProposedSize=integrity.expected_size, MaxSizeAllowed=MAX_PART_SIZE)


def check_order(chosen: list[ChosenPart], upload_id: str) -> None:
    """A Complete names 1 to 10,000 parts, numbered 1 to 10,000, in ascending
    order: a property of the request, checked before any part (else two
    small parts sent in reverse would be EntityTooSmall)."""
    if not chosen:
        raise InvalidRequest("You must specify at least one part")
    if len(chosen) > MAX_PART_NUMBER:
        raise InvalidArgument(f"A multipart upload has at most {MAX_PART_NUMBER} parts; "
                              f"{len(chosen)} were listed", ArgumentName="Part")
    for want in chosen:
        _check_part_number(want.part_number)
    numbers = [want.part_number for want in chosen]
    if any(b <= a for a, b in itertools.pairwise(numbers)):
        raise InvalidPartOrder(
            "The list of parts was not in ascending order. Parts must be ordered by part number.",
            UploadId=upload_id,
        )


def check_object_size(part_sizes: list[int]) -> None:
    """The parts a Complete chose must add up to at most 5 TiB (10,000 parts
    of up to 5 GiB could make 48.8 TiB)."""
    total = sum(part_sizes)
    if total > MAX_OBJECT_SIZE:
        raise EntityTooLarge("Your proposed upload exceeds the maximum allowed object size.",
                             ProposedSize=total, MaxSizeAllowed=MAX_OBJECT_SIZE)


def _check_part_number(number: int) -> None:
    if not 1 <= number <= MAX_PART_NUMBER:
        raise InvalidArgument(
            "Part number must be an integer between 1 and 10000, inclusive",
            ArgumentName="partNumber",
            ArgumentValue=number,
        )


def object_checksum(upload: Upload, parts: list[Part]) -> Checksum | None:
    """The object's checksum as S3 defines it for the upload's type:
    FULL_OBJECT is the CRC of the whole object (combined from the parts'
    CRCs, no re-read), COMPOSITE the checksum of the parts' checksums."""
    algorithm = upload.checksum_algorithm
    if algorithm is None or any(p.checksum is None or p.checksum.algorithm != algorithm for p in parts):
        return None
    digests = [checksums.decode_digest(algorithm, p.checksum.value) for p in parts]  # type: ignore[union-attr]
    if upload.checksum_type == "FULL_OBJECT":
        combined = checksums.combine_full_object(algorithm, [(d, p.size) for d, p in zip(digests, parts)])
        return Checksum(algorithm, base64.b64encode(combined).decode(), "FULL_OBJECT")
    return Checksum(algorithm, checksums.composite(algorithm, digests), "COMPOSITE")


def md5_of_parts(part_etags: list[str]) -> str:
    """S3's multipart ETag: MD5 of the parts' binary MD5s, then -N."""
    digest = hashlib.md5(b"".join(bytes.fromhex(e) for e in part_etags)).hexdigest()
    return f"{digest}-{len(part_etags)}"
