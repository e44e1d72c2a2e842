"""Hostile clients against a real gateway: odd keys, fuzzed requests, XML
bombs, oversized heads and bodies, slow clients.

What must hold for all of them: the gateway answers with an S3 error (4xx,
XML that parses, the request id) or closes the connection, never 5xx (501
NotImplemented is S3's own answer to what it does not implement); it stays
healthy; nothing is written outside its data directory and no refused write
leaves an object or a staged file behind; its log holds no traceback.

A PUT or UploadPart declaring more than 5 GiB is refused before its body
is read in test_limits.py, and not repeated here.

Most tests use the session gateway. The slow-client tests use a gateway of
their own whose ``client_timeout`` is two seconds, so the bounds on a slow
request head or a stalled body show within a test's time.

The raw-request fuzzer tries ``TIERSTORE_FUZZ_EXAMPLES`` requests per mode
(default 100), as the parser fuzzer does (tests/unit/gateway/test_fuzz_parsers.py).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import select
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import summary
from tests.conftest import running_gateway
from tests.integration.s3raw import Answer, read_answer, sign
from tests.servers import Gateway

EXAMPLES = int(os.environ.get("TIERSTORE_FUZZ_EXAMPLES", "100"))
CLIENT_TIMEOUT = 2.0  # the slow-client gateway's client_timeout
MiB = 1024 * 1024
TRIED = {"signed": 0, "unsigned": 0}


# -- raw HTTP ---------------------------------------------------------------------


def connect(gw: Gateway, timeout: float = 30.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", gw.port), timeout=timeout)


def exchange(gw: Gateway, data: bytes, head_only: bool = False) -> Answer | None:
    """Send ``data`` on a new connection; the answer, or None if it was closed."""
    with connect(gw) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-send: the answer (if any) is still readable
        return read_answer(sock, head_only)


def request_bytes(method: str, target: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    head = "\r\n".join(lines) + "\r\n\r\n"
    try:
        return head.encode("latin-1") + body
    except UnicodeEncodeError:  # what a client sends for text past latin-1
        return head.encode("utf-8") + body


def signed_bytes(gw: Gateway, method: str, target: str, headers: dict[str, str] | None = None,
                 body: bytes = b"", *, length: int | None = None, payload_hash: str | None = None) -> bytes:
    """A request signed (botocore's signer) for exactly this target, as bytes."""
    signed, _, _ = sign(method, gw.endpoint + target, headers, body, payload_hash=payload_hash)
    signed.setdefault("Host", gw.endpoint.removeprefix("http://"))
    signed["Content-Length"] = str(len(body) if length is None else length)
    return request_bytes(method, target, signed, body)


def send_signed(gw: Gateway, method: str, target: str, headers: dict[str, str] | None = None,
                body: bytes = b"", **options: object) -> Answer | None:
    return exchange(gw, signed_bytes(gw, method, target, headers, body, **options),  # type: ignore[arg-type]
                    head_only=method == "HEAD")


def s3_error(answer: Answer | None, status: int, code: str) -> ET.Element:
    """Assert an S3 error answer: status, request id, XML <Error> with ``code``."""
    assert answer is not None, "the connection was closed without an answer"
    assert answer.status == status, (answer.status, answer.body[:500])
    assert answer.headers.get("x-amz-request-id"), answer.headers
    root = ET.fromstring(answer.body)
    assert root.tag == "Error" and root.findtext("Code") == code, answer.body[:500]
    return root


def sound(answer: Answer | None, method: str) -> None:
    """The property every answer to a hostile request has (None: closed)."""
    if answer is None:
        return
    assert answer.status < 500 or answer.status == 501, (answer.status, answer.body[:500])
    assert answer.headers.get("x-amz-request-id"), answer.headers
    if answer.status >= 400 and method != "HEAD":
        root = ET.fromstring(answer.body)  # must parse: botocore would lose the code otherwise
        assert root.tag == "Error" and root.findtext("Code"), answer.body[:500]


def healthy(gw: Gateway) -> None:
    assert httpx.get(f"{gw.admin_url}/health", timeout=30).status_code == 200


def files_outside(root: Path, inside: Path) -> set[Path]:
    return {p for p in root.rglob("*") if inside not in p.parents and p != inside}


def staged_files(gw: Gateway) -> set[Path]:
    """Staged pieces of the hot tier (cached extents live under hot/cache)."""
    hot = gw.data_dir / "hot"
    return {p for p in hot.rglob("*") if p.is_file() and "cache" not in p.relative_to(hot).parts}


@pytest.fixture(scope="module")
def log_offset(gateway: Gateway) -> int:
    return len(gateway.log())


@pytest.fixture
def hostile_bucket(gateway: Gateway, bucket: str, log_offset: int) -> str:
    return bucket


# -- keys and bucket names -------------------------------------------------------

# Keys S3 stores as they are (it normalizes nothing): each must round-trip.
ESCAPE = "tierstore-escaped-key-marker"
ODD_KEYS = [
    "a/../b", "../escape", f"{'../' * 12}{ESCAPE}", f"..\\..\\{ESCAPE}", "./a", "a/./b", ".", "..", "a/..",
    "/leading", "//double//slash//", "trailing/", "ctl\x01\x02\x1f\x7f", "tab\tnew\nline\rcr",
    "back\\slash", "%2e%2e", "sp ace+plus", "é✓🙂", "?#[]@!$&'()*,;=",
]


@pytest.mark.parametrize("key", ODD_KEYS)
def test_odd_keys_round_trip_and_stay_inside_the_data_dir(gateway: Gateway, hostile_bucket: str, key: str,
                                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each key is stored and listed exactly as sent; no file appears beside
    the data directory, nor anywhere in the test run's temporary tree under
    the name a key tried to reach with '..'."""
    before = files_outside(gateway.data_dir.parent, gateway.data_dir)
    target = f"/{hostile_bucket}/{quote(key, safe='/')}"
    body = b"odd key " + key.encode()
    assert send_signed(gateway, "PUT", target, body=body).status == 200  # type: ignore[union-attr]
    got = send_signed(gateway, "GET", target)
    assert got is not None and (got.status, got.body) == (200, body)
    assert send_signed(gateway, "HEAD", target).status == 200  # type: ignore[union-attr]
    listed = send_signed(gateway, "GET", f"/{hostile_bucket}?encoding-type=url&list-type=2&prefix="
                         + quote(key, safe="-_.~"))
    assert listed is not None and listed.status == 200
    keys = [el.text for el in ET.fromstring(listed.body).iter() if el.tag.endswith("}Key")]
    assert keys == [quote(key, safe="/")]  # encoding-type=url: exactly the key stored
    assert send_signed(gateway, "DELETE", target).status == 204  # type: ignore[union-attr]
    assert files_outside(gateway.data_dir.parent, gateway.data_dir) == before
    if ESCAPE in key:
        assert not [p for p in tmp_path_factory.getbasetemp().rglob(f"*{ESCAPE}*")]


@pytest.mark.parametrize(("raw_key", "code"), [
    ("a%00b", "InvalidArgument"),  # NUL: see test docstring
    ("%ed%a0%80", "InvalidURI"),  # an encoded surrogate is not UTF-8
    ("%c0%ae%c0%ae", "InvalidURI"),  # overlong "..": not UTF-8 either
    ("k" * 1025, "KeyTooLongError"),
])
def test_keys_s3_cannot_store_are_refused(gateway: Gateway, hostile_bucket: str, raw_key: str,
                                          code: str) -> None:
    """S3 accepts any UTF-8 key, NUL included; this gateway refuses NUL
    (400 InvalidArgument) because XML 1.0 listings cannot carry it, not even
    as a reference, and its index separates names with it."""
    before = files_outside(gateway.data_dir.parent, gateway.data_dir)
    staged = staged_files(gateway)
    for method, query in [("PUT", ""), ("POST", "?uploads")]:
        answer = send_signed(gateway, method, f"/{hostile_bucket}/{raw_key}{query}", body=b"x" * 10)
        s3_error(answer, 400, code)
    listed = send_signed(gateway, "GET", f"/{hostile_bucket}?list-type=2")
    assert listed is not None and b"<Contents>" not in listed.body
    assert files_outside(gateway.data_dir.parent, gateway.data_dir) == before
    assert staged_files(gateway) <= staged  # no staged file left behind


@pytest.mark.parametrize("name", ["a..b", "%2e%2e", "Bad_Name", "-dash", "a" * 64, "%c3%28bucket"])
def test_invalid_bucket_names_create_nothing(gateway: Gateway, log_offset: int, name: str) -> None:
    before = files_outside(gateway.data_dir.parent, gateway.data_dir)
    answer = send_signed(gateway, "PUT", f"/{name}")
    sound(answer, "PUT")
    assert answer is not None and answer.status == 400
    assert ET.fromstring(answer.body).findtext("Code") in ("InvalidBucketName", "InvalidURI")
    sound(send_signed(gateway, "PUT", f"/{name}/key", body=b"x"), "PUT")
    assert files_outside(gateway.data_dir.parent, gateway.data_dir) == before


def test_control_characters_in_response_overrides_are_refused(gateway: Gateway, hostile_bucket: str) -> None:
    """A response-* override becomes a response header: one that cannot be
    sent is refused up front, not by the server once the answer is made."""
    assert send_signed(gateway, "PUT", f"/{hostile_bucket}/k", body=b"v").status == 200  # type: ignore[union-attr]
    for value in ["%0A", "a%0D%0Ab", "%01", "%7F"]:
        answer = send_signed(gateway, "GET", f"/{hostile_bucket}/k?response-content-type={value}")
        root = s3_error(answer, 400, "InvalidArgument")
        assert root.findtext("ArgumentName") == "response-content-type"
    got = send_signed(gateway, "GET", f"/{hostile_bucket}/k?response-content-type=text%2Fplain%3B%20a%09b")
    assert got is not None and got.status == 200 and got.headers["content-type"] == "text/plain; a\tb"


# -- a fuzzer of whole requests ---------------------------------------------------------

_NUMBERS = st.one_of(st.integers(-5, 20_000).map(str), st.sampled_from(["", "1e3", "٣", "9" * 30, "7" * 5000]))
_GARBAGE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\x7f"),
                   max_size=40)
_KEY_PARTS = st.sampled_from([
    "k", "a/../b", "..", "%00", "%ff", "%c3%28", "%ed%a0%80", "x" * 1100, "%C3%A9", "//x", "%0A", "a%2Fb",
    "%3F", "%25", "%2e%2e%2f", "",
])
_QUERY = st.lists(st.tuples(st.sampled_from([
    "list-type", "max-keys", "continuation-token", "encoding-type", "prefix", "delimiter", "start-after",
    "marker", "uploads", "uploadId", "partNumber", "part-number-marker", "max-parts", "delete", "acl",
    "versioning", "location", "versionId", "response-content-type", "response-expires", "tagging",
    "max-uploads", "key-marker", "fetch-owner", "versions", "X-Amz-Expires", "version-id-marker",
]), st.one_of(_NUMBERS, _GARBAGE, st.sampled_from(["2", "url", "null", "true", "%0A", "0000000000000001",
                                                   "000000000000000G", "ffffffffffffffff"])), st.booleans()),
    max_size=4)
_HEADERS = st.fixed_dictionaries({}, optional={
    "Range": st.one_of(st.builds(lambda a, b: f"bytes={a}-{b}", _NUMBERS, _NUMBERS), _GARBAGE),
    "If-Match": _GARBAGE, "If-None-Match": st.one_of(st.just("*"), _GARBAGE),
    "If-Modified-Since": st.one_of(_GARBAGE, st.just("Fri, 31 Dec 9999 23:59:59 -0100")),
    "Content-MD5": st.one_of(_GARBAGE, st.just("1B2M2Y8AsgTpgAmY7PhCfg==")),
    "x-amz-checksum-crc32": st.one_of(_GARBAGE, st.just("AAAAAA==")),
    "x-amz-copy-source": st.one_of(_GARBAGE, st.sampled_from(["/b/k", "%ff/%fe", "b/k?versionId=3", "/",
                                                              "b/k?versionId=", "b/k?versionId=0000000000000001"])),
    "x-amz-mfa": st.one_of(_GARBAGE, st.just("123 456")),
    "x-amz-copy-source-range": st.one_of(st.builds(lambda a, b: f"bytes={a}-{b}", _NUMBERS, _NUMBERS), _GARBAGE),
    "x-amz-meta-a": _GARBAGE, "x-amz-meta-big": st.just("v" * 3000), "Content-Type": _GARBAGE,
    "x-amz-decoded-content-length": _NUMBERS, "x-amz-trailer": _GARBAGE,
    "x-amz-metadata-directive": st.sampled_from(["COPY", "REPLACE", "x"]),
    "x-amz-checksum-algorithm": st.sampled_from(["CRC32", "MD5", ""]),
    "x-amz-tagging": st.one_of(_GARBAGE, st.sampled_from(["a=b&c", "a=1&a=2", "k=%ff", "aws:k=v", "a=b=c",
                                                          "&".join(f"k{i}=v" for i in range(11))])),
    "x-amz-tagging-directive": st.sampled_from(["COPY", "REPLACE", "x"]),
    "x-amz-server-side-encryption": st.one_of(_GARBAGE, st.sampled_from(["AES256", "aws:kms"])),
    "Expect": st.just("100-continue"),
})
_XML_BODIES = st.sampled_from([
    b"<Delete><Object><Key>k</Key></Object></Delete>",
    b"<CompleteMultipartUpload><Part><PartNumber>\xc2\xb2</PartNumber><ETag>e</ETag></Part>"
    b"</CompleteMultipartUpload>",
    b'<!DOCTYPE a [<!ENTITY e "x">]><Delete><Object><Key>&e;</Key></Object></Delete>',
    b"<Delete>" + b"<a>" * 50 + b"</a>" * 50 + b"</Delete>",
    b"<Delete><Object><Key>\x01</Key></Object></Delete>",
    b"<Delete><Object><Key>k</Key><ETag>x</ETag></Object></Delete>",
    b"<Tagging><TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet></Tagging>",
    b"<VersioningConfiguration><Status>Enabled</Status></VersioningConfiguration>",
    b"<VersioningConfiguration><Status>Suspended</Status><MfaDelete>Enabled</MfaDelete></VersioningConfiguration>",
    b"<VersioningConfiguration><Status>Off</Status></VersioningConfiguration>",
    b"<Delete><Object><Key>k</Key><VersionId>0000000000000001</VersionId></Object>"
    b"<Object><Key>k</Key><VersionId></VersionId></Object></Delete>",
    b"<Tagging><TagSet><Tag><Key>k</Key><Value>v</Value></Tag><Tag><Key>k</Key><Value/></Tag></TagSet></Tagging>",
    b"<Tagging><TagSet><Tag><Key>aws:x</Key><Value>v</Value></Tag></TagSet></Tagging>",
    b"<Tagging><TagSet><Tag><Key>k\x01</Key><Value>v</Value></Tag></TagSet></Tagging>",
    b"<Tagging><TagSet><Tag><Key>k</Key></Tag></TagSet></Tagging>",
    b"<Tagging>" + b"<TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet>" * 2 + b"</Tagging>",
])
_BODIES = st.one_of(st.just(b""), st.binary(max_size=200), _XML_BODIES)


@st.composite
def requests(draw: st.DrawFn, bucket: str) -> tuple[str, str, dict[str, str], bytes, str | None]:
    method = draw(st.sampled_from(["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH", "G3T"]))
    where = draw(st.sampled_from([bucket, bucket, "no-such-bucket-fuzz", "Bad_Name", "", "%2e%2e"]))
    key = "/".join(draw(st.lists(_KEY_PARTS, max_size=3)))
    path = f"/{where}/{key}" if where and key else f"/{where}"
    query = "&".join(quote(n, safe="-_.~") + (f"={quote(v, safe='-_.~%')}" if eq else "")
                     for n, v, eq in draw(_QUERY))
    payload_hash = draw(st.sampled_from([None, "UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
                                         "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "0" * 64]))
    return method, path + (f"?{query}" if query else ""), draw(_HEADERS), draw(_BODIES), payload_hash


_FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_FUZZ
@given(data=st.data())
def test_fuzzed_signed_requests_get_client_errors(gateway: Gateway, hostile_bucket: str,
                                                  data: st.DataObject) -> None:
    """Correctly signed, so that each gets past authentication to the
    handlers; hostile in everything else."""
    method, target, headers, body, payload_hash = data.draw(requests(hostile_bucket))
    TRIED["signed"] += 1
    raw = signed_bytes(gateway, method, target, headers, body, payload_hash=payload_hash)
    sound(exchange(gateway, raw, head_only=method == "HEAD"), method)


_AUTH = st.one_of(
    _GARBAGE,
    st.builds(lambda c, s, sig: f"AWS4-HMAC-SHA256 Credential={c}, SignedHeaders={s}, Signature={sig}",
              st.sampled_from(["tierstore-test-key/20240101/us-east-1/s3/aws4_request", "x", "a/b/c/d/e"]),
              st.sampled_from(["host", "", ";;", "host;x-amz-date"]), _GARBAGE),
    st.builds(lambda a, s: f"AWS {a}:{s}", st.sampled_from(["tierstore-test-key", ""]), _GARBAGE),
)
_AUTH_QUERY = st.sampled_from([
    "", "X-Amz-Algorithm=AWS4-HMAC-SHA256", "AWSAccessKeyId=tierstore-test-key&Signature=x&Expires=" + "9" * 5000,
    "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=k%2F20240101%2Fus-east-1%2Fs3%2Faws4_request"
    "&X-Amz-Date=20240101T000000Z&X-Amz-Expires=" + "1" * 5000 + "&X-Amz-SignedHeaders=host&X-Amz-Signature=0",
    "AWSAccessKeyId=%FF&Signature=x&Expires=99999999999",
])


@_FUZZ
@given(data=st.data())
def test_fuzzed_unsigned_requests_get_client_errors(gateway: Gateway, hostile_bucket: str,
                                                    data: st.DataObject) -> None:
    """Authentication itself under attack: garbled Authorization headers,
    presigned-URL parameters and dates."""
    method, target, headers, body, _ = data.draw(requests(hostile_bucket))
    TRIED["unsigned"] += 1
    auth_query = data.draw(_AUTH_QUERY)
    if auth_query:
        target += ("&" if "?" in target else "?") + auth_query
    headers = {**headers, "Host": gateway.endpoint.removeprefix("http://"), "Content-Length": str(len(body))}
    if data.draw(st.booleans()):
        headers["Authorization"] = data.draw(_AUTH)
    for name in ("x-amz-date", "Date"):
        if data.draw(st.booleans()):
            headers[name] = data.draw(st.one_of(_GARBAGE, st.just("Fri, 31 Dec 9999 23:59:59 -0100")))
    sound(exchange(gateway, request_bytes(method, target, headers, body), head_only=method == "HEAD"), method)


# -- XML bodies: bombs and sizes ---------------------------------------------------------


def _bombs() -> dict[str, bytes]:
    laughs = b"".join(b'<!ENTITY %c "%s">' % (98 + i, (b"&%c;" % (97 + i)) * 10) for i in range(9))
    return {
        "billion laughs": b'<?xml version="1.0"?><!DOCTYPE Delete [<!ENTITY a "aaaaaaaaaa">' + laughs
                          + b"]><Delete><Object><Key>&j;</Key></Object></Delete>",
        "external entity": b'<!DOCTYPE Delete [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
                           b"<Delete><Object><Key>&x;</Key></Object></Delete>",
        "deep nesting": b"<Delete>" + b"<Object>" * 100_000 + b"</Object>" * 100_000 + b"</Delete>",
        "many elements": b"<Delete><Object><Key>k</Key></Object>" + b"<x/>" * 480_000 + b"</Delete>",
    }


def peak_rss(gw: Gateway) -> int:
    assert gw.proc is not None
    status = Path(f"/proc/{gw.proc.pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def slow_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway of this module's own, with a short client_timeout."""
    root = tmp_path_factory.mktemp("hostile")
    config = root / "tierstore.toml"
    config.write_text(f"client_timeout = {CLIENT_TIMEOUT}\n")
    with running_gateway(root / "data", "--config", str(config)) as gw:
        send_signed(gw, "PUT", "/slow")
        yield gw
    assert "Traceback" not in gw.log(), gw.log()[-5000:]


def test_xml_bombs_are_malformed_in_bounded_memory(slow_gateway: Gateway) -> None:
    """Billion laughs, external entities, deep nesting and a body of half a
    million elements: each 400 MalformedXML, and the gateway's peak memory
    does not grow by more than a fraction of what building those trees would
    take (a tree of half a million elements is ~60 MiB on its own)."""
    gw = slow_gateway
    upload = send_signed(gw, "POST", "/slow/bomb?uploads")
    assert upload is not None and upload.status == 200
    upload_id = ET.fromstring(upload.body).findtext("{*}UploadId")
    baseline = peak_rss(gw)
    for name, body in _bombs().items():
        for target in ["/slow?delete", f"/slow/bomb?uploadId={upload_id}"]:
            answer = send_signed(gw, "POST", target, {"Content-MD5": _md5(body)}, body)
            s3_error(answer, 400, "MalformedXML")
    assert peak_rss(gw) - baseline < 32 * MiB, (baseline, peak_rss(gw))
    healthy(gw)


def _md5(body: bytes) -> str:
    return base64.b64encode(hashlib.md5(body).digest()).decode()


@pytest.mark.parametrize(("target", "cap"), [("/{b}?delete", 2 * MiB), ("/{b}/k?uploadId=u", 4 * MiB),
                                              ("/{b}", 64 * 1024)])
def test_xml_bodies_past_their_cap_are_refused(gateway: Gateway, hostile_bucket: str, target: str,
                                               cap: int) -> None:
    """The caps (DeleteObjects 2 MiB, CompleteMultipartUpload 4 MiB,
    CreateBucket and ACL bodies 64 KiB): a declared length past the cap is
    refused before the body is sent; a body that turns out longer is refused
    once the cap is passed."""
    path = target.format(b=hostile_bucket)
    method = "PUT" if path == f"/{hostile_bucket}" else "POST"
    head = signed_bytes(gateway, method, path, {"Expect": "100-continue"}, length=10 * 1024 * MiB,
                        payload_hash="UNSIGNED-PAYLOAD")
    s3_error(exchange(gateway, head), 400, "MaxMessageLengthExceeded")
    body = b"<Delete>" + b" " * cap + b"</Delete>"
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[i:i + MiB] for i in range(0, len(body), MiB)))
    head = signed_bytes(gateway, method, path, payload_hash="UNSIGNED-PAYLOAD").replace(
        b"Content-Length: 0\r\n", b"Transfer-Encoding: chunked\r\n")
    answer = exchange(gateway, head + chunked + b"0\r\n\r\n")
    if answer is not None:  # or reset: the client was still sending what the server will not read
        s3_error(answer, 400, "MaxMessageLengthExceeded")


