"""The index's key layout (see ``tiering/index/db.py``): one place that builds
every raw key, and the small msgpack values that are not records.

Key prefixes (NUL separates names; numbers are big-endian):

    B<bucket>                          -> BucketInfo
    O<bucket>\\0<key>                   -> ObjectMeta: the current version
    V<bucket>\\0<key>\\0<~vseq, 8>       -> ObjectMeta: a noncurrent version or a delete
                                          marker, newest first (``tiering/model/versions.py``)
    U<bucket>\\0<key>\\0<upload id>      -> Upload
    P<upload id>\\0<part number, 4>     -> Part
    F<seq, 8>                          -> flush queue: an object's or upload part's ``label``
    Q<seq, 8>                          -> a footer record waiting for the next segment
    G<segment>                         -> SegmentInfo
    H<bucket>\\0<prefix>                -> a pin (empty value): keep that prefix hot, node-local
    M<mount>                           -> Mount: a mounted bucket's source and settings
    N<mount>\\0<key>                    -> MountedObject: what the mount last knew of a key
    Sseq, Sseg                         -> the last sequence number, the last segment number
    Swgt                               -> present once segments' live counts use Extent.weight
    Sfol<term, 4>                      -> the last segment of that term this node applied
                                          (``FOLLOW_CLOSED`` once all of it is)
"""

from __future__ import annotations

import msgpack

from tiering.meta import BucketInfo

SEP = b"\x00"


def bkey(bucket: str) -> bytes:
    return b"B" + bucket.encode()


def okey(bucket: str, key: str = "") -> bytes:
    return b"O" + bucket.encode() + SEP + key.encode()


def vkey(bucket: str, key: str | None = None, vseq: int | None = None) -> bytes:
    """A noncurrent version or delete marker; the inverted vseq puts a
    key's newest version first. Without ``vseq``: the prefix of the key's
    versions (with the trailing NUL, so "a" never matches "ab")."""
    base = b"V" + bucket.encode() + SEP
    if key is None:
        return base
    base += key.encode() + SEP
    return base if vseq is None else base + (_TOP - vseq).to_bytes(8, "big")


def vseq_of_vkey(raw: bytes) -> int:
    return _TOP - int.from_bytes(raw[-8:], "big")


_TOP = 2**64 - 1


def ukey(bucket: str, key: str = "", upload_id: str | None = None) -> bytes:
    base = b"U" + bucket.encode() + SEP + key.encode()
    return base if upload_id is None else base + SEP + upload_id.encode()


def pkey(upload_id: str, part_number: int | None = None) -> bytes:
    base = b"P" + upload_id.encode() + SEP
    return base if part_number is None else base + part_number.to_bytes(4, "big")


def hkey(bucket: str, prefix: str | None = None) -> bytes:
    """A pin: keep what ``bucket``/``prefix`` holds in the hot tier."""
    base = b"H" + bucket.encode() + SEP
    return base if prefix is None else base + prefix.encode()


def mkey(mount: str) -> bytes:
    return b"M" + mount.encode()


def nkey(mount: str, key: str | None = None) -> bytes:
    """A mounted object's last known description."""
    base = b"N" + mount.encode() + SEP
    return base if key is None else base + key.encode()


def seqkey(tag: bytes, seq: int) -> bytes:
    return tag + seq.to_bytes(8, "big")


def gkey(segment: str) -> bytes:
    return b"G" + segment.encode()


SEQ_KEY = b"Sseq"
SEG_KEY = b"Sseg"
WEIGHTED_KEY = b"Swgt"  # live counts recounted with Extent.weight (empty entries count one)
FOLLOW_KEY = b"Sfol"  # + a write term (4 bytes): the last segment of it this node applied
FOLLOW_CLOSED = "~"  # a term's follow point once all of it is applied (sorts after every name)
TERM_SHIFT = 40  # a segment's name is (term << 40 | sequence) in 16 hex digits


def term_of(segment: str) -> int:
    """The write term a segment name was issued in (0: a single gateway's)."""
    return int(segment, 16) >> TERM_SHIFT


def follow_key(term: int) -> bytes:
    return FOLLOW_KEY + term.to_bytes(4, "big")



def successor(prefix: str) -> str:
    """The smallest string greater than every string starting with ``prefix``.

    Used to jump past a whole common prefix with one seek. UTF-8 order equals
    code point order, so incrementing the last code point is enough.
    """
    while prefix:
        last = ord(prefix[-1])
        if last < 0x10FFFF:
            return prefix[:-1] + chr(last + 1 if last + 1 != 0xD800 else 0xE000)
        prefix = prefix[:-1]
    return "\U0010ffff" * 2  # nothing is greater; callers stop there


def label(bucket: str, key: str, upload: str | None = None, part: int | None = None, vseq: int = 0) -> bytes:
    """A flush-queue entry: the object version (``vseq``: which one, since
    a noncurrent version may wait for its flush too) or upload part."""
    label: dict[str, object] = {"b": bucket, "k": key}
    if upload is not None:
        label.update(u=upload, p=part)
    elif vseq:
        label["v"] = vseq
    return msgpack.packb(label, use_bin_type=True)


# Footer-record names of the bucket policy fields (short: one per bucket event).
_POLICY = {"wt": "write_through", "cmp": "compression", "ps": "part_size", "sos": "small_object_size",
           "ver": "versioning"}


def bucket_event(info: BucketInfo) -> dict[str, object]:
    """The footer record of a bucket's creation or policy change."""
    event: dict[str, object] = {"t": "bucket", "n": info.name, "c": info.created_ms}
    for short, name in _POLICY.items():
        value = getattr(info, name)
        if value is not None:
            event[short] = value
    return event


def bucket_from_event(event: dict[str, object], region: str) -> BucketInfo:
    """The bucket a :func:`bucket_event` record describes (recovery)."""
    policy = {name: event[short] for short, name in _POLICY.items() if short in event}
    return BucketInfo(str(event["n"]), int(event.get("c", 0)), region, **policy)  # type: ignore[arg-type]


def record_bucket(record: dict) -> str:
    """The bucket a queued footer record is about."""
    kind = record.get("t")
    if kind == "del":
        return str(record["b"])
    if kind == "bucket":
        return str(record["n"])
    return str(record["m"]["bucket"])
