"""Object tags as S3 limits them.

An object has at most 10 tags with distinct keys; a key is 1 to 128
characters, a value 0 to 256, counted in UTF-16 code units as S3 stores
them; both hold only Unicode letters, numbers and separators (white space)
and ``_ . : / = + - @``; the ``aws:`` prefix is reserved. The request
parsers (``gateway/s3/headers.py`` for ``x-amz-tagging``, ``gateway/s3/xml.py``
for a Tagging document) turn the client's form into a dict; this module
decides whether the dict is a tag set.
"""

from __future__ import annotations

import unicodedata

from tiering.errors import InvalidTag, TooManyTags

MAX_TAGS = 10
MAX_KEY = 128
MAX_VALUE = 256
_SYMBOLS = frozenset("_.:/=+-@")


def _utf16_length(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _allowed(text: str) -> bool:
    return all(c in _SYMBOLS or unicodedata.category(c)[0] in "LNZ" for c in text)


def check_tags(tags: dict[str, str]) -> None:
    """Raise TooManyTags or InvalidTag unless ``tags`` is a valid tag set."""
    if len(tags) > MAX_TAGS:
        raise TooManyTags(f"Object tags cannot be greater than {MAX_TAGS}")
    for key, value in tags.items():
        if not key or _utf16_length(key) > MAX_KEY or not _allowed(key):
            raise InvalidTag("The TagKey you have provided is invalid", TagKey=key)
        if key.startswith("aws:"):
            raise InvalidTag("Your TagKey cannot be prefixed with aws:", TagKey=key)
        if _utf16_length(value) > MAX_VALUE or not _allowed(value):
            raise InvalidTag("The TagValue you have provided is invalid", TagKey=key)
