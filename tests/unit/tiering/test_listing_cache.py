"""Listing pages of mounts: reused while fresh, bounded, dropped by writes."""

from __future__ import annotations

import time

from tiering.index.db import ListEntry, ListPage
from tiering.mounts.listing_cache import ListingCache


def _page(*keys: str) -> ListPage:
    return ListPage([ListEntry(k, 1, "e", 0, None) for k in keys], [], False, keys[-1] if keys else None)


def test_a_page_is_reused_only_for_the_same_question_and_until_it_expires() -> None:
    cache = ListingCache()
    page = _page("a", "b")
    cache.put("m", "", "/", "", 1000, page, ttl=0.2, generation=cache.generation("m"))
    assert cache.get("m", "", "/", "", 1000) is page
    assert cache.get("m", "", "", "", 1000) is None  # another delimiter
    assert cache.get("m", "", "/", "", 999) is None  # another page size
    assert cache.get("other", "", "/", "", 1000) is None
    time.sleep(0.25)
    assert cache.get("m", "", "/", "", 1000) is None


def test_a_write_drops_the_mounts_pages_and_a_page_asked_before_it_is_not_kept() -> None:
    cache = ListingCache()
    cache.put("m", "", "", "", 1000, _page("a"), ttl=60, generation=cache.generation("m"))
    cache.put("n", "", "", "", 1000, _page("z"), ttl=60, generation=cache.generation("n"))
    asked = cache.generation("m")  # a listing is sent to the source ...
    cache.forget("m")  # ... a write lands meanwhile ...
    cache.put("m", "", "", "", 1000, _page("a"), ttl=60, generation=asked)  # ... its answer may predate it
    assert cache.get("m", "", "", "", 1000) is None
    assert cache.get("n", "", "", "", 1000) is not None


def test_the_cache_holds_at_most_max_entries_dropping_the_least_recently_used() -> None:
    cache = ListingCache(max_entries=10)
    for i in range(3):
        cache.put("m", str(i), "", "", 1000, _page("a", "b", "c"), ttl=60, generation=0)  # 4 entries each
    assert cache.get("m", "0", "", "", 1000) is None, "the oldest page made room"
    assert cache.get("m", "1", "", "", 1000) is not None and cache.get("m", "2", "", "", 1000) is not None
    cache.put("m", "big", "", "", 1000, _page(*"abcdefghijk"), ttl=60, generation=0)  # larger than the cache
    assert cache.get("m", "big", "", "", 1000) is None and cache.get("m", "2", "", "", 1000) is not None
