"""The CapacityStore contract, run against every backend; then S3's retries.

Faults are injected by wrapping the aiobotocore client's methods with
monkeypatch; the product code is never edited for a test.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from tests.servers import free_port
from tiering.capacity import CapacityStore, LocalDirStore, open_capacity
from tiering.capacity.s3 import MIN_PART_SIZE, S3Store, _session
from tiering.capacity.s3_get import _Body
from tiering.errors import CapacityError, CapacityNotFound, TierstoreError

pytestmark = pytest.mark.anyio

MiB = 1024 * 1024


def pattern(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


async def names(store: CapacityStore, prefix: str = "") -> list[str]:
    return [name async for name, _ in store.list(prefix)]


async def write_in_pieces(upload: Any, data: bytes, piece: int) -> None:
    for i in range(0, len(data), piece):
        await upload.write(data[i : i + piece])


# ---- the contract: every backend ------------------------------------------


async def test_put_and_ranges(capacity: CapacityStore) -> None:
    data = pattern(10_000)
    await capacity.put("segments/00000000000000a1", data)
    n = len(data)
    for start, end in [(0, n), (0, 1), (n - 1, n), (17, 4321), (5, 5), (n, n), (0, 0)]:
        assert await capacity.get_range("segments/00000000000000a1", start, end) == data[start:end]
    assert await capacity.size("segments/00000000000000a1") == n


async def test_put_memoryview_and_overwrite(capacity: CapacityStore) -> None:
    await capacity.put("a", memoryview(b"first version"))
    await capacity.put("a", b"second")
    assert await capacity.get_range("a", 0, 6) == b"second"
    assert await capacity.size("a") == 6


async def test_get_tail(capacity: CapacityStore) -> None:
    data = pattern(1000, seed=1)
    await capacity.put("seg", data)
    assert await capacity.get_tail("seg", 10) == (data[-10:], 1000)
    assert await capacity.get_tail("seg", 1000) == (data, 1000)
    assert await capacity.get_tail("seg", 5000) == (data, 1000)
    assert await capacity.get_tail("seg", 0) == (b"", 1000)


async def test_empty_object(capacity: CapacityStore) -> None:
    await capacity.put("empty", b"")
    assert await capacity.size("empty") == 0
    assert await capacity.get_tail("empty", 16) == (b"", 0)
    assert await capacity.get_range("empty", 0, 0) == b""
    assert [x async for x in capacity.list()] == [("empty", 0)]


async def test_range_past_the_end_is_an_error(capacity: CapacityStore) -> None:
    await capacity.put("short", b"0123456789")
    for start, end in [(5, 11), (10, 11), (20, 30)]:
        with pytest.raises(CapacityError) as caught:
            await capacity.get_range("short", start, end)
        assert not isinstance(caught.value, CapacityNotFound)
    with pytest.raises(ValueError):
        await capacity.get_range("short", 5, 4)


async def test_missing_object(capacity: CapacityStore) -> None:
    for attempt in (
        capacity.get_range("nope/x", 0, 1),
        capacity.get_tail("nope/x", 8),
        capacity.size("nope/x"),
    ):
        with pytest.raises(CapacityNotFound) as caught:
            await attempt
        assert isinstance(caught.value, CapacityError)
        assert isinstance(caught.value, TierstoreError)


async def test_delete_is_idempotent(capacity: CapacityStore) -> None:
    await capacity.put("d/1", b"x")
    await capacity.put("d/2", b"y")
    await capacity.delete("d/1")
    await capacity.delete("d/1")
    await capacity.delete("never/was")
    with pytest.raises(CapacityNotFound):
        await capacity.size("d/1")
    assert await names(capacity) == ["d/2"]


async def test_list_prefix_and_order(capacity: CapacityStore) -> None:
    # '-' < '/' < '0': a directory walk that sorts per directory gets this
    # wrong. (No name is a directory of another: see LocalDirStore.)
    wanted = ["a-b", "a/b", "a/c/d", "a0", "segments/0001", "segments/0002", "segments2/x"]
    for i, name in enumerate(random.Random(7).sample(wanted, len(wanted))):
        await capacity.put(name, b"z" * i)
    sizes = {name: size async for name, size in capacity.list()}
    assert list(sizes) == wanted
    for name, size in sizes.items():
        assert await capacity.size(name) == size
    assert await names(capacity, "segments/") == ["segments/0001", "segments/0002"]
    assert await names(capacity, "seg") == ["segments/0001", "segments/0002", "segments2/x"]
    assert await names(capacity, "a/") == ["a/b", "a/c/d"]
    assert await names(capacity, "a/c/d") == ["a/c/d"]
    assert await names(capacity, "zzz") == []
    assert await names(capacity, "segments/0001/") == []


async def test_upload_multipart(capacity: CapacityStore) -> None:
    data = pattern(12 * MiB + 12345, seed=2)  # two full 5 MiB parts and a small one
    puts = capacity.stats.puts
    upload = capacity.upload("big/one")
    await write_in_pieces(upload, data, 1 * MiB + 3)
    assert await names(capacity) == []  # nothing visible before complete
    assert await upload.complete() == len(data)
    assert await capacity.size("big/one") == len(data)
    assert await capacity.get_range("big/one", 0, len(data)) == data
    assert await capacity.get_tail("big/one", 100) == (data[-100:], len(data))
    assert (
        await capacity.get_range("big/one", 5 * MiB - 10, 5 * MiB + 10)
        == data[5 * MiB - 10 : 5 * MiB + 10]
    )
    if isinstance(capacity, S3Store):
        assert capacity.stats.puts - puts == 5  # create, three parts, complete
    with pytest.raises(RuntimeError):
        await upload.write(b"more")
    await upload.abort()  # after complete: nothing to undo
    assert await capacity.size("big/one") == len(data)


async def test_upload_exact_multiple_of_part_size(capacity: CapacityStore) -> None:
    data = pattern(2 * MIN_PART_SIZE, seed=3)
    upload = capacity.upload("exact")
    await upload.write(data)  # one write spanning several parts
    assert await upload.complete() == len(data)
    assert await capacity.get_range("exact", 0, len(data)) == data


async def test_upload_small_is_one_put(capacity: CapacityStore) -> None:
    data = pattern(3 * MiB, seed=4)
    puts = capacity.stats.puts
    upload = capacity.upload("small")
    await write_in_pieces(upload, data, 700_000)
    assert await upload.complete() == len(data)
    assert capacity.stats.puts - puts == 1
    assert await capacity.get_range("small", 0, len(data)) == data


async def test_upload_empty(capacity: CapacityStore) -> None:
    upload = capacity.upload("nothing")
    await upload.write(b"")
    assert await upload.complete() == 0
    assert await capacity.size("nothing") == 0


async def test_abort_leaves_nothing(capacity: CapacityStore) -> None:
    big = capacity.upload("aborted/big")
    await big.write(pattern(6 * MiB))  # S3: a multipart upload with a part in flight
    small = capacity.upload("aborted/small")
    await small.write(b"abc")
    await big.abort()
    await big.abort()
    await small.abort()
    assert await names(capacity) == []
    with pytest.raises(CapacityNotFound):
        await capacity.size("aborted/big")
    with pytest.raises(RuntimeError):
        await big.complete()


async def test_abort_incomplete_removes_what_a_crash_left(capacity: CapacityStore) -> None:
    """A process killed mid-upload never aborts; the next start does."""
    await capacity.put("kept", b"done")
    left = capacity.upload("crashed/segment")
    await left.write(pattern(6 * MiB, seed=9))  # S3: an open multipart upload; local: a temp file
    await left.write(pattern(5 * MiB, seed=10))
    # Let parts already sent land, as they would have before the process
    # died; a crashed process has no task left to race with the abort.
    sending = [t for t in asyncio.all_tasks() if "_send_part" in t.get_coro().__qualname__]
    await asyncio.gather(*sending, return_exceptions=True)
    deletes = capacity.stats.deletes
    aborted = await capacity.abort_incomplete()
    assert aborted >= 1
    assert capacity.stats.deletes - deletes == aborted  # each abort counted once
    assert await names(capacity) == ["kept"]
    assert await capacity.abort_incomplete() == 0
    assert await capacity.get_range("kept", 0, 4) == b"done"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "/abs",
        "..",
        "../x",
        "a/../../x",
        "./a",
        "a/./b",
        "a//b",
        "a/",
        "a\\b",
        "a\x00b",
        ".tmp-1",
    ],
)
async def test_names_escaping_the_root_are_rejected(capacity: CapacityStore, bad: str) -> None:
    with pytest.raises(ValueError):
        await capacity.put(bad, b"x")
    with pytest.raises(ValueError):
        await capacity.get_range(bad, 0, 1)
    with pytest.raises(ValueError):
        await capacity.get_tail(bad, 1)
    with pytest.raises(ValueError):
        await capacity.size(bad)
    with pytest.raises(ValueError):
        await capacity.delete(bad)
    with pytest.raises(ValueError):
        capacity.upload(bad)
    assert await names(capacity) == []


async def test_list_after_a_name(capacity: CapacityStore) -> None:
    """What a replica does: the names after the last one it applied
    (S3 StartAfter), whether or not that name still exists."""
    for name in ("segments/0001", "segments/0002", "segments/0003", "segments2/x"):
        await capacity.put(name, b"z")
    listed = [n async for n, _ in capacity.list("segments/", after="segments/0001")]
    assert listed == ["segments/0002", "segments/0003"]
    listed = [n async for n, _ in capacity.list("segments/", after="segments/00025")]
    assert listed == ["segments/0003"]
    assert [n async for n, _ in capacity.list("segments/", after="segments/0003")] == []
    assert len([n async for n, _ in capacity.list("segments/", after="")]) == 3


async def test_list_rejects_impossible_prefix(capacity: CapacityStore) -> None:
    for bad in ("/etc", "a\\b", "\x00"):
        with pytest.raises(ValueError):
            await names(capacity, bad)


async def test_stats_count_requests_and_bytes(capacity: CapacityStore) -> None:
    s = capacity.stats
    before = (s.puts, s.gets, s.heads, s.deletes, s.lists, s.bytes_written, s.bytes_read)
    await capacity.put("s", b"0123456789")
    await capacity.get_range("s", 2, 6)
    await capacity.get_tail("s", 3)
    await capacity.size("s")
    await names(capacity)
    await capacity.delete("s")
    after = (s.puts, s.gets, s.heads, s.deletes, s.lists, s.bytes_written, s.bytes_read)
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 2, 1, 1, 1, 10, 7]
    assert s.retries == 0


async def test_describe(capacity: CapacityStore) -> None:
    text = capacity.describe()
    assert text.startswith("s3://" if isinstance(capacity, S3Store) else "file:///")
    assert "testing" not in text  # never credentials


# ---- open_capacity ----------------------------------------------------------


def test_open_capacity_file(tmp_path: Path) -> None:
    store = open_capacity((tmp_path / "with space").as_uri())
    assert isinstance(store, LocalDirStore)
    assert store.root == tmp_path / "with space"
    assert store.describe() == (tmp_path / "with space").as_uri()


def test_open_capacity_s3() -> None:
    store = open_capacity(
        "s3://bkt/some/prefix/", endpoint="http://127.0.0.1:9", region="eu-west-1"
    )
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix) == ("bkt", "some/prefix/")
    assert store.describe() == "s3://bkt/some/prefix at http://127.0.0.1:9"
    assert open_capacity("s3://bkt").describe() == "s3://bkt on AWS"


@pytest.mark.parametrize(
    "url",
    [
        "",
        "/abs/dir",
        "http://host/x",
        "file://otherhost/x",
        "file:relative",
        "s3://",
        "s3:///x",
        "s3://u@bkt",
        "s3://bkt/a/../b",
    ],
)
def test_open_capacity_rejects(url: str) -> None:
    with pytest.raises(ValueError):
        open_capacity(url)


def test_s3_rejects_small_parts_and_half_credentials() -> None:
    with pytest.raises(ValueError):
        S3Store("bkt", part_size=MIN_PART_SIZE - 1)
    with pytest.raises(ValueError):
        S3Store("bkt", access_key="only-one")


# ---- local directory specifics ------------------------------------------------


async def test_local_skips_leftover_temp_files(tmp_path: Path, anyio_backend: str) -> None:
    store = LocalDirStore(tmp_path / "cap")
    await store.start()
    await store.put("segments/1", b"data")
    leftover = tmp_path / "cap" / "segments" / ".tmp-deadbeef"
    leftover.write_bytes(b"crashed mid-write")
    assert await names(store) == ["segments/1"]
    leftover.unlink()


async def test_local_file_below_a_file_is_an_error(tmp_path: Path, anyio_backend: str) -> None:
    store = LocalDirStore(tmp_path / "cap")
    await store.start()
    await store.put("a", b"file")
    with pytest.raises(CapacityError):
        await store.put("a/b", b"x")
    with pytest.raises(CapacityNotFound):
        await store.size("a/b")
    await store.delete("a/b")


# ---- S3 specifics: pagination, start-up, retries -------------------------------


def client_error(code: str, status: int, op: str = "Operation") -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": "injected"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        op,
    )


def inject(
    monkeypatch: pytest.MonkeyPatch,
    store: S3Store,
    method: str,
    faults: list[BaseException],
    forever: BaseException | None = None,
) -> list[dict[str, Any]]:
    """Make the client's ``method`` raise each of ``faults`` in turn (then
    ``forever`` on every call, if given) before behaving normally. Returns
    the list of calls' keyword arguments. ``get_object`` is the ranged GETs'
    (the lean getter on an endpoint), the one ``get_range`` uses."""
    target = store._getter if method == "get_object" else store._client
    real = getattr(target, method)
    calls: list[dict[str, Any]] = []

    async def wrapper(*args: Any, **kw: Any) -> Any:
        calls.append(kw)
        if faults:
            raise faults.pop(0)
        if forever is not None:
            raise forever
        return await real(*args, **kw)

    monkeypatch.setattr(target, method, wrapper)
    return calls


async def test_s3_list_paginates(make_s3: Callable[..., S3Store], anyio_backend: str) -> None:
    store = make_s3(page_size=2)
    await store.start()
    try:
        wanted = [f"p/{i:03d}" for i in range(5)]
        for name in reversed(wanted):
            await store.put(name, name.encode())
        lists = store.stats.lists
        assert [x async for x in store.list("p/")] == [(n, 5) for n in wanted]
        assert store.stats.lists - lists == 3
    finally:
        await store.close()


async def test_s3_start_missing_bucket(
    make_s3: Callable[..., S3Store], moto_endpoint: str, anyio_backend: str
) -> None:
    store = make_s3(bucket="no-such-bucket-here")
    with pytest.raises(CapacityError) as caught:
        await store.start()
    assert (
        str(caught.value)
        == f"capacity bucket 'no-such-bucket-here' does not exist at {moto_endpoint}"
    )


async def test_s3_start_unreachable(make_s3: Callable[..., S3Store], anyio_backend: str) -> None:
    store = make_s3(endpoint=f"http://127.0.0.1:{free_port()}", max_attempts=2)
    with pytest.raises(CapacityError) as caught:
        await store.start()
    assert "head_bucket failed after 2 attempts" in str(caught.value)
    assert "\n" not in str(caught.value)


async def test_s3_store_ignores_aws_endpoint_url(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """AWS_ENDPOINT_URL is for a shell's clients (``tierstore env`` sets it to
    the gateway); the capacity store is ``endpoint`` or AWS, never that."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    for endpoint, expected in ((None, "https://s3.amazonaws.com"), (moto_endpoint, moto_endpoint)):
        store = S3Store("b", endpoint=endpoint, access_key="testing", secret_key="testing")
        async with _session().create_client("s3", **store.client_kwargs()) as client:
            assert client.meta.endpoint_url == expected


