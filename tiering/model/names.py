"""Validation of bucket names and object keys, as S3 defines them."""

from __future__ import annotations

import re

from tiering.errors import InvalidArgument, InvalidBucketName, KeyTooLong

MAX_KEY_BYTES = 1024

# General-purpose bucket rules: 3-63 characters of lower-case letters,
# digits, dots and hyphens, starting and ending with a letter or digit.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4 = re.compile(r"\d{1,3}(\.\d{1,3}){3}")


def check_bucket_name(name: str) -> None:
    """Raise InvalidBucketName unless ``name`` follows S3's naming rules."""
    if (
        not _BUCKET.fullmatch(name)
        or ".." in name
        or ".-" in name
        or "-." in name
        or _IPV4.fullmatch(name)
        or name.startswith(("xn--", "sthree-", "amzn-s3-demo-"))
        or name.endswith(("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"))
    ):
        raise InvalidBucketName("The specified bucket is not valid.", BucketName=name)


def check_key(key: str) -> None:
    """Keys are 1-1024 bytes of UTF-8. NUL cannot be carried in XML 1.0
    listings, so it is refused up front instead of breaking ListObjects."""
    if not key:
        raise InvalidArgument("Object key must not be empty", ArgumentName="key")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise KeyTooLong("Your key is too long", Size=len(key.encode("utf-8", "surrogatepass")), MaxSizeAllowed=MAX_KEY_BYTES)
    if "\x00" in key:
        raise InvalidArgument("Object key must not contain NUL", ArgumentName="key")


def unencodable(value: str) -> int | None:
    """The index of the first character of ``value`` that UTF-8 cannot
    encode (a lone surrogate), or None."""
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None
