"""What the node registry needs of a capacity store, on every backend:
listings that carry each object's version tag and last write
(``list_entries``), and deletes conditional on the version
(``delete_conditional``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.conftest import capacity_of
from tiering.capacity import CapacityStore
from tiering.errors import CapacityConflict, CapacityNotFound

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["local", "s3"])
def unstarted_capacity(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CapacityStore]:
    """The stores with conditional writes, as the registry needs them."""
    yield from capacity_of(request.param, request, tmp_path)


async def test_entries_carry_the_version_tag_and_the_last_write(capacity: CapacityStore) -> None:
    before = time.time()
    one = await capacity.put_conditional("reg/a", b"one", None)
    two = await capacity.put_conditional("reg/b", b"second", None)
    await capacity.put("other/c", b"x")
    listed = [entry async for entry in capacity.list_entries("reg/")]
    assert [(e.name, e.size, e.etag) for e in listed] == [("reg/a", 3, one), ("reg/b", 6, two)]
    # The store's clock: S3 keeps whole seconds; both clocks are this machine's here.
    assert all(before - 2 <= e.modified <= time.time() + 2 for e in listed)
    # The tag is the one reads and conditional writes use.
    assert (await capacity.read_versioned("reg/a"))[1] == listed[0].etag
    again = await capacity.put_conditional("reg/a", b"one", one)  # the same bytes: the same tag
    assert again == one
    changed = await capacity.put_conditional("reg/a", b"uno", one)
    assert [e.etag async for e in capacity.list_entries("reg/a")] == [changed]
    assert [e async for e in capacity.list_entries("nothing/")] == []


async def test_a_conditional_delete_removes_only_the_version_named(capacity: CapacityStore) -> None:
    tag = await capacity.put_conditional("reg/a", b"one", None)
    newer = await capacity.put_conditional("reg/a", b"two", tag)
    with pytest.raises(CapacityConflict):
        await capacity.delete_conditional("reg/a", tag)  # written again since: kept
    assert await capacity.read_versioned("reg/a") == (b"two", newer)
    await capacity.delete_conditional("reg/a", newer)
    with pytest.raises(CapacityNotFound):
        await capacity.read_versioned("reg/a")
    await capacity.delete_conditional("reg/a", newer)  # gone already: no error
    await capacity.delete_conditional("reg/never/written", newer)
