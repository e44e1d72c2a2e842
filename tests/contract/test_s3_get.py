"""The lean ranged GET (tiering/_s3_get.py): its signature against botocore's
signer, and its answers and failures on the wire, through moto and through
the fault-injecting proxy."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from urllib.parse import quote

import aiohttp
import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.faults import FaultProxy, Rates, get_object
from tiering.capacity.s3 import S3Store
from tiering.capacity.s3_get import Keys, LeanGetter, _error_fields, env_proxy, parse_listing
from tiering.errors import CapacityError, CapacityNotFound

pytestmark = pytest.mark.anyio

NAMES = ["segments/00000000000000a1", "odd name/with spaces+plus", "ünïcode/ключ", "a=b&c/~tilde_-."]


async def _no_keys() -> Keys:
    raise AssertionError("not called")


def botocore_authorization(
    monkeypatch: pytest.MonkeyPatch, url: str, headers: dict[str, str], keys: Keys, region: str, now: float
) -> str:
    """What botocore's own S3 signer writes for the same request at ``now``."""
    request = AWSRequest(method="GET", url=url, headers={k: v for k, v in headers.items() if k != "host"})
    moment = datetime.fromtimestamp(now, UTC).replace(tzinfo=None)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: moment)
    S3SigV4Auth(Credentials(keys.access_key, keys.secret_key, keys.token), "s3", region).add_auth(request)
    assert request.headers["X-Amz-Date"] == headers["x-amz-date"]
    return request.headers["Authorization"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("token", [None, "session-token/with+odd=chars"])
@pytest.mark.parametrize("if_match", [None, '"0123456789abcdef0123456789abcdef"'])
@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9000", "https://s3.example.com", "http://[::1]:8080/base/"])
def test_signature_is_botocores(
    monkeypatch: pytest.MonkeyPatch, name: str, token: str | None, if_match: str | None, endpoint: str
) -> None:
    getter = LeanGetter(endpoint, "eu-west-3", _no_keys, connections=1, connect_timeout=1, read_timeout=1)
    keys = Keys("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    now = 1_796_000_000.0
    path = getter._base_path + "/bucket-1/" + quote(name, safe="/-_.~")
    headers = getter.sign(path, "", "bytes=5-1048580", if_match, keys, time.gmtime(now))
    url = getter._origin + path
    assert headers["authorization"] == botocore_authorization(monkeypatch, url, headers, keys, "eu-west-3", now)


@pytest.mark.parametrize("params", [
    {"list-type": "2", "max-keys": "1000", "prefix": ""},
    {"list-type": "2", "encoding-type": "url", "prefix": "odd name/with spaces+plus", "start-after": "ünïcode/ключ",
     "delimiter": "/", "continuation-token": "a=b&c/~tilde_-.+=="},
])
def test_a_listing_signature_is_botocores(monkeypatch: pytest.MonkeyPatch, params: dict[str, str]) -> None:
    getter = LeanGetter("http://127.0.0.1:9000", "eu-west-3", _no_keys, connections=1, connect_timeout=1,
                        read_timeout=1)
    keys = Keys("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None)
    now = 1_796_000_000.0
    query = "&".join(f"{quote(n, safe='-_.~')}={quote(v, safe='-_.~')}" for n, v in sorted(params.items()))
    headers = getter.sign("/bucket-1", query, None, None, keys, time.gmtime(now))
    url = f"{getter._origin}/bucket-1?{query}"
    assert headers["authorization"] == botocore_authorization(monkeypatch, url, headers, keys, "eu-west-3", now)


async def test_a_lean_listing_page_is_botocores(s3store: S3Store) -> None:
    """The same pages, key for key, as botocore's list_objects_v2 (which the
    lean one replaces for mounted sources), for keys XML and URLs mangle."""
    names = [*NAMES, "dir/a", "dir/b", "dir/sub/c", "x<y>&'\"z", "tab\tand\u00e9"]
    for name in names:
        await s3store.put(name, name.encode())
    lean, boto = s3store._getter, s3store.client()
    asks = [
        {"Prefix": s3store.prefix},
        {"Prefix": s3store.prefix, "MaxKeys": 3},
        {"Prefix": s3store.prefix, "Delimiter": "/"},
        {"Prefix": s3store.prefix + "dir/", "StartAfter": s3store.prefix + "dir/a"},
        {"Prefix": s3store.prefix + "odd name/"},
    ]
    for ask in asks:
        got = await lean.list_objects_v2(Bucket=s3store.bucket, **ask)
        want = await boto.list_objects_v2(Bucket=s3store.bucket, **ask)
        assert [(c["Key"], c["Size"], c["ETag"], c["LastModified"]) for c in got["Contents"]] == [
            (c["Key"], c["Size"], c["ETag"], c["LastModified"]) for c in want.get("Contents", ())], ask
        assert got["CommonPrefixes"] == want.get("CommonPrefixes", []), ask
        assert got["IsTruncated"] == want["IsTruncated"], ask
        if want["IsTruncated"]:
            after = await lean.list_objects_v2(Bucket=s3store.bucket, ContinuationToken=got["NextContinuationToken"],
                                               **ask)
            assert after["Contents"][0]["Key"] > got["Contents"][-1]["Key"]
    with pytest.raises(ClientError) as caught:
        await lean.list_objects_v2(Bucket="no-such-bucket-here")
    assert caught.value.response["Error"]["Code"] == "NoSuchBucket"


def test_the_proxy_comes_from_the_environment_once(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)

    def proxy(endpoint: str) -> str | None:
        return LeanGetter(endpoint, "r", _no_keys, connections=1, connect_timeout=1, read_timeout=1)._proxy

    assert proxy("http://minio:9000") is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://tls-proxy.internal:3128")
    assert env_proxy("http", "minio") == "http://proxy.internal:3128"
    assert proxy("http://minio:9000") == "http://proxy.internal:3128"
    assert proxy("https://s3.example.com") == "http://tls-proxy.internal:3128"
    monkeypatch.setenv("NO_PROXY", "minio,.example.com")
    assert proxy("http://minio:9000") is None and proxy("https://s3.example.com") is None
    assert proxy("http://other:9000") == "http://proxy.internal:3128"


def test_parse_listing_reads_what_any_s3_server_writes() -> None:
    body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            b"<Name>b</Name><Prefix>p%2F</Prefix><IsTruncated> true </IsTruncated>"
            b"<Contents><Key>p%2Fa+b%26c</Key><LastModified>2026-12-04T17:16:03.671Z</LastModified>"
            b"<ETag>&quot;0123&quot;</ETag><Size>12</Size><Owner><ID>x</ID><DisplayName>y</DisplayName></Owner>"
            b"<StorageClass>STANDARD</StorageClass></Contents>"
            b"<Contents>\n  <Size>0</Size>\n  <Key>p%2F%C3%A9&#38;</Key>\n  <ETag>e</ETag>\n</Contents>"
            b"<CommonPrefixes><Prefix>p%2Fdir%2F</Prefix></CommonPrefixes>"
            b"<NextContinuationToken>tok&amp;en</NextContinuationToken></ListBucketResult>")
    page = parse_listing(body)
    assert [(c["Key"], c["Size"], c["ETag"]) for c in page["Contents"]] == [
        ("p/a b&c", 12, '"0123"'), ("p/\u00e9&", 0, "e")]
    assert page["Contents"][0]["LastModified"] == datetime(2026, 12, 4, 17, 16, 3, 671000, tzinfo=UTC)
    assert page["Contents"][1]["LastModified"] is None
    assert page["CommonPrefixes"] == [{"Prefix": "p/dir/"}]
    assert page["IsTruncated"] is True and page["NextContinuationToken"] == "tok&en"
    empty = parse_listing(b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>")
    assert empty == {"Contents": [], "CommonPrefixes": [], "IsTruncated": False}
    with pytest.raises(aiohttp.ClientPayloadError):
        parse_listing(b"<html>502 Bad Gateway</html>")


def test_host_is_what_aiohttp_sends() -> None:
    def host(endpoint: str) -> str:
        return LeanGetter(endpoint, "r", _no_keys, connections=1, connect_timeout=1, read_timeout=1)._host

    assert host("http://minio:9000") == "minio:9000"
    assert host("http://minio:80") == "minio"
    assert host("https://s3.example.com:443/") == "s3.example.com"
    assert host("https://[::1]:9443") == "[::1]:9443"
    with pytest.raises(ValueError, match="not an http"):
        host("ftp://minio")


def test_error_fields() -> None:
    body = b'<?xml version="1.0"?><Error><Code>SlowDown</Code><Message>Reduce your rate.</Message></Error>'
    assert _error_fields(body) == ("SlowDown", "Reduce your rate.")
    assert _error_fields(b"") == ("", "")
    assert _error_fields(b"<html>502 Bad Gateway</html>") == ("", "")
    assert _error_fields(b"<Error><Code>" + b"x" * 10_000 + b"</Code></Error>") == ("", "")


async def test_an_endpoint_gets_the_lean_getter(s3store: S3Store) -> None:
    assert isinstance(s3store._getter, LeanGetter)
    data = random.Random(1).randbytes(300_000)
    for name in NAMES:
        await s3store.put(name, data)
        assert await s3store.get_range(name, 0, len(data)) == data
        assert await s3store.get_range(name, 12_345, 200_001) == data[12_345:200_001]
    assert s3store.stats.gets == 2 * len(NAMES)
    assert s3store.stats.bytes_read == len(NAMES) * (len(data) + 200_001 - 12_345)
    assert s3store.stats.retries == 0


async def test_missing_past_end_and_if_match(s3store: S3Store) -> None:
    await s3store.put("obj", b"0123456789")
    with pytest.raises(CapacityNotFound):
        await s3store.get_range("absent", 0, 1)
    with pytest.raises(CapacityError, match="object is 10 bytes"):
        await s3store.get_range("obj", 5, 20)
    with pytest.raises(CapacityError, match="starts at or past the end"):
        await s3store.get_range("obj", 10, 11)
    etag = (await s3store.client().head_object(Bucket=s3store.bucket, Key=s3store._key("obj")))["ETag"]
    assert await s3store.get_range("obj", 2, 5, if_match=etag) == b"234"
    with pytest.raises(CapacityError) as caught:
        await s3store.get_range("obj", 2, 5, if_match='"0000"')
    assert caught.value.detail["code"] == "PreconditionFailed"
    assert caught.value.detail["status"] == 412
    assert s3store.stats.retries == 0


async def test_keys_from_the_botocore_chain(
    make_s3: Callable[..., S3Store], monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "chain-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "chain-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "chain-token")
    s = make_s3(access_key=None, secret_key=None)
    await s.start()
    try:
        assert await s._keys() == Keys("chain-key", "chain-secret", "chain-token")
        await s.put("k", b"abc")
        assert await s.get_range("k", 1, 3) == b"bc"
    finally:
        await s.close()


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint, seed=7) as p:
        yield p


@pytest.mark.parametrize("kind", ["internal_error", "slow_down", "unavailable", "reset_before", "reset_after",
                                  "truncate"])
async def test_faults_on_the_wire_are_retried(
    make_s3: Callable[..., S3Store], proxy: FaultProxy, kind: str, anyio_backend: str
) -> None:
    s = make_s3(endpoint=proxy.endpoint, max_attempts=4)
    await s.start()
    try:
        data = random.Random(2).randbytes(1 << 20)
        await s.put("seg", data)
        proxy.rates = Rates(**{kind: 1.0}, max_streak=2, only=get_object)
        for start in (0, 1000, 500_000):
            assert await s.get_range("seg", start, start + 70_000) == data[start : start + 70_000]
        assert proxy.injected[kind] == 6
        assert s.stats.gets == 3
        if kind.startswith("reset"):
            # aiohttp itself sends a GET again, once, when a kept-alive
            # connection it reused turns out closed (a stale keep-alive race).
            assert 3 <= s.stats.retries <= 6
        else:
            assert s.stats.retries == 6
    finally:
        proxy.rates = Rates()
        await s.close()


async def test_a_fault_that_stays_is_an_error(
    make_s3: Callable[..., S3Store], proxy: FaultProxy, anyio_backend: str
) -> None:
    s = make_s3(endpoint=proxy.endpoint, max_attempts=3)
    await s.start()
    try:
        await s.put("seg", b"x" * 1000)
        proxy.rates = Rates(truncate=1.0, only=get_object)
        with pytest.raises(CapacityError, match="failed after 3 attempts"):
            await s.get_range("seg", 0, 1000)
    finally:
        proxy.rates = Rates()
        await s.close()
