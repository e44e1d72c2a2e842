"""The gateway in front of a failing capacity store.

A ``FaultProxy`` (tests/faults.py) sits between the gateway and moto and
answers capacity requests with S3 errors, resets, latency, truncated or
corrupted bodies. The gateway must retry what is transient, refetch what
fails verification, answer 5xx with a message when retries run out (never
wrong bytes, never a hang), and never lose an acknowledged write.

The last test adds a full disk (ENOSPC at the index and the hot tier) to
the store's failures, under the same oracles.

``TIERSTORE_FAULT_ROUNDS`` (default 1) repeats the tests with random faults
(write, flush, evict, read) for a longer release check, and
``TIERSTORE_FAULT_SEED`` picks another sequence of faults; each test prints the faults it injected, and
the module prints the totals at the end (visible with ``-s``).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError, ResponseStreamingError

from tests import smallfs
from tests.conftest import assert_consistent, make_client, running_gateway
from tests.faults import FaultProxy, Rates, get_object, multipart, put
from tests.integration.fullness import Writers
from tests.integration.oracle import kill
from tests.integration.s3raw import RecordingClient, boto_error
from tests.integration.test_capacity import CAPACITY_KEYS, pattern
from tests.servers import Gateway

MiB = 1024 * 1024
ROUNDS = max(1, int(os.environ.get("TIERSTORE_FAULT_ROUNDS", "1")))
SEED = int(os.environ.get("TIERSTORE_FAULT_SEED", "20261203"))
LARGE = 10 * MiB + 4321  # three extents, a segment of its own, uploaded in three parts
LAYOUT = ["--segment-size", "8M", "--part-size", "5M", "--small-object-size", "1M"]
# Transient failures of 30 % of the capacity requests, none more than twice
# in a row: the store's retries (6 attempts) and the refetches of corrupt
# extents (3) always get through, so any failure the client sees is a bug.
FLAKY = Rates(internal_error=0.1, slow_down=0.1, unavailable=0.04, reset_before=0.03, reset_after=0.03, max_streak=2)


@pytest.fixture(scope="module")
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint, seed=SEED) as proxy:
        yield proxy
        print(f"\ntest_faults (seed {SEED}, {ROUNDS} rounds) total: {proxy.summary()}")


@pytest.fixture(scope="module")
def gw(proxy: FaultProxy, moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose capacity store is moto behind the proxy; flush
    rounds every 2 s, so the flusher's own retries show."""
    name = f"faults-{os.getpid()}"
    boto3.client(
        "s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
        aws_secret_access_key="testing", region_name="us-east-1",
    ).create_bucket(Bucket=name)
    root = tmp_path_factory.mktemp("faults")
    args = ["--capacity", f"s3://{name}/tier", "--capacity-endpoint", proxy.endpoint, *CAPACITY_KEYS]
    with running_gateway(root / "data", *args, *LAYOUT, "--flush-delay", "2") as gw:
        yield gw


