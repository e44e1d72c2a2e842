"""The batch archive as a reader sees it: a tar of members named by their
keys, a key that could not be read as a member ``__errors__/<key>`` holding
its S3 error code (the writer is ``gateway/s3/tar.py`` with
``gateway/handlers/batch.py``).

``members`` walks a whole archive in memory, sans-I/O: what a gateway reads
when it asks another node for a batch of the objects that node keeps. Only
what that writer writes is understood: ustar headers, pax ``x`` headers
carrying ``path`` and ``size``, regular files; anything else is an error.
"""

from __future__ import annotations

from collections.abc import Iterator

ERRORS = "__errors__/"  # the name prefix of a key's error member
BLOCK = 512


class BadArchive(ValueError):
    """Bytes that are not a whole batch archive."""


def _number(field: bytes) -> int:
    text = field.rstrip(b"\0 ").decode("ascii")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise BadArchive(f"a tar header field is not an octal number: {text!r}") from None


def _pax(records: bytes) -> dict[str, str]:
    """``"<length> <keyword>=<value>\\n"`` records, as written."""
    out: dict[str, str] = {}
    at = 0
    while at < len(records):
        space = records.index(b" ", at)
        length = int(records[at:space])
        keyword, _, value = records[space + 1:at + length - 1].partition(b"=")
        out[keyword.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        at += length
    return out


def members(data: bytes | memoryview) -> Iterator[tuple[str, memoryview]]:
    """``(name, body)`` of each member of a whole archive, in order; the
    bodies are views of ``data``. BadArchive when it is cut short or holds
    what the gateway does not write."""
    view = memoryview(data)
    at = 0
    pending: dict[str, str] = {}
    while True:
        if at + BLOCK > len(view):
            raise BadArchive("the archive ends before its end blocks")
        head = view[at:at + BLOCK]
        if not any(head):
            return  # the first of the two zero blocks
        size = _number(bytes(head[124:136]))
        kind = bytes(head[156:157])
        body_at = at + BLOCK
        end = body_at + size
        if end > len(view):
            raise BadArchive("a member is cut short")
        at = end + -size % BLOCK
        if kind == b"x":
            try:
                pending = _pax(bytes(view[body_at:end]))
            except (ValueError, UnicodeDecodeError):
                raise BadArchive("a pax header is malformed") from None
            continue
        if kind not in (b"0", b"\0"):
            raise BadArchive(f"a member of type {kind!r}")
        name = pending.pop("path", None) or bytes(head[:100]).rstrip(b"\0").decode("utf-8", "surrogateescape")
        if "size" in pending:  # larger than the ustar field: the pax size is the member's
            size = int(pending.pop("size"))
            end = body_at + size
            if end > len(view):
                raise BadArchive("a member is cut short")
            at = end + -size % BLOCK
        pending = {}
        yield name, view[body_at:end]