# -- oversized request heads -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["1 MiB header", "10,000 headers", "100 KB URL", "70 KB header in one piece"])
def test_oversized_request_heads_are_refused(gateway: Gateway, log_offset: int, kind: str) -> None:
    host = {"Host": gateway.endpoint.removeprefix("http://")}
    data = {
        "1 MiB header": request_bytes("GET", "/", {**host, "X-Big": "a" * MiB}),
        "10,000 headers": request_bytes("GET", "/", {**host, **{f"X-H{i}": "v" for i in range(10_000)}}),
        "100 KB URL": request_bytes("GET", "/" + "a" * 100_000, host),
        "70 KB header in one piece": request_bytes("GET", "/", {**host, "X-Big": "a" * 70_000}),
    }[kind]
    answer = exchange(gateway, data)
    if answer is not None:  # or the connection was reset while the client still sent
        s3_error(answer, 400, "RequestHeaderSectionTooLarge")
    healthy(gateway)
    # A head just under the bound is a request like any other.
    sound(exchange(gateway, request_bytes("GET", "/", {**host, "X-Big": "a" * 60_000})), "GET")


# -- oversized and short bodies --------------------------------------------------------------


def test_body_longer_than_its_length_stores_only_the_declared_bytes(gateway: Gateway,
                                                                    hostile_bucket: str) -> None:
    """HTTP framing decides: what follows the declared length is the next
    request (here garbage, refused by the parser), never part of the object."""
    raw = signed_bytes(gateway, "PUT", f"/{hostile_bucket}/longer", body=b"declared")
    with connect(gateway) as sock:
        sock.sendall(raw + b"AND THEN SOME BYTES THAT ARE NOT A REQUEST\r\n\r\n")
        first = read_answer(sock)
        second = read_answer(sock) if first is not None and first.status == 200 else None
    sound(first, "PUT")
    sound(second, "PUT")
    got = send_signed(gateway, "GET", f"/{hostile_bucket}/longer")
    assert got is not None and (got.status == 404 or got.body == b"declared"), got