@pytest.fixture(autouse=True)
def faults_off(proxy: FaultProxy, request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts and ends with a healthy store, and reports its faults."""
    proxy.rates = Rates()
    before = proxy.injected.copy()
    yield
    proxy.rates = Rates()
    print(f"\n{request.node.name}: {dict(proxy.injected - before)}")


@pytest.fixture(scope="module")
def client(gw: Gateway):
    return make_client(gw.endpoint, read_timeout=60)


@pytest.fixture
def fbucket(client, request: pytest.FixtureRequest) -> str:
    name = "f-" + hashlib.md5(request.node.nodeid.encode()).hexdigest()[:16]
    client.create_bucket(Bucket=name)
    return name


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def write_objects(client, bucket: str, prefix: str, small: int = 12, large: int = 1) -> dict[str, str]:
    """Small objects (packed together) and large ones (multi-extent); key -> md5."""
    written = {}
    for i in range(small):
        data = pattern(20_000 + 7_919 * i, i)
        client.put_object(Bucket=bucket, Key=f"{prefix}small/{i:04d}", Body=data)
        written[f"{prefix}small/{i:04d}"] = md5(data)
    for i in range(large):
        data = pattern(LARGE + i, 1000 + i)
        client.put_object(Bucket=bucket, Key=f"{prefix}large/{i:04d}", Body=data)
        written[f"{prefix}large/{i:04d}"] = md5(data)
    return written


def read(client, bucket: str, key: str) -> bytes | None:
    """The object's bytes, or None when the gateway answered 5xx or cut the
    body short (retries ran out): both are allowed, wrong bytes are not."""
    try:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
        assert status in (500, 503), exc.response
        assert exc.response["Error"]["Message"], exc.response
        return None
    except ResponseStreamingError:
        return None


def read_back(client, bucket: str, written: dict[str, str]) -> None:
    """Every object reads back, first time, with its bytes."""
    for key, digest in written.items():
        data = read(client, bucket, key)
        assert data is not None, f"{key}: the read failed"
        assert md5(data) == digest, f"{key}: wrong bytes served"


def tiers(gw: Gateway) -> dict:
    return gw.admin("GET", "/tiers").json()


def where(gw: Gateway, bucket: str, key: str) -> str:
    return gw.admin("GET", f"/objects/{bucket}/{key}").json()["where"]


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.2)


# ---- tests -------------------------------------------------------------------


def test_transient_failures_are_retried(gw: Gateway, proxy: FaultProxy, client, fbucket: str) -> None:
    """Errors and resets on 30 % of the capacity requests: writes, flushes
    and cold reads all succeed, by retrying."""
    retries_before = tiers(gw)["capacity_requests"]["retries"]
    before = proxy.injected.copy()
    proxy.rates = FLAKY
    for r in range(ROUNDS):
        written = write_objects(client, fbucket, f"r{r}/")
        gw.flush()
        gw.evict()
        assert where(gw, fbucket, f"r{r}/large/0000") == "capacity"
        read_back(client, fbucket, written)
    assert (proxy.injected - before).total() > 0
    assert tiers(gw)["capacity_requests"]["retries"] > retries_before


def test_corrupt_and_truncated_reads_are_refetched(gw: Gateway, proxy: FaultProxy, client, fbucket: str) -> None:
    """Flipped and cut-short segment GETs fail verification (or the length
    check) and are fetched again: the client gets the right bytes. But for
    a large extent stored as it is, sent on as it arrives
    (tiering/reads/arrival.py): once bytes that fail the CRC have gone out,
    the answer is cut short instead (never completed with them), and the
    client's next read gets the right bytes."""
    before = proxy.injected.copy()
    for r in range(ROUNDS):
        written = write_objects(client, fbucket, f"r{r}/", small=20)
        gw.flush()
        gw.evict()
        # Each segment GET is flipped or truncated twice, then passes.
        proxy.rates = Rates(flip=0.5, truncate=0.5, only=get_object, max_streak=2)
        cut = {}
        for key, digest in written.items():
            data = read(client, fbucket, key)
            if data is None and "/large/" in key:
                cut[key] = digest
                continue
            assert data is not None, f"{key}: the read failed"
            assert md5(data) == digest, f"{key}: wrong bytes served"
        proxy.rates = Rates()
        read_back(client, fbucket, cut)
    injected = proxy.injected - before
    assert injected["flip"] > 0 and injected["truncate"] > 0


def put_flushed(client, bucket: str, key: str, data: bytes, gw: Gateway) -> None:
    """``data`` under ``key``, in the capacity tier only."""
    client.put_object(Bucket=bucket, Key=key, Body=data)
    gw.flush()
    gw.evict()
    assert where(gw, bucket, key) == "capacity"


def test_reads_that_stay_corrupt_fail_with_503(gw: Gateway, proxy: FaultProxy, fbucket: str) -> None:
    """Every segment GET corrupted: the client gets a 503 with a message,
    never wrong bytes, and nothing corrupt is cached; with the store
    healthy again the same read succeeds."""
    s3r = RecordingClient(gw.endpoint)
    data = pattern(300_000, 5)
    put_flushed(s3r.client, fbucket, "small", data, gw)
    proxy.rates = Rates(flip=1.0, only=get_object)
    err = boto_error(s3r, s3r.client.get_object, 503, "ServiceUnavailable", Bucket=fbucket, Key="small")
    assert "corrupt" in err.response["Error"]["Message"]
    assert where(gw, fbucket, "small") == "capacity"
    proxy.rates = Rates()
    assert md5(s3r.client.get_object(Bucket=fbucket, Key="small")["Body"].read()) == md5(data)
    assert where(gw, fbucket, "small") == "hot"


def test_corrupted_uploads_are_refused_and_resent(gw: Gateway, proxy: FaultProxy, client, fbucket: str) -> None:
    """Flipped request bodies of segment uploads: every upload carries a
    digest, so the store refuses the damaged ones (BadDigest) instead of
    storing them, and the gateway sends them again."""
    before = proxy.injected.copy()
    proxy.rates = Rates(flip_request=1.0, only=put, max_streak=1)  # each first try
    written = write_objects(client, fbucket, "")
    gw.flush()
    proxy.rates = Rates()
    gw.evict()
    read_back(client, fbucket, written)
    injected = proxy.injected - before
    assert injected["flip_request"] >= 4  # a packed segment, three parts of a large one
    assert injected["flip_request_stored"] == 0, "an upload without a digest was stored corrupted"


def test_write_back_survives_an_outage(gw: Gateway, proxy: FaultProxy, client, fbucket: str) -> None:
    """Capacity PUTs all failing: a write-through PUT answers 503, write-back
    PUTs are still acknowledged and read from the hot tier, the flusher fails
    and keeps retrying, and once the store is back everything lands; nothing
    acknowledged is lost."""
    proxy.rates = Rates(unavailable=1.0, only=put)
    s3r = RecordingClient(gw.endpoint)
    wt = fbucket + "-wt"
    gw.admin("POST", "/buckets", json={"name": wt, "write_through": True})
    data = pattern(50_000, 9)
    err = boto_error(s3r, s3r.client.put_object, 503, "ServiceUnavailable", Bucket=wt, Key="k", Body=data)
    assert "capacity store" in err.response["Error"]["Message"]
    # Not acknowledged, but committed before the wait: the object is there,
    # complete, and goes to the capacity store once it is back.
    assert md5(client.get_object(Bucket=wt, Key="k")["Body"].read()) == md5(data)

    written = write_objects(client, fbucket, "")
    read_back(client, fbucket, written)
    status = tiers(gw)
    assert "ServiceUnavailable" in status["last_flush_error"]
    assert status["hot_staged"] > 0 and status["flush_queue"] > 0

    proxy.rates = Rates()
    client.put_object(Bucket=wt, Key="k2", Body=data)  # acknowledged once flushed, as before
    wait_for(lambda: tiers(gw)["hot_staged"] == 0 and tiers(gw)["flush_queue"] == 0, "the flusher lands it all")
    gw.evict()
    assert where(gw, fbucket, "small/0000") == where(gw, wt, "k") == "capacity"
    read_back(client, fbucket, written)
    read_back(client, wt, {"k": md5(data), "k2": md5(data)})


def test_latency_slows_but_does_not_fail(gw: Gateway, proxy: FaultProxy, client, fbucket: str) -> None:
    """50 ms more on every capacity request: no timeout, no failure."""
    proxy.rates = Rates(latency=1.0, delay=0.05)
    written = write_objects(client, fbucket, "", small=6)
    gw.flush()
    gw.evict()
    read_back(client, fbucket, written)
    assert proxy.injected["latency"] > 0


def test_resets_mid_multipart_upload(gw: Gateway, proxy: FaultProxy, client, fbucket: str) -> None:
    """Connections reset while a large segment is uploaded in parts (before
    a request, or after the store took it): the upload completes."""
    before = proxy.injected.copy()
    # Each multipart request (create, parts, complete) is reset on its first try.
    proxy.rates = Rates(reset_before=0.5, reset_after=0.5, only=multipart, max_streak=1)
    written = write_objects(client, fbucket, "", small=0, large=1)
    gw.flush()
    proxy.rates = Rates()
    gw.evict()
    read_back(client, fbucket, written)
    resets = proxy.injected - before
    assert resets["reset_before"] + resets["reset_after"] >= 5  # create, 3 parts, complete


@pytest.fixture(scope="module")
def mounted(gw: Gateway, proxy: FaultProxy, moto_endpoint: str) -> dict[str, bytes]:
    """A bucket at moto, written directly, mounted through the proxy.
    obj-0 is stored with a CRC32, which the store sends back with the
    gateway's ranged GET (checksum mode); obj-1 and obj-2 without one, as
    older uploads are: only their MD5 ETag can tell. obj-3 is a one-part
    multipart upload with a full-object CRC32: its ETag (``-1``) is no MD5,
    only the checksum can tell."""
    def source(checksums: str):  # type: ignore[no-untyped-def]
        return boto3.client(
            "s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
            aws_secret_access_key="testing", region_name="us-east-1",
            config=BotoConfig(request_checksum_calculation=checksums),
        )

    name = f"faults-src-{os.getpid()}"
    source("when_supported").create_bucket(Bucket=name)
    data = {f"obj-{i}": pattern(200_000 + i, 40 + i) for i in range(3)}
    for key, body in data.items():
        source("when_supported" if key == "obj-0" else "when_required").put_object(
            Bucket=name, Key=key, Body=body
        )
    data["obj-3"] = pattern(150_000, 44)
    s3 = source("when_supported")
    upload = s3.create_multipart_upload(Bucket=name, Key="obj-3", ChecksumAlgorithm="CRC32",
                                        ChecksumType="FULL_OBJECT")["UploadId"]
    part = s3.upload_part(Bucket=name, Key="obj-3", UploadId=upload, PartNumber=1, Body=data["obj-3"],
                          ChecksumAlgorithm="CRC32")
    s3.complete_multipart_upload(Bucket=name, Key="obj-3", UploadId=upload, MultipartUpload={"Parts": [
        {"PartNumber": 1, "ETag": part["ETag"], "ChecksumCRC32": part["ChecksumCRC32"]}]})
    body = {"name": "f-mounted", "source": f"s3://{name}", "endpoint": proxy.endpoint,
            "access_key": "testing", "secret_key": "testing", "freshness": "immutable", "check_md5": True}
    gw.admin("POST", "/mounts", json=body)
    return data


def test_mounted_objects_corrupt_in_transit_are_refetched(gw: Gateway, proxy: FaultProxy, mounted) -> None:
    """A piece that is the whole object is checked against the store's
    checksum of the whole content (obj-0, obj-3), else (the mount has
    check_md5) its MD5 ETag (obj-1).
    Corrupted twice: the third fetch is served. Corrupted every time: 503 naming the
    corruption, nothing cached, and the same read works once the source
    answers cleanly."""
    s3r = RecordingClient(gw.endpoint)
    proxy.rates = Rates(flip=1.0, only=get_object, max_streak=2)
    for key in ("obj-0", "obj-1", "obj-3"):
        got = s3r.client.get_object(Bucket="f-mounted", Key=key)["Body"].read()
        assert md5(got) == md5(mounted[key]), key
    proxy.rates = Rates(flip=1.0, only=get_object)
    err = boto_error(s3r, s3r.client.get_object, 503, "ServiceUnavailable", Bucket="f-mounted", Key="obj-2")
    assert "corrupt" in err.response["Error"]["Message"]
    proxy.rates = Rates()
    got = s3r.client.get_object(Bucket="f-mounted", Key="obj-2")["Body"].read()
    assert md5(got) == md5(mounted["obj-2"])
    assert proxy.injected["flip"] > 0


@pytest.fixture(scope="module")
def streamed(gw: Gateway, client) -> tuple[str, str, bytes]:
    """A large object in the capacity tier: (bucket, key, bytes)."""
    client.create_bucket(Bucket="f-streamed")
    data = pattern(LARGE, 6)
    put_flushed(client, "f-streamed", "large", data, gw)
    return "f-streamed", "large", data


def test_streamed_read_that_stays_corrupt_is_cut_short(gw: Gateway, proxy: FaultProxy, client, streamed) -> None:
    """Never wrong bytes, never a hang, nothing corrupt cached."""
    bucket, key, data = streamed
    proxy.rates = Rates(flip=1.0, only=get_object)
    assert read(client, bucket, key) is None
    assert where(gw, bucket, key) == "capacity"
    proxy.rates = Rates()
    read_back(client, bucket, {key: md5(data)})


def test_streamed_read_that_stays_corrupt_fails_before_its_end(gw: Gateway, proxy: FaultProxy, streamed) -> None:
    """The first block of a streamed body is fetched before the head is
    sent: a compressed first extent is checked whole first, so a read that
    fails from its start is an error answer (503); one stored as it is goes
    out as it arrives (tiering/reads/arrival.py), so the same read is a 200
    cut short before its last byte. Never a complete answer."""
    bucket, key, _ = streamed
    gw.evict()
    proxy.rates = Rates(flip=1.0, only=get_object)
    s3r = RecordingClient(gw.endpoint)
    try:
        s3r.client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == 503, exc.response
    except ResponseStreamingError:
        pass  # cut short
    else:
        pytest.fail("a store that corrupts every body cannot be read from")
    finally:
        proxy.rates = Rates()


def test_zz_no_traceback_logged(gw: Gateway) -> None:
    """After the tests above: no failure became an unexpected error."""
    log = gw.log()
    assert "Traceback" not in log, log[-5000:]
    assert "error=InternalError" not in log, log[-5000:]
    assert not re.search(r"request [0-9A-F]+ failed", log), log[-5000:]


def test_a_cold_small_object_costs_the_store_one_request(
    gw: Gateway, client, fbucket: str, proxy: FaultProxy, moto_endpoint: str
) -> None:
    """Counted at the store's door: a flushed and evicted small object is one
    ranged GET, no HEAD or probe before it; the second read none. The same
    for an object of a mounted bucket read for the first time. (Requests
    with a query are the flusher's and compaction's listings, not reads.)"""

    def reads(since: int) -> list[tuple[str, str, str]]:
        return [r for r in proxy.requests[since:] if "?" not in r[1]]

    data = pattern(65_536, 3)
    client.put_object(Bucket=fbucket, Key="cold/one", Body=data)
    gw.flush()
    gw.evict()
    before = len(proxy.requests)
    assert client.get_object(Bucket=fbucket, Key="cold/one")["Body"].read() == data
    asked = reads(before)
    assert [(method, bool(range_)) for method, _, range_ in asked] == [("GET", True)], asked
    assert client.get_object(Bucket=fbucket, Key="cold/one")["Body"].read() == data
    assert reads(before) == asked

    source = f"{fbucket}-src"
    store = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                         aws_secret_access_key="testing", region_name="us-east-1")
    store.create_bucket(Bucket=source)
    store.put_object(Bucket=source, Key="one", Body=data)
    mounted = gw.admin("POST", "/mounts", json={"name": f"{fbucket}-m", "source": f"s3://{source}",
                                                 "endpoint": proxy.endpoint, "access_key": "testing",
                                                 "secret_key": "testing"})
    assert mounted.status_code == 201, mounted.text
    before = len(proxy.requests)
    assert client.get_object(Bucket=f"{fbucket}-m", Key="one")["Body"].read() == data
    asked = reads(before)
    assert [(method, bool(range_)) for method, _, range_ in asked] == [("GET", True)], asked
    assert client.get_object(Bucket=f"{fbucket}-m", Key="one")["Body"].read() == data
    assert reads(before) == asked


