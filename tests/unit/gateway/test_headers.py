"""An object version's encoded head (gateway.s3.headers.object_head)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.s3 import headers
from tiering.memo import ByIdentity
from tiering.meta import ObjectMeta


def meta(**fields: Any) -> ObjectMeta:
    base: dict[str, Any] = {"bucket": "b", "key": "k", "size": 10, "etag": "0" * 32,
                            "last_modified_ms": 1_700_000_000_000, "seq": 1}
    return ObjectMeta(**{**base, **fields})


def encoded(m: ObjectMeta) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((n.encode("latin-1"), v.encode("latin-1")) for n, v in headers.object_headers(m))


def test_the_head_is_the_representation_headers_encoded() -> None:
    m = meta(headers={"cache-control": "no-cache"}, user_meta={"owner": "été"}, tags={"a": "1"}, version="v1")
    assert headers.object_head(m) == encoded(m)
    assert (b"x-amz-tagging-count", b"1") in headers.object_head(m)


def test_a_version_keeps_its_head_and_a_new_version_gets_its_own() -> None:
    first = meta()
    headers.object_head(first)  # built and remembered: kept when it is asked for again
    assert headers.object_head(first) is headers.object_head(first)
    rewritten = meta(etag="1" * 32, seq=2, content_type="text/plain")  # an equal-looking record, another version
    head = headers.object_head(rewritten)
    assert head == encoded(rewritten) and head != headers.object_head(first)


def test_a_head_read_once_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A version read once (a cold mounted miss, whose ``ObjectMeta`` is its
    own) has its head built and not kept; read again, its head is kept. (A
    memo of its own: in the process's, a record of an earlier test may have
    left its ``id()`` remembered for this one.)"""
    monkeypatch.setattr(headers, "_HEADS", ByIdentity(8192, "heads", headers._head_weight))
    cold = meta(etag="2" * 32)
    first, again = headers.object_head(cold), headers.object_head(cold)
    assert first == again == encoded(cold) and first is not again  # the first was not kept
    assert headers.object_head(cold) is again


def test_the_kept_heads_are_bounded_and_never_mistaken_for_another_record() -> None:
    kept: ByIdentity[ObjectMeta, object] = ByIdentity(size=4)
    metas = [meta(etag=f"{i:032x}") for i in range(10)]
    for m in metas * 2:
        assert kept.get(m, encoded) == encoded(m)
    assert len(kept) == 4
    for m in metas:  # the oldest went first; asked again, each is right
        assert kept.get(m, encoded) == encoded(m)


def test_a_head_weighs_what_the_walk_of_it_would_say() -> None:
    """The heads memo weighs a head by its lengths (``_head_weight``), not
    by walking it: the two must agree, or the bound means something else."""
    from tiering.memo import weigh

    for m in (meta(), meta(headers={"cache-control": "no-cache", "content-language": "fr"},
                           user_meta={"owner": "été", "run": "7"}, tags={"a": "1"}, version="v1")):
        head = headers.object_head(m)
        assert headers._head_weight(head) == weigh(head)