async def test_s3_retries_throttling(s3store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = inject(
        monkeypatch,
        s3store,
        "put_object",
        [client_error("SlowDown", 503), client_error("SlowDown", 503)],
    )
    await s3store.put("t", b"payload")
    assert len(calls) == 3
    assert s3store.stats.retries == 2
    assert s3store.stats.puts == 1
    assert await s3store.get_range("t", 0, 7) == b"payload"


async def test_s3_retries_5xx_and_connection_errors(
    s3store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await s3store.put("t", b"payload")
    inject(
        monkeypatch,
        s3store,
        "get_object",
        [
            EndpointConnectionError(endpoint_url="http://x"),
            ConnectionResetError(104, "Connection reset by peer"),
            ReadTimeoutError(endpoint_url="http://x"),
            ConnectionClosedError(endpoint_url="http://x"),
            client_error("InternalError", 500),
        ],
    )
    assert await s3store.get_range("t", 1, 4) == b"ayl"
    assert s3store.stats.retries == 5
    inject(
        monkeypatch,
        s3store,
        "head_object",
        [client_error("", 503), client_error("Throttling", 400)],
    )
    assert await s3store.size("t") == 7
    assert s3store.stats.retries == 7


async def test_s3_gives_up_after_max_attempts(
    make_s3: Callable[..., S3Store], monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    store = make_s3(max_attempts=3)
    await store.start()
    try:
        calls = inject(monkeypatch, store, "put_object", [], forever=client_error("SlowDown", 503))
        with pytest.raises(CapacityError) as caught:
            await store.put("t", b"x")
        assert len(calls) == 3
        assert store.stats.retries == 2
        message = str(caught.value)
        assert message.startswith(
            f"capacity store {store.describe()}: put_object t failed after 3 attempts"
        )
        assert "SlowDown" in message
        assert isinstance(caught.value.__cause__, ClientError)
        assert not isinstance(caught.value, CapacityNotFound)
    finally:
        await store.close()


async def test_s3_permanent_errors_are_not_retried(
    s3store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = inject(
        monkeypatch, s3store, "put_object", [], forever=client_error("AccessDenied", 403)
    )
    with pytest.raises(CapacityError) as caught:
        await s3store.put("t", b"x")
    assert len(calls) == 1
    assert s3store.stats.retries == 0
    assert caught.value.detail["code"] == "AccessDenied"
    assert "AccessDenied (HTTP 403)" in str(caught.value)


async def test_s3_short_body_is_retried(s3store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    data = pattern(4096, seed=5)
    await s3store.put("t", data)
    truncate = [True, True]

    def shortened(real: Callable[..., Any]) -> Callable[..., Any]:
        async def get_object(**kw: Any) -> Any:
            response = await real(**kw)
            if truncate:
                truncate.pop()
                async with response["Body"] as body:
                    whole = await body.read()
                response["Body"] = _Body(whole[: len(whole) // 2])
            return response

        return get_object

    # Ranges go through the lean getter, tails through botocore: both checked.
    monkeypatch.setattr(s3store._getter, "get_object", shortened(s3store._getter.get_object))
    monkeypatch.setattr(s3store._client, "get_object", shortened(s3store._client.get_object))
    assert await s3store.get_range("t", 100, 4000) == data[100:4000]
    assert s3store.stats.retries == 2
    truncate[:] = [True]
    assert await s3store.get_tail("t", 1000) == (data[-1000:], 4096)
    assert s3store.stats.retries == 3


async def test_s3_uploads_carry_a_checksum(
    make_s3: Callable[..., S3Store], monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """Every body sent carries its CRC32C, so the store refuses one damaged in
    transit instead of keeping it; also when botocore is configured to send
    checksums only where an operation requires them."""
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    store = make_s3()
    await store.start()
    sent: list[tuple[str, str | None]] = []

    def record(request: Any, event_name: str, **_: Any) -> None:
        sent.append((event_name.split(".")[-1], request.headers.get("x-amz-checksum-crc32c")))

    store._client.meta.events.register("before-send.s3.PutObject", record)
    store._client.meta.events.register("before-send.s3.UploadPart", record)
    try:
        await store.put("one", b"payload")
        upload = store.upload("parts")
        await write_in_pieces(upload, pattern(6 * MiB, seed=7), 3 * MiB)
        await upload.complete()
    finally:
        await store.close()
    assert [op for op, _ in sent] == ["PutObject", "UploadPart", "UploadPart"]
    assert all(crc for _, crc in sent), sent


async def test_s3_body_refused_as_damaged_is_sent_again(
    s3store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    puts = inject(monkeypatch, s3store, "put_object", [client_error("BadDigest", 400)])
    await s3store.put("t", b"payload")
    parts = inject(monkeypatch, s3store, "upload_part", [client_error("XAmzContentSHA256Mismatch", 400)])
    upload = s3store.upload("u")
    await write_in_pieces(upload, pattern(6 * MiB, seed=8), 3 * MiB)
    await upload.complete()
    assert (len(puts), len(parts), s3store.stats.retries) == (2, 3, 2)
    assert await s3store.get_range("t", 0, 7) == b"payload"


async def test_s3_part_upload_retried(s3store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    data = pattern(11 * MiB, seed=6)
    calls = inject(monkeypatch, s3store, "upload_part", [client_error("SlowDown", 503)])
    upload = s3store.upload("retried")
    await write_in_pieces(upload, data, 3 * MiB)
    assert await upload.complete() == len(data)
    assert len(calls) == 4  # three parts, one of them twice
    assert s3store.stats.retries == 1
    assert await s3store.get_range("retried", 0, len(data)) == data


async def test_s3_failed_part_aborts_the_upload(
    s3store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    inject(monkeypatch, s3store, "upload_part", [], forever=client_error("AccessDenied", 403))
    upload = s3store.upload("doomed")
    with pytest.raises(CapacityError, match="AccessDenied"):
        await write_in_pieces(upload, pattern(12 * MiB), 1 * MiB)
        await upload.complete()
    await upload.abort()
    assert await names(s3store) == []
    # the s3_bucket fixture checks that no multipart upload is left open


async def test_s3_retried_complete_that_had_succeeded(
    s3store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first Complete succeeds but its answer is lost; the retry finds
    NoSuchUpload. The object exists with the right size, so this is success."""
    real = s3store._client.complete_multipart_upload
    lost = [True]

    async def complete(**kw: Any) -> Any:
        response = await real(**kw)
        if lost:
            lost.pop()
            raise ConnectionClosedError(endpoint_url="http://x")
        return response

    monkeypatch.setattr(s3store._client, "complete_multipart_upload", complete)
    data = pattern(6 * MiB, seed=8)
    upload = s3store.upload("once")
    await upload.write(data)
    try:
        assert await upload.complete() == len(data)
    except CapacityError as exc:  # a store that repeats Complete idempotently is fine too
        pytest.fail(f"retried complete failed: {exc}")
    assert await s3store.get_range("once", 0, len(data)) == data


async def test_s3_upload_concurrency_is_bounded(
    make_s3: Callable[..., S3Store], monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    store = make_s3(concurrency=2)
    await store.start()
    in_flight = peak = sent = 0

    async def upload_part(**kw: Any) -> Any:
        nonlocal in_flight, peak, sent
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        sent += 1
        return {"ETag": f'"{kw["PartNumber"]}"'}

    monkeypatch.setattr(store._client, "upload_part", upload_part)
    try:
        upload = store.upload("bounded")
        chunk = bytes(MIN_PART_SIZE)
        for _ in range(6):
            await upload.write(chunk)
            assert in_flight <= 2
        await upload.abort()
        assert peak == 2
        assert sent >= 4
        assert await names(store) == []
    finally:
        await store.close()
