"""The index's key layout (see ``tiering/index.py``): one place that builds
every raw key, and the small msgpack values that are not records."""

from __future__ import annotations

import msgpack

from tiering.meta import BucketInfo

SEP = b"\x00"


def bkey(bucket: str) -> bytes:
    return b"B" + bucket.encode()


def okey(bucket: str, key: str = "") -> bytes:
    return b"O" + bucket.encode() + SEP + key.encode()


def ukey(bucket: str, key: str = "", upload_id: str | None = None) -> bytes:
    base = b"U" + bucket.encode() + SEP + key.encode()
    return base if upload_id is None else base + SEP + upload_id.encode()


def pkey(upload_id: str, part_number: int | None = None) -> bytes:
    base = b"P" + upload_id.encode() + SEP
    return base if part_number is None else base + part_number.to_bytes(4, "big")


def seqkey(tag: bytes, seq: int) -> bytes:
    return tag + seq.to_bytes(8, "big")


def gkey(segment: str) -> bytes:
    return b"G" + segment.encode()


SEQ_KEY = b"Sseq"
SEG_KEY = b"Sseg"



def label(bucket: str, key: str, upload: str | None = None, part: int | None = None) -> bytes:
    label: dict[str, object] = {"b": bucket, "k": key}
    if upload is not None:
        label.update(u=upload, p=part)
    return msgpack.packb(label, use_bin_type=True)


def bucket_event(info: BucketInfo) -> dict[str, object]:
    return {"t": "bucket", "n": info.name, "c": info.created_ms, "wt": info.write_through}
