"""The cold path's files: a cold epoch of small objects, mounted or
managed, read through boto3 from a real gateway, writes its misses into a
few shared hot-tier logs (tiering/hot/logs.py) instead of a file per
object, with one store request per object; a SIGKILL while those logs are
being filled loses nothing and serves no wrong byte after the restart. A
cold HEAD of a mounted object is one ranged GET of its first byte."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from tests.conftest import make_client, running_gateway
from tests.integration.helpers import counting_proxy
from tests.integration.oracle import kill
from tests.integration.test_mounts import direct, mount
from tests.servers import Gateway

COUNT = 1000
SIZE = 8 * 1024
HANDFUL = 5  # hot-tier files a cold epoch of COUNT small objects may create


def _body(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (SIZE // 32)


def _hot_files(gw: Gateway) -> set[str]:
    root = gw.data_dir / "hot"
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _read_all(client, bucket: str, keys: list[str], threads: int = 8) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    def get(key: str) -> tuple[str, bytes]:
        return key, client.get_object(Bucket=bucket, Key=key)["Body"].read()

    with ThreadPoolExecutor(threads) as pool:
        return dict(pool.map(get, keys))


@pytest.fixture(scope="module")
def source(moto_endpoint: str) -> dict[str, bytes]:
    src = direct(moto_endpoint)
    src.create_bucket(Bucket="coldset")
    objects = {f"train/{i:04d}": _body(i) for i in range(COUNT)}

    def put(item: tuple[str, bytes]) -> None:
        src.put_object(Bucket="coldset", Key=item[0], Body=item[1])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, objects.items()))
    return objects


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    with running_gateway(tmp_path / "data") as gateway:
        yield gateway


def test_a_cold_mounted_epoch_writes_a_handful_of_files(gw: Gateway, moto_endpoint: str,
                                                        source: dict[str, bytes]) -> None:
    with counting_proxy(moto_endpoint) as proxy:
        mount(gw, "cold", "s3://coldset/train", f"http://127.0.0.1:{proxy.port}", freshness="immutable")
        client = make_client(gw.endpoint)
        keys = sorted(k.removeprefix("train/") for k in source)
        before = _hot_files(gw)
        got = _read_all(client, "cold", keys)
        assert all(got[k] == source[f"train/{k}"] for k in keys)
        created = _hot_files(gw) - before
        assert len(created) <= HANDFUL, sorted(created)[:20]
        gets = proxy.requests_to("GetObject", "/coldset/train/")
        assert gets == COUNT, f"{gets} store GETs for {COUNT} cold objects"
        # The second epoch is warm: no store request, no new file.
        again = _read_all(client, "cold", keys)
        assert again == got
        assert proxy.requests_to("GetObject", "/coldset/train/") == COUNT
        assert _hot_files(gw) - before == created
        # The records the misses held in memory reached the index by the stop:
        # after a restart the epoch is still warm.
        gw.restart()
        assert _read_all(make_client(gw.endpoint), "cold", keys) == got
        assert proxy.requests_to("GetObject", "/coldset/train/") == COUNT


def test_a_cold_managed_epoch_writes_a_handful_of_files(gw: Gateway) -> None:
    client = make_client(gw.endpoint)
    client.create_bucket(Bucket="managed-cold")
    keys = [f"k/{i:04d}" for i in range(300)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: client.put_object(Bucket="managed-cold", Key=k, Body=_body(int(k[2:]))), keys))
    gw.flush()
    gw.evict()
    before = _hot_files(gw)
    got = _read_all(client, "managed-cold", keys)
    assert all(got[k] == _body(int(k[2:])) for k in keys)
    assert len(_hot_files(gw) - before) <= HANDFUL


def test_a_kill_while_logs_fill_serves_no_wrong_byte(gw: Gateway, moto_endpoint: str,
                                                       source: dict[str, bytes]) -> None:
    mount(gw, "cold", "s3://coldset/train", moto_endpoint, freshness="immutable")
    client = make_client(gw.endpoint)
    keys = sorted(k.removeprefix("train/") for k in source)
    done = threading.Event()
    read = [0]

    def reader(part: list[str]) -> None:
        for key in part:
            if done.is_set():
                return
            try:
                assert client.get_object(Bucket="cold", Key=key)["Body"].read() == source[f"train/{key}"]
            except AssertionError:
                raise
            except Exception:  # the gateway was killed under this read
                return
            read[0] += 1

    threads = [threading.Thread(target=reader, args=(keys[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    while read[0] < COUNT // 3 and any(t.is_alive() for t in threads):
        threading.Event().wait(0.01)
    kill(gw)  # fills of the pieces just read are being appended
    done.set()
    for t in threads:
        t.join()
    assert read[0] < COUNT, "the kill came after the epoch: nothing was cut"
    logs = gw.data_dir / "hot" / "cache" / "logs"
    assert logs.is_dir() and os.listdir(logs)
    gw.start()
    fresh = make_client(gw.endpoint)
    got = _read_all(fresh, "cold", keys)
    assert [k for k in keys if got[k] != source[f"train/{k}"]] == []


def test_a_cold_head_is_described_by_a_one_byte_get(gw: Gateway, moto_endpoint: str) -> None:
    """A HEAD of a mounted object not validated yet asks the source with a
    ranged GET of its first byte (the lean getter's, not botocore's HEAD):
    the same description as the source's HEAD. An empty object has no first
    byte, nor has an archived one (InvalidObjectState): a HEAD describes those."""
    src = direct(moto_endpoint)
    src.create_bucket(Bucket="heads")
    bodies = {"a.jpg": b"x" * 3000, "b.bin": os.urandom(70_000), "empty": b""}
    for key, body in bodies.items():
        src.put_object(Bucket="heads", Key=key, Body=body, ContentType="image/jpeg",
                       Metadata={"origin": key}, CacheControl="max-age=60")
    src.put_object(Bucket="heads", Key="archived", Body=b"cold", StorageClass="GLACIER")
    with counting_proxy(moto_endpoint) as proxy:
        mount(gw, "heads", "s3://heads", f"http://127.0.0.1:{proxy.port}", freshness="immutable")
        client = make_client(gw.endpoint)
        fields = ("ContentLength", "ETag", "ContentType", "Metadata", "CacheControl", "LastModified")
        for key in [*bodies, "archived"]:
            got, want = client.head_object(Bucket="heads", Key=key), src.head_object(Bucket="heads", Key=key)
            assert {f: got.get(f) for f in fields} == {f: want.get(f) for f in fields}, key
        # The empty and the archived object: a HEAD after the GET's InvalidRange or InvalidObjectState.
        assert proxy.operations["HeadObject"] == 2
        assert proxy.operations["GetObject"] == len(bodies) + 1
        assert client.get_object(Bucket="heads", Key="b.bin")["Body"].read() == bodies["b.bin"]
        with pytest.raises(ClientError) as archived:
            client.get_object(Bucket="heads", Key="archived")
        assert archived.value.response["Error"]["Code"] == "InvalidObjectState"
