"""A mounted object as the source's answer headers describe it."""

from __future__ import annotations

from tiering.mounts.source import source_object

HEADERS = {
    "etag": '"9e107d9d372bb6826bd81d3542a419d6"',
    "last-modified": "Tue, 01 Dec 2026 10:20:30 GMT",
    "content-type": "image/jpeg",
    "content-range": "bytes 0-9/100",
    "cache-control": "max-age=60",
    "expires": "Wed, 02 Dec 2026 00:00:00 GMT",
    "x-amz-storage-class": "STANDARD_IA",
    "x-amz-meta-origin": "camera-7",
    "x-amz-checksum-crc32c": "yZRlqg==",
    "x-amz-checksum-type": "FULL_OBJECT",
    "x-amz-request-id": "ABC",
}


def test_what_a_mount_keeps_of_an_answer() -> None:
    found = source_object("img/1.jpg", HEADERS, 100)
    assert found.key == "img/1.jpg" and found.size == 100
    assert found.etag == "9e107d9d372bb6826bd81d3542a419d6"
    assert found.last_modified_ms == 1796120430000
    assert found.content_type == "image/jpeg"
    # The stored headers the source sent, as sent; not the storage class, the range or the request's.
    assert found.headers == {"cache-control": "max-age=60", "expires": "Wed, 02 Dec 2026 00:00:00 GMT"}
    assert found.user_meta == {"origin": "camera-7"}
    assert found.checksum == ("CRC32C", "yZRlqg==")


def test_an_answer_with_little_in_it() -> None:
    found = source_object("k", {"etag": "abc", "last-modified": "not a date", "cache-control": ""}, 0)
    assert (found.etag, found.last_modified_ms, found.content_type) == ("abc", 0, "binary/octet-stream")
    assert found.headers == {} and found.user_meta == {} and found.checksum is None