def test_a_full_disk_under_store_faults(proxy: FaultProxy, moto_endpoint: str, tmp_path: Path) -> None:
    """ENOSPC at the index and the hot tier at once (the data dir is a small
    filesystem another tenant fills) while the store fails transiently: the
    same oracles as above. No answer is a 500; every acknowledged object
    reads back byte-identical, after a SIGKILL too; a mounted bucket's reads
    are answered, uncached; nothing is logged as an unexpected error."""
    name = f"fullfaults-{os.getpid()}"
    store = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                         aws_secret_access_key="testing", region_name="us-east-1")
    store.create_bucket(Bucket=name)
    store.create_bucket(Bucket=f"{name}-src")
    sources = {f"m/{i}": pattern(300_000 + i, i) for i in range(6)}
    for key, data in sources.items():
        store.put_object(Bucket=f"{name}-src", Key=key, Body=data)
    args = ["--capacity", f"s3://{name}/tier", "--capacity-endpoint", proxy.endpoint, *CAPACITY_KEYS, *LAYOUT,
            "--flush-delay", "1", "--free-floor", "12M", "--hot-size", "1G"]
    with smallfs.tmpfs(tmp_path / "data", 64 * MiB) as disk:
        gw = Gateway(disk, extra_args=args).start()
        try:
            s3 = make_client(gw.endpoint, read_timeout=60)
            s3.create_bucket(Bucket="faulty")
            gw.admin("POST", "/mounts", json={"name": "mounted", "source": f"s3://{name}-src",
                                              "endpoint": proxy.endpoint, "access_key": "testing",
                                              "secret_key": "testing"})
            proxy.rates = FLAKY
            writers = Writers(gw, "faulty", 2 * 64 * MiB, threads=4, seed=SEED)
            writers.run(during=lambda: smallfs.fill(disk))
            print(f"\n{writers.tally.summary()}")
            assert writers.tally.count(500) == 0, writers.tally.summary()
            assert {s for s, _ in writers.tally.refusals()} <= {503, 507}, writers.tally.summary()
            assert set(writers.tally.reads) == {200} and writers.tally.wrong_reads == 0
            for key, data in sources.items():  # the disk is full: answered, not cached
                assert s3.get_object(Bucket="mounted", Key=key)["Body"].read() == data
            proxy.rates = Rates()
            kill(gw)
            gw.start()  # on the full disk
            writers.verify(gw)
            smallfs.empty(disk)
        finally:
            gw.stop()
        log = gw.log()
        assert "Traceback" not in log and " ERROR " not in log, log[-5000:]
        assert_consistent(gw)
