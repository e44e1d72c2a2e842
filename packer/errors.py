"""Format errors: what the segment codec reports about bytes it was handed.

Everything here means "these bytes are not a valid segment or extent". The
tiering layer decides what that means for an object (retry the read, fall back
to another copy, report data loss); the packer only says what is wrong.
"""

from __future__ import annotations


class FormatError(Exception):
    """A segment or extent is not what the format says (corrupt, truncated,
    wrong version)."""


class CorruptData(FormatError):
    """Bytes fail a check: checksum mismatch, bad magic, impossible lengths,
    an undecodable footer or a zstd frame that does not decode."""


class UnsupportedVersion(FormatError):
    """Intact bytes written by a format version (or with flags) this code
    does not understand."""