def test_chunked_body_shorter_than_its_decoded_length_is_incomplete(gateway: Gateway,
                                                                   hostile_bucket: str) -> None:
    staged = staged_files(gateway)
    framed = b"5\r\nhello\r\n0\r\n\r\n"
    answer = send_signed(gateway, "PUT", f"/{hostile_bucket}/short",
                         {"x-amz-decoded-content-length": "10", "Content-Encoding": "aws-chunked"}, framed,
                         payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    s3_error(answer, 400, "IncompleteBody")
    s3_error(send_signed(gateway, "GET", f"/{hostile_bucket}/short"), 404, "NoSuchKey")
    assert staged_files(gateway) <= staged  # no staged file left behind


@pytest.mark.parametrize("then", ["disconnects", "stalls"])
def test_a_body_that_stops_short_leaves_nothing(slow_gateway: Gateway, then: str) -> None:
    """A PUT whose body stops after 100 of its 1000 bytes: the client goes
    away (the request is dropped) or stays silent (400 RequestTimeout once
    client_timeout passes); either way no object and no staged file remain."""
    gw = slow_gateway
    staged = staged_files(gw)
    with connect(gw) as sock:
        sock.sendall(signed_bytes(gw, "PUT", f"/slow/{then}", length=1000, payload_hash="UNSIGNED-PAYLOAD")
                     + b"x" * 100)
        if then == "stalls":
            s3_error(read_answer(sock), 400, "RequestTimeout")
    _eventually(lambda: staged_files(gw) <= staged)
    s3_error(send_signed(gw, "GET", f"/slow/{then}"), 404, "NoSuchKey")


# -- slow clients ------------------------------------------------------------------------------


def _eventually(condition: object, limit: float = 10 * CLIENT_TIMEOUT) -> None:
    deadline = time.monotonic() + limit
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met within the bounded wait"
        time.sleep(0.05)


def _open_fds(gw: Gateway) -> int:
    assert gw.proc is not None
    return len(os.listdir(f"/proc/{gw.proc.pid}/fd"))


def _closed(sock: socket.socket) -> bytes | None:
    """What the server sent before closing ``sock``, or None while it is open."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return None
    sock.settimeout(5)
    data = b""
    try:
        while piece := sock.recv(65536):
            data += piece
    except (ConnectionResetError, BlockingIOError, TimeoutError):
        pass
    return data


def test_slowloris_connections_are_dropped_while_others_are_served(slow_gateway: Gateway) -> None:
    """Twenty connections that send nothing and twenty that trickle a head
    a byte at a time: each is closed within the bounded wait (the tricklers
    told 400 RequestTimeout), while a normal client is served meanwhile; the
    gateway's open descriptors fall back to where they were."""
    gw = slow_gateway
    fds = _open_fds(gw)
    idle = [connect(gw) for _ in range(20)]
    head = request_bytes("GET", "/slow/k", {"Host": "x", "X-Pad": "p" * 200})
    tricklers = [connect(gw) for _ in range(20)]
    closed: dict[int, bytes] = {}
    sent = 0
    try:
        while len(closed) < len(idle) + len(tricklers):
            for i, sock in enumerate(idle + tricklers):
                if i in closed:
                    continue
                if (data := _closed(sock)) is not None:
                    closed[i] = data
                elif sock in tricklers and sent < len(head):
                    sock.sendall(head[sent:sent + 1])
            sent += 1
            # A normal client, on connections of its own, is served meanwhile.
            if sent % 10 == 0:
                put = send_signed(gw, "PUT", "/slow/normal", body=b"%d" % sent)
                assert put is not None and put.status == 200
            assert sent < 10 * CLIENT_TIMEOUT / 0.02, f"{len(closed)} of 40 closed"
            time.sleep(0.02)
    finally:
        for sock in idle + tricklers:
            sock.close()
    assert sent < len(head), sent  # closed mid-head, not once it was complete
    assert all(closed[i] == b"" for i in range(len(idle))), "idle connections are closed silently"
    for i in range(len(idle), len(idle) + len(tricklers)):
        assert closed[i] == b"" or b"<Code>RequestTimeout</Code>" in closed[i], closed[i][:300]
    _eventually(lambda: _open_fds(gw) <= fds + 4)  # 40 were open; a few index files may be new
    got = send_signed(gw, "GET", "/slow/normal")
    assert got is not None and got.status == 200


def test_the_admin_port_bounds_slow_heads_too(slow_gateway: Gateway) -> None:
    """Same bound, uvicorn's plain-text answer (the admin API is not S3)."""
    with socket.create_connection(("127.0.0.1", slow_gateway.admin_port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        answer = read_answer(sock)
    assert answer is not None and answer.status == 400, answer
    assert b"timeout" in answer.body and "x-amz-request-id" not in answer.headers
    healthy(slow_gateway)


def test_a_slow_head_on_a_kept_alive_connection_is_dropped(slow_gateway: Gateway) -> None:
    gw = slow_gateway
    with connect(gw) as sock:
        sock.sendall(signed_bytes(gw, "GET", "/slow?list-type=2"))
        first = read_answer(sock)
        assert first is not None and first.status == 200
        sock.sendall(b"GET /slow HTTP/1.1\r\n")  # the next head never completes
        s3_error(read_answer(sock), 400, "RequestTimeout")


def test_a_slow_but_steady_body_is_stored(slow_gateway: Gateway) -> None:
    """The body bound is on silence, not on the whole transfer: a body that
    takes longer than client_timeout but never pauses that long is stored."""
    gw = slow_gateway
    body = b"0123456789" * 4
    with connect(gw) as sock:
        sock.sendall(signed_bytes(gw, "PUT", "/slow/steady", length=len(body), payload_hash="UNSIGNED-PAYLOAD"))
        for i in range(0, len(body), 10):  # 4 pieces, 1.4 x client_timeout in all
            time.sleep(CLIENT_TIMEOUT * 0.35)
            sock.sendall(body[i:i + 10])
        answer = read_answer(sock)
    assert answer is not None and answer.status == 200, answer
    got = send_signed(gw, "GET", "/slow/steady")
    assert got is not None and got.body == body


# -- the log ----------------------------------------------------------------------------------


def test_zz_no_traceback_logged(gateway: Gateway, log_offset: int) -> None:
    """Runs last in this module: nothing above became a 500 or a traceback."""
    log = gateway.log()[log_offset:]
    assert "Traceback" not in log, log[-5000:]
    assert "InternalError" not in log, log[-5000:]


@pytest.fixture(scope="module", autouse=True)
def _count_requests(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if any(TRIED.values()):
        summary.report(request.config, f"hostile requests tried: {TRIED['signed']} signed, "
                                       f"{TRIED['unsigned']} unsigned or garbled")
