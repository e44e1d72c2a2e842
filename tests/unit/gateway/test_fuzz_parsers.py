"""Hostile input for every request parser of the gateway: property tests.

Each parser that reads what a client sent (Range, HTTP dates and conditional
headers, the XML bodies, aws-chunked framing, SigV4 and SigV2 in headers and
query strings, x-amz-copy-source and its range, keys and bucket names, list
parameters, checksum headers, Content-MD5, the request line itself) is fed
arbitrary text or bytes. The property is always the same: it returns a value,
or it raises the module's S3Error (or a ``tiering.errors`` class) that the
gateway answers with a 4xx status and an error document that is well-formed
XML; never another exception, which the gateway would answer with 500. Where a
writer exists, what it writes parses back to what was written.

Examples per property: ``TIERSTORE_FUZZ_EXAMPLES`` (default 100, the CI
setting). A long run, about 20,000 inputs per property::

    TIERSTORE_FUZZ_EXAMPLES=20000 python -m pytest tests/unit/gateway/test_fuzz_parsers.py

The inputs tried are counted per parser and printed when the module ends.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tracemalloc
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from gateway import routes
from gateway.auth import sigv4
from gateway.auth.signing import AuthContext, split_query
from gateway.handlers import listing, multipart, objects
from gateway.s3 import body, headers, xml
from gateway.s3.chunked import MODES, SIGNED, SIGNED_TRAILER, UNSIGNED_TRAILER, AwsChunkedDecoder
from gateway.s3.errors import S3Error, to_s3_error
from gateway.s3.http import S3Request
from packer.ranges import ByteRange
from tests import summary
from tests.unit.gateway.test_chunked import build_signed, build_unsigned, crc32_b64, signer
from tests.unit.gateway.test_sigv4 import AK, KEYS, presigned, signed
from tiering.errors import NotModified, PreconditionFailed, TierstoreError
from tiering.meta import ObjectMeta
from tiering.model import checksums
from tiering.model.conditions import check
from tiering.model.names import MAX_KEY_BYTES, check_bucket_name, check_key
from tiering.model.tags import check_tags
from tiering.model.versions import version_id

EXAMPLES = int(os.environ.get("TIERSTORE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
TRIED: Counter[str] = Counter()
T = TypeVar("T")


@pytest.fixture(scope="module", autouse=True)
def _count_inputs(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if TRIED:
        parts = ", ".join(f"{name} {count}" for name, count in sorted(TRIED.items()))
        summary.report(request.config, f"fuzz inputs tried: {sum(TRIED.values())} ({parts})")


# -- the property -------------------------------------------------------------


def refused(exc: BaseException) -> S3Error:
    """What the client gets for a refused input: a 4xx (501 for what S3
    itself does not implement) whose XML error document parses."""
    assert isinstance(exc, (S3Error, TierstoreError)), f"{type(exc).__name__}: {exc}"
    err = to_s3_error(exc)
    assert 400 <= err.status < 500 or err.code == "NotImplemented", err
    # The path echoed as Resource may hold controls and undecodable bytes too.
    document = ET.fromstring(xml.error(err, "/bucket/\x01\udcff", "REQUESTID"))
    assert document.findtext("Code") == err.code
    return err


def outcome(name: str, call: Callable[..., T], *args: Any) -> T | S3Error:
    """``call(*args)``, or the S3Error it was refused with (checked)."""
    TRIED[name] += 1
    try:
        return call(*args)
    except (S3Error, TierstoreError) as exc:
        return refused(exc)


# -- strategies ---------------------------------------------------------------

# Header values as the server hands them over: bytes decoded as latin-1.
LATIN1 = st.text(st.characters(max_codepoint=0xFF), max_size=60)
# Anything Python can hold, lone surrogates included.
ANY_TEXT = st.text(st.characters(blacklist_categories=()), max_size=60)
# Numbers as clients write them, and as attackers do: signs, spaces, Unicode
# digits ("²" passes str.isdigit() but not int()), thousands of digits.
NUMBERS = st.one_of(
    st.integers(0, 10**20).map(str),
    st.text("0123456789", min_size=1, max_size=25),
    st.integers(4290, 4400).map(lambda n: "7" * n),
    st.sampled_from(["", " 1", "+1", "-1", "1_0", "²", "٣", "1e3", "0x10", "\x00", "1 ", "9" * 19]),
)
TOKENS = st.one_of(NUMBERS, LATIN1, ANY_TEXT)


def request(query: dict[str, str] | None = None, hdrs: dict[str, str] | None = None,
            method: str = "GET", path: str = "/bucket/key") -> S3Request:
    return S3Request(method=method, raw_path=path, path=path, raw_query="", query=query or {},
                     headers=hdrs or {}, receive=None, request_id="REQUESTID")


def meta(**fields: Any) -> ObjectMeta:
    base: dict[str, Any] = {"bucket": "bucket", "key": "key", "size": 10, "etag": "0" * 32,
                            "last_modified_ms": 1_700_000_000_000, "seq": 1}
    return ObjectMeta(**{**base, **fields})


# -- Range ----------------------------------------------------------------------

RANGES = st.one_of(
    LATIN1,
    st.builds(lambda a, b, sep: f"bytes={a}{sep}{b}", st.one_of(st.just(""), NUMBERS),
              st.one_of(st.just(""), NUMBERS), st.sampled_from(["-", " - ", "--", ",", "-0,0-"])),
    st.from_regex(r"\A\s*bytes\s*=\s*[0-9]{0,30}\s*-\s*[0-9]{0,30}\s*\Z"),
)


@FUZZ
@given(RANGES, st.integers(0, 2**40))
@example("bytes=" + "1" * 5000 + "-", 10)  # int() refuses more than 4,300 digits
@example("bytes=0-" + "9" * 5000, 10)
@example("bytes=-" + "9" * 5000, 10)
def test_range_returns_a_range_inside_the_object_or_416(header: str, size: int) -> None:
    got = outcome("Range", headers.parse_range, header, size)
    if isinstance(got, S3Error):
        assert got.code == "InvalidRange" and got.status == 416
    elif got is not None:
        assert 0 <= got.start < got.end <= size


@FUZZ
@given(st.integers(1, 10**12), st.integers(0, 10**13), st.integers(0, 10**13), st.sampled_from(["", " "]))
def test_range_round_trip(size: int, first: int, last: int, pad: str) -> None:
    TRIED["Range round trip"] += 1
    header = f"bytes={pad}{first}-{last}{pad}"
    if first > last:
        assert headers.parse_range(header, size) is None  # invalid: ignored, as S3 does
    elif first >= size:
        with pytest.raises(TierstoreError):
            headers.parse_range(header, size)
    else:
        assert headers.parse_range(header, size) == ByteRange(first, min(last + 1, size))
    if first == 0:
        with pytest.raises(TierstoreError):
            headers.parse_range(f"bytes=-{first}", size)
    else:
        assert headers.parse_range(f"bytes=-{first}", size) == ByteRange(max(0, size - first), size)


# -- HTTP dates and conditional headers ----------------------------------------

DATES = st.one_of(
    LATIN1,
    st.datetimes(timezones=st.just(UTC)).map(lambda d: headers.http_date(int(d.timestamp()))
                                              if d.year > 1970 else d.isoformat()),
    st.builds(lambda day, year, zone: f"Fri, {day} Dec {year} 23:59:59 {zone}",
              st.integers(0, 40), st.integers(0, 99999), st.sampled_from(["GMT", "-0100", "+2359", "-9999", "Z"])),
)


@FUZZ
@given(DATES)
@example("Fri, 31 Dec 9999 23:59:59 -0100")  # year 10000 in UTC
@example("Mon, 01 Jan 0001 00:00:00 +0100")
def test_http_date_is_seconds_or_ignored(value: str) -> None:
    got = outcome("HTTP date", headers.parse_http_date, value)
    assert got is None or isinstance(got, int)


@FUZZ
@given(st.integers(0, 253402300799))
def test_http_date_round_trip(seconds: int) -> None:
    TRIED["HTTP date round trip"] += 1
    assert headers.parse_http_date(headers.http_date(seconds)) == seconds


CONDITION_HEADERS = st.dictionaries(
    st.sampled_from(["if-match", "if-none-match", "if-modified-since", "if-unmodified-since"]),
    st.one_of(LATIN1, DATES, st.just("*"), st.just('"' + "0" * 32 + '"')), max_size=4)


@FUZZ
@given(CONDITION_HEADERS, st.booleans())
def test_conditions_hold_or_fail_with_412_or_304(hdrs: dict[str, str], for_copy: bool) -> None:
    TRIED["conditional headers"] += 1
    try:
        check(meta(), headers.conditions(hdrs), for_copy=for_copy)
    except (PreconditionFailed, NotModified) as exc:
        assert not (for_copy and isinstance(exc, NotModified))
        assert to_s3_error(exc).status in (304, 412)


# -- XML request bodies ---------------------------------------------------------

_TAGS = st.sampled_from([
    "Delete", "Object", "Key", "VersionId", "Quiet", "CompleteMultipartUpload", "Part", "PartNumber",
    "ETag", "ChecksumCRC32", "ChecksumSHA256", "ChecksumType", "CreateBucketConfiguration",
    "LocationConstraint", "Tagging", "TagSet", "Tag", "Value", "s3:Key", "x",
])
_NS = st.sampled_from(["", ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"', ' xmlns:s3="urn:x"', " a='1'"])
_TEXT = st.one_of(st.text(max_size=12).map(xml.esc), st.text(max_size=6), NUMBERS.map(lambda n: n[:40]),
                  st.sampled_from(["&amp;", "&e;", "&#0;", "&#x1;", "&#xd;", "<![CDATA[k]]>", "<!-- c -->",
                                   "<?pi x?>"]))


def _element(tag: str, ns: str, children: list[str]) -> str:
    return f"<{tag}{ns}>{''.join(children)}</{tag}>"


XML_TREES = st.recursive(_TEXT, lambda inner: st.builds(_element, _TAGS, _NS, st.lists(inner, max_size=4)),
                         max_leaves=25)
_PROLOGUES = st.sampled_from([
    "", '<?xml version="1.0" encoding="UTF-8"?>', "<?xml version='1.0' encoding='UTF-16'?>",
    "<?xml version='1.0' encoding='UTF-7'?>", "\ufeff", '<!DOCTYPE Delete [<!ENTITY e "k">]>',
    '<!DOCTYPE Delete SYSTEM "file:///etc/passwd">',
])
XML_BODIES = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda prologue, tree: (prologue + tree).encode("utf-8", "surrogatepass"), _PROLOGUES, XML_TREES),
)
XML_PARSERS = {"Delete": xml.parse_delete, "CompleteMultipartUpload": xml.parse_complete,
               "CreateBucketConfiguration": xml.parse_location_constraint, "Tagging": xml.parse_tagging,
               "VersioningConfiguration": xml.parse_versioning}


@FUZZ
@given(st.sampled_from(sorted(XML_PARSERS)), XML_BODIES)
@example("CompleteMultipartUpload", "<CompleteMultipartUpload><Part><PartNumber>\u00b2</PartNumber>"
         "<ETag>e</ETag></Part></CompleteMultipartUpload>".encode())  # "²".isdigit(), int("²") fails
@example("CompleteMultipartUpload", b"<CompleteMultipartUpload><Part><PartNumber>" + b"9" * 5000
         + b"</PartNumber><ETag>e</ETag></Part></CompleteMultipartUpload>")
@example("Delete", b"<?xml version='1.0' encoding='UTF-16'?><Delete/>")  # expat: ValueError
@example("Delete", b"<?xml version='1.0' encoding='F'?><Delete/>")  # expat: LookupError
@example("Delete", b'<!DOCTYPE Delete [<!ENTITY e "k">]><Delete><Object><Key>&e;</Key></Object></Delete>')
@example("Tagging", b"<Tagging><TagSet><Tag><Key>k</Key><Value/></Tag><Tag><Key>k</Key><Value>v</Value></Tag>"
         b"</TagSet></Tagging>")  # a key twice
@example("Tagging", b"<Tagging><TagSet><Tag><Key>k</Key></Tag></TagSet></Tagging>")  # no Value
@example("VersioningConfiguration", b"<VersioningConfiguration><Status>Enabled</Status>"
         b"<MfaDelete>Maybe</MfaDelete></VersioningConfiguration>")
@example("VersioningConfiguration", b"<VersioningConfiguration><Status>enabled</Status></VersioningConfiguration>")
@example("VersioningConfiguration", b"<VersioningConfiguration/>")
def test_xml_bodies_parse_or_are_malformed(kind: str, data: bytes) -> None:
    got = outcome(f"XML {kind}", XML_PARSERS[kind], data)
    if isinstance(got, S3Error):
        assert got.code == "MalformedXML" or (kind == "Tagging" and got.code == "InvalidTag"), got
    elif kind == "Delete":
        quiet, keys = got
        assert 1 <= len(keys) <= 1000 and all(isinstance(k, str) for k, _, _ in keys)
    elif kind == "Tagging":
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in got.items())
        # What the parser lets through is then held against S3's limits.
        outcome("tag set", check_tags, got)
    elif kind == "CompleteMultipartUpload":
        assert got and all(p.part_number >= 0 for p in got)
    elif kind == "VersioningConfiguration":
        status, mfa = got
        assert status in ("Enabled", "Suspended") and isinstance(mfa, bool)


# What XML 1.0 can carry (S3 keys outside it only travel URL-encoded).
XML_CHARS = st.one_of(st.sampled_from("\t\n\r"), st.characters(
    min_codepoint=0x20, blacklist_categories=("Cs",), blacklist_characters="\ufffe\uffff"))


@FUZZ
@given(st.lists(st.tuples(st.text(XML_CHARS, min_size=1, max_size=20),
                          st.sampled_from([None, "null", "00000000000000ff"]),
                          st.sampled_from([None, '"0123456789abcdef0123456789abcdef"', "*"])),
                min_size=1, max_size=8), st.booleans())
def test_delete_round_trip(wanted: list[tuple[str, str | None, str | None]], quiet: bool) -> None:
    TRIED["XML Delete round trip"] += 1
    items = "".join(f"<Object><Key>{xml.esc(k)}</Key>"
                    + (f"<VersionId>{v}</VersionId>" if v else "")
                    + (f"<ETag>{xml.esc(e)}</ETag>" if e else "") + "</Object>" for k, v, e in wanted)
    document = f'<Delete xmlns="{xml.NS}"><Quiet>{str(quiet).lower()}</Quiet>{items}</Delete>'
    assert xml.parse_delete(document.encode()) == (quiet, wanted)


@FUZZ
@given(st.lists(st.tuples(st.integers(1, 10000), st.text("0123456789abcdef", min_size=32, max_size=32),
                          st.sampled_from([None, ("CRC32", "AAAAAA=="), ("SHA256", "x" * 44)])),
                min_size=1, max_size=10))
def test_complete_round_trip(parts: list[tuple[int, str, tuple[str, str] | None]]) -> None:
    TRIED["XML CompleteMultipartUpload round trip"] += 1
    items = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>&quot;{etag}&quot;</ETag>"
                    + (f"<Checksum{c[0]}>{c[1]}</Checksum{c[0]}>" if c else "") + "</Part>"
                    for n, etag, c in parts)
    got = xml.parse_complete(f"<CompleteMultipartUpload>{items}</CompleteMultipartUpload>".encode())
    assert [(p.part_number, p.etag, (p.checksum_algorithm, p.checksum) if p.checksum else None) for p in got] == parts


def _nested(depth: int) -> bytes:
    return b"<Delete>" + b"<Object>" * depth + b"</Object>" * depth + b"</Delete>"


BOMBS = {
    "billion laughs": (b'<?xml version="1.0"?><!DOCTYPE Delete ['
                       b'<!ENTITY a "aaaaaaaaaa">'
                       + b"".join(b'<!ENTITY %c "%s">' % (98 + i, (b"&%c;" % (97 + i)) * 10) for i in range(9))
                       + b"]><Delete><Object><Key>&j;</Key></Object></Delete>"),
    "quadratic blowup": (b'<!DOCTYPE Delete [<!ENTITY a "' + b"x" * 50_000 + b'">]><Delete><Object><Key>'
                         + b"&a;" * 20_000 + b"</Key></Object></Delete>"),
    "external entity": (b'<?xml version="1.0"?><!DOCTYPE Delete [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
                        b"<Delete><Object><Key>&x;</Key></Object></Delete>"),
    "external DTD": (b'<!DOCTYPE Delete SYSTEM "http://127.0.0.1:1/x.dtd">'
                     b"<Delete><Object><Key>k</Key></Object></Delete>"),
    "parameter entity": (b'<!DOCTYPE Delete [<!ENTITY % p SYSTEM "http://127.0.0.1:1/p">%p;]>'
                         b"<Delete><Object><Key>k</Key></Object></Delete>"),
    "deep nesting": _nested(200_000),
    "a million elements": b"<Delete>" + b"<Object><Key>k</Key></Object>" + b"<x/>" * 1_000_000 + b"</Delete>",
}


@pytest.mark.parametrize("parse", [xml.parse_delete, xml.parse_complete, xml.parse_tagging, xml.parse_versioning],
                         ids=["Delete", "Complete", "Tagging", "Versioning"])
@pytest.mark.parametrize("name", sorted(BOMBS))
def test_xml_bombs_are_malformed_in_bounded_memory(name: str, parse: Callable[[bytes], object]) -> None:
    """No DTD is read (so no entity is expanded or fetched), and a tree
    deeper or larger than any S3 body is refused while it is parsed."""
    TRIED["XML bombs"] += 1
    tracemalloc.start()
    try:
        with pytest.raises(S3Error) as info:
            parse(BOMBS[name])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.code == "MalformedXML"
    assert peak < 32 * 1024 * 1024, peak  # the million-element tree alone would take ~100 MiB


# -- aws-chunked framing ----------------------------------------------------------


def _decode(mode: str, data: bytes, cuts: list[int]) -> bytes | S3Error:
    decoder = AwsChunkedDecoder(mode, signer() if mode != UNSIGNED_TRAILER else None)
    out, last = bytearray(), 0
    try:
        for cut in [*sorted(cuts), len(data)]:
            for piece in decoder.feed(data[last:cut]):
                out += piece
            last = cut
        decoder.finish()
    except S3Error as exc:
        with pytest.raises(S3Error):  # a failed decoder stays failed
            decoder.feed(b"0\r\n")
        return refused(exc)
    return bytes(out)


CHUNKED_GARBAGE = st.one_of(
    st.binary(max_size=400),
    st.lists(st.sampled_from([b"0", b"5", b"ffffffffffffffff", b";chunk-signature=", b"0" * 64, b"\r\n", b"\n",
                              b"hello", b"x-amz-checksum-crc32:", b"AAAAAA==", b"x-amz-trailer-signature:",
                              b";", b"\r"]), max_size=40).map(b"".join),
)


@FUZZ
@given(st.sampled_from(sorted(MODES)), CHUNKED_GARBAGE, st.lists(st.integers(0, 400), max_size=8))
def test_chunked_garbage_is_refused_with_4xx(mode: str, data: bytes, cuts: list[int]) -> None:
    TRIED["aws-chunked garbage"] += 1
    got = _decode(mode, data, [c for c in cuts if c <= len(data)])
    if isinstance(got, S3Error):
        assert got.code in ("IncompleteBody", "InvalidRequest", "SignatureDoesNotMatch"), got


@FUZZ
@given(st.sampled_from([SIGNED, SIGNED_TRAILER, UNSIGNED_TRAILER]),
       st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=3), st.data())
def test_chunked_mutations_never_change_a_signed_payload(mode: str, chunks: list[bytes],
                                                         data: st.DataObject) -> None:
    TRIED["aws-chunked mutations"] += 1
    payload = b"".join(chunks)
    trailers = {"x-amz-checksum-crc32": crc32_b64(payload)}
    if mode == UNSIGNED_TRAILER:
        framed = build_unsigned(chunks, trailers)
    else:
        framed = build_signed(chunks, signer(), trailers if mode == SIGNED_TRAILER else None)
    at = data.draw(st.integers(0, len(framed) - 1))
    kind = data.draw(st.sampled_from(["flip", "drop", "insert", "truncate"]))
    byte = data.draw(st.integers(0, 255)).to_bytes(1, "big")
    mutated = {
        "flip": framed[:at] + bytes([framed[at] ^ (byte[0] or 1)]) + framed[at + 1:],
        "drop": framed[:at] + framed[at + 1:],
        "insert": framed[:at] + byte + framed[at:],
        "truncate": framed[:at],
    }[kind]
    got = _decode(mode, mutated, data.draw(st.lists(st.integers(0, len(mutated)), max_size=4)))
    if not isinstance(got, S3Error) and mode != UNSIGNED_TRAILER:
        assert got == payload  # only a signature hex digit's case can change unnoticed


# -- SigV4 and SigV2 --------------------------------------------------------------

_AMZ_DATE = st.one_of(st.just(datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")), st.from_regex(r"\A[0-9]{8}T[0-9]{6}Z\Z"),
                      LATIN1)
_CREDENTIAL = st.builds(lambda ak, date, region, service, term: f"{ak}/{date}/{region}/{service}/{term}",
                        st.sampled_from([AK, "", "other", "a/b"]), st.one_of(_AMZ_DATE.map(lambda d: d[:8]), LATIN1),
                        st.sampled_from(["us-east-1", "", "x"]), st.sampled_from(["s3", "ec2", ""]),
                        st.sampled_from(["aws4_request", "", "x"]))
_V4_HEADER = st.builds(
    lambda algorithm, credential, signed_headers, signature, sep: f"{algorithm} " + sep.join(
        [f"Credential={credential}", f"SignedHeaders={signed_headers}", f"Signature={signature}"]),
    st.sampled_from(["AWS4-HMAC-SHA256", "AWS4-ECDSA-P256-SHA256", "aws4-hmac-sha256", ""]), _CREDENTIAL,
    st.sampled_from(["host", "host;x-amz-date", "", ";", "host;;x", "x-amz-content-sha256;x-amz-date;host"]),
    st.one_of(st.text("0123456789abcdef", min_size=64, max_size=64), LATIN1), st.sampled_from([",", ", ", ",,", " "]))
_AUTH_VALUES = st.one_of(LATIN1, _V4_HEADER,
                         st.builds(lambda a, s: f"AWS {a}:{s}", st.sampled_from([AK, "", "x"]), LATIN1))
_HEADER_VALUES: dict[str, st.SearchStrategy[str]] = {
    "authorization": _AUTH_VALUES,
    "x-amz-date": _AMZ_DATE,
    "date": DATES,
    "x-amz-content-sha256": st.one_of(st.sampled_from(["UNSIGNED-PAYLOAD", *sorted(MODES), "e3b0" * 16,
                                                       "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD"]), LATIN1),
    "host": st.sampled_from(["127.0.0.1:9100", "bucket.s3.example.com", ""]),
    "content-md5": LATIN1, "content-type": LATIN1, "x-amz-meta-a": LATIN1, "x-amz-copy-source": LATIN1,
}
REQUEST_HEADERS = st.fixed_dictionaries({}, optional=_HEADER_VALUES)
_QUERY_NAMES = st.sampled_from([
    "X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders",
    "X-Amz-Signature", "x-amz-content-sha256", "AWSAccessKeyId", "Signature", "Expires", "acl", "uploadId",
    "partNumber", "response-content-type", "versionId", "%FF", "a+b", "",
])
_QUERY_VALUES = st.one_of(NUMBERS, LATIN1.map(lambda v: quote(v, safe="")), st.sampled_from(
    ["AWS4-HMAC-SHA256", AK, "%FF", "%", "%zz", "host", "99999999999", "604801", "0"]), _CREDENTIAL)
RAW_QUERIES = st.one_of(
    st.lists(st.tuples(_QUERY_NAMES, _QUERY_VALUES, st.booleans()), max_size=8).map(
        lambda items: "&".join(f"{n}={v}" if eq else n for n, v, eq in items)),
    st.text(st.characters(max_codepoint=0xFF), max_size=80),
)
RAW_PATHS = st.one_of(st.sampled_from(["/", "/bucket", "/bucket/", "/bucket/key", "//", "/bucket/a/../b"]),
                      st.text(st.characters(max_codepoint=0xFF), max_size=40).map(lambda p: "/" + p))
_NOW = datetime.now(UTC)


@FUZZ
@given(st.sampled_from(["GET", "PUT", "POST", "HEAD", "DELETE", "PATCH", ""]), RAW_PATHS, RAW_QUERIES,
       REQUEST_HEADERS, st.sampled_from(["", "bucket"]))
@example("GET", "/", "", {"authorization": f"AWS4-HMAC-SHA256 Credential={AK}/20240101/us-east-1/s3/aws4_request, "
                        "SignedHeaders=host, Signature=0", "date": "Fri, 31 Dec 9999 23:59:59 -0100", "host": "h"}, "")
@example("GET", "/", "", {"authorization": f"AWS {AK}:x", "date": "Fri, 31 Dec 9999 23:59:59 -0100"}, "")
@example("GET", "/", f"X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={AK}%2F20240101%2Fus-east-1%2Fs3%2F"
         "aws4_request&X-Amz-Date=20240101T000000Z&X-Amz-SignedHeaders=host&X-Amz-Signature=0&X-Amz-Expires="
         + "1" * 5000, {"host": "h"}, "")
@example("GET", "/", f"AWSAccessKeyId={AK}&Signature=x&Expires=" + "9" * 5000, {}, "")
@example("GET", "/", "AWSAccessKeyId=%FF&Signature=x&Expires=99999999999", {}, "")  # echoed undecodable
def test_authentication_of_any_request_passes_or_is_refused_with_4xx(
        method: str, path: str, query: str, hdrs: dict[str, str], host_bucket: str) -> None:
    got = outcome("SigV4/SigV2 any request", sigv4.authenticate, method, path, query, hdrs, KEYS.get,
                  _NOW, host_bucket)
    assert isinstance(got, (AuthContext, S3Error))


def _mutate(text: str, data: st.DataObject) -> str:
    at = data.draw(st.integers(0, len(text)))
    return text[:at] + data.draw(st.characters(max_codepoint=0xFF)) + text[at:]


def _canonical_value(value: str) -> str:
    return " ".join(value.split())


@FUZZ
@given(st.sampled_from(["header", "presigned"]), st.sampled_from(["method", "path", "query", "header"]), st.data())
def test_a_tampered_signed_request_is_refused(kind: str, part: str, data: st.DataObject) -> None:
    """A signature never covers a request that differs in anything it signs."""
    TRIED["SigV4 tampered request"] += 1
    if kind == "header":
        wire = signed("PUT", "/bucket/key", "partNumber=1&uploadId=u",
                      {"x-amz-meta-a": "v", "content-md5": "1B2M2Y8AsgTpgAmY7PhCfg=="})
    else:
        wire = presigned("GET", "/bucket/key", "response-content-type=a")
    method, path, query, hdrs = wire
    if part == "method":
        method = data.draw(st.sampled_from(["GET", "PUT", "POST", "HEAD", "DELETE"]).filter(lambda m: m != method))
    elif part == "path":
        path = _mutate(path, data)
    elif part == "query":
        query = _mutate(query, data)
        # "a=1&&b=2" and "a=1&b=2" are one canonical query.
        assume(sorted(split_query(query)) != sorted(split_query(wire[2])))
    else:
        name = data.draw(st.sampled_from(sorted(hdrs)))
        hdrs = {**hdrs, name: _mutate(hdrs[name], data)}
        assume(_canonical_value(hdrs[name]) != _canonical_value(wire[3][name]))
    with pytest.raises(S3Error) as info:
        sigv4.authenticate(method, path, query, hdrs, KEYS.get, datetime.now(UTC))
    refused(info.value)


# -- x-amz-copy-source and its range ------------------------------------------------

COPY_SOURCES = st.one_of(
    LATIN1,
    st.builds(lambda lead, b, k, q: f"{lead}{b}/{k}{q}", st.sampled_from(["", "/", "//"]),
              st.sampled_from(["bucket", "", "%FF", "b%00"]), st.one_of(LATIN1, st.just("%c3%28")),
              st.sampled_from(["", "?versionId=null", "?versionId=3", "?versionId=%FF", "?", "?versionId=",
                               "?versionId=00000000000000ff", "?versionId=00000000000000FF"])),
)


@FUZZ
@given(COPY_SOURCES)
@example("bucket/%c3%28")  # not UTF-8: names nothing (it used to become "\ufffd(")
@example("%ff/key")
def test_copy_source_names_an_object_or_is_refused(raw: str) -> None:
    got = outcome("x-amz-copy-source", objects.copy_source_name, raw)
    if not isinstance(got, S3Error):
        bucket, key, version = got
        assert bucket and key
        assert version is None or version == "null" or int(version, 16) >= 0


@FUZZ
@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60), st.sampled_from(["", "/"]),
       st.one_of(st.none(), st.just("null"), st.integers(1, 2**63).map(version_id)))
def test_copy_source_round_trip(key: str, lead: str, version: str | None) -> None:
    TRIED["x-amz-copy-source round trip"] += 1
    query = f"?versionId={version}" if version is not None else ""
    assert objects.copy_source_name(f"{lead}bucket/{quote(key, safe='/~')}{query}") == ("bucket", key, version)


@FUZZ
@given(st.one_of(LATIN1, st.builds(lambda a, b: f"bytes={a}-{b}", NUMBERS, NUMBERS)), st.integers(0, 2**40))
@example("bytes=0-\u00b2", 10)
@example("bytes=0-" + "9" * 5000, 10)
def test_copy_source_range_is_inside_the_source_or_refused(raw: str, size: int) -> None:
    got = outcome("x-amz-copy-source-range", multipart._copy_range, raw, size)
    if isinstance(got, S3Error):
        assert got.code in ("InvalidArgument", "InvalidRange"), got
    else:
        assert 0 <= got.start < got.end <= size


@FUZZ
@given(st.integers(0, 10**12), st.integers(0, 10**12), st.integers(1, 10**12))
def test_copy_source_range_round_trip(first: int, length: int, past: int) -> None:
    TRIED["x-amz-copy-source-range round trip"] += 1
    last = first + length
    assert multipart._copy_range(f"bytes={first}-{last}", last + past) == ByteRange(first, last + 1)


# -- keys and bucket names ------------------------------------------------------------


@FUZZ
@given(st.one_of(ANY_TEXT, st.integers(1020, 1030).map(lambda n: "k" * n), st.text(max_size=400)))
def test_keys_are_accepted_or_refused_with_400(key: str) -> None:
    got = outcome("object key", check_key, key)
    if isinstance(got, S3Error):
        assert got.code in ("InvalidArgument", "KeyTooLongError"), got
    else:
        assert key and "\x00" not in key


@FUZZ
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1,
               max_size=MAX_KEY_BYTES // 4))
def test_every_key_s3_accepts_is_accepted(key: str) -> None:
    TRIED["object key round trip"] += 1
    check_key(key)


@FUZZ
@given(st.one_of(ANY_TEXT, st.text("abz09.-", min_size=1, max_size=64), st.sampled_from(
    ["192.168.1.1", "xn--a", "a-s3alias", "a" * 63, "a" * 64, "a..b", "a.-b"])))
def test_bucket_names_are_valid_or_refused_with_400(name: str) -> None:
    got = outcome("bucket name", check_bucket_name, name)
    if isinstance(got, S3Error):
        assert got.code == "InvalidBucketName"
    else:
        assert 3 <= len(name) <= 63 and name == name.lower()


# -- list parameters ----------------------------------------------------------------------


@FUZZ
@given(st.sampled_from(["max-keys", "max-uploads", "max-parts"]), TOKENS)
def test_max_keys_is_a_page_size_or_refused(name: str, value: str) -> None:
    got = outcome("max-keys", listing.max_keys, request({name: value}), name)
    if not isinstance(got, S3Error):
        assert 0 <= got <= listing.MAX_KEYS


@FUZZ
@given(TOKENS)
def test_encoding_type_is_url_or_refused(value: str) -> None:
    got = outcome("encoding-type", listing.encoding_type, request({"encoding-type": value}))
    assert got in (None, "url") or isinstance(got, S3Error)


@FUZZ
@given(st.one_of(ANY_TEXT, st.binary(max_size=60).map(lambda b: base64.urlsafe_b64encode(b).decode())))
@example("AA==")  # decodes to NUL
def test_continuation_tokens_are_keys_or_refused(token: str) -> None:
    got = outcome("continuation-token", listing._untoken, token)
    if not isinstance(got, S3Error):
        assert got and "\x00" not in got


@FUZZ
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=200))
def test_continuation_token_round_trip(last: str) -> None:
    TRIED["continuation-token round trip"] += 1
    assert listing._untoken(listing._token(last)) == last


# -- versions: ?versionId=, version-id-marker, VersioningConfiguration ---------------


VERSION_IDS = st.one_of(TOKENS, st.integers(0, 2**64 - 1).map(version_id), st.just("null"),
                        st.text("0123456789abcdefABCDEF", min_size=15, max_size=17))


@FUZZ
@given(VERSION_IDS)
@example("")
@example("NULL")
@example("00000000000000fF")
def test_version_ids_are_well_formed_or_refused_with_400(value: str) -> None:
    got = outcome("versionId", objects.version_param, request({"versionId": value}))
    if isinstance(got, S3Error):
        assert got.code == "InvalidArgument" and got.status == 400, got
    else:
        assert got == "null" or version_id(int(got, 16)) == got


@FUZZ
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_version_ids_round_trip_in_version_order(a: int, b: int) -> None:
    TRIED["versionId round trip"] += 1
    assert objects.version_param(request({"versionId": version_id(a)})) == version_id(a)
    assert (version_id(a) < version_id(b)) == (a < b)


@FUZZ
@given(st.sampled_from(["Enabled", "Suspended"]), st.sampled_from([None, "Enabled", "Disabled"]),
       st.sampled_from(["", f' xmlns="{xml.NS}"']), st.sampled_from(["", " ", "\n"]))
def test_versioning_configuration_round_trip(status: str, mfa: str | None, ns: str, pad: str) -> None:
    TRIED["XML VersioningConfiguration round trip"] += 1
    body = (f"<VersioningConfiguration{ns}>{pad}<Status>{pad}{status}{pad}</Status>"
            + (f"<MfaDelete>{mfa}</MfaDelete>" if mfa else "") + "</VersioningConfiguration>")
    assert xml.parse_versioning(body.encode()) == (status, mfa == "Enabled")
    got = ET.fromstring(xml.versioning(status))
    assert [child.text for child in got] == [status]


# -- checksums, Content-MD5 and body framing headers ------------------------------------------

_CHECKSUM_NAMES = [*(checksums.header_name(a) for a in checksums.ALGORITHMS), "x-amz-checksum-md5",
                   "x-amz-checksum-", "x-amz-checksum-mode"]
_B64 = st.binary(max_size=33).map(lambda b: base64.b64encode(b).decode())
BODY_HEADERS = st.fixed_dictionaries({}, optional={
    "content-length": NUMBERS, "x-amz-decoded-content-length": NUMBERS,
    "content-md5": st.one_of(LATIN1, _B64), "x-amz-trailer": st.one_of(st.sampled_from(_CHECKSUM_NAMES), LATIN1),
    "x-amz-sdk-checksum-algorithm": st.one_of(st.sampled_from(checksums.ALGORITHMS), LATIN1),
    "content-encoding": st.sampled_from(["aws-chunked", "gzip", ""]),
    **{name: st.one_of(LATIN1, _B64) for name in _CHECKSUM_NAMES},
})
_PAYLOAD_HASHES = st.sampled_from(["UNSIGNED-PAYLOAD", *sorted(MODES), hashlib.sha256(b"").hexdigest(), "A" * 64])


@FUZZ
@given(BODY_HEADERS, st.one_of(st.none(), _PAYLOAD_HASHES))
@example({"x-amz-decoded-content-length": "\u00b2"}, UNSIGNED_TRAILER)
@example({"x-amz-decoded-content-length": "9" * 5000}, UNSIGNED_TRAILER)
def test_body_headers_give_a_stream_or_are_refused(hdrs: dict[str, str], payload_hash: str | None) -> None:
    req = request(hdrs=hdrs, method="PUT")
    if payload_hash is not None:
        req.auth = AuthContext(AK, payload_hash, b"k" * 32, "20240102T030405Z", "20240102/us-east-1/s3/aws4_request",
                               "0" * 64)
    got = outcome("body headers", body.prepare, req)
    if not isinstance(got, S3Error):
        _, integrity = got
        assert integrity.expected_size is None or integrity.expected_size >= 0


@FUZZ
@given(st.sampled_from(checksums.ALGORITHMS), st.one_of(LATIN1, ANY_TEXT, st.binary(max_size=40).map(
    lambda b: base64.b64encode(b).decode())))
def test_checksum_values_decode_or_are_refused(algorithm: str, value: str) -> None:
    got = outcome("x-amz-checksum-*", checksums.decode_digest, algorithm, value)
    if isinstance(got, S3Error):
        assert got.code == "InvalidRequest"


@FUZZ
@given(st.binary(min_size=16, max_size=16))
def test_content_md5_round_trip(digest: bytes) -> None:
    TRIED["Content-MD5 round trip"] += 1
    value = base64.b64encode(digest).decode()
    assert body.prepare(request(hdrs={"content-md5": value}))[1].content_md5 == value


# -- the request line, headers, routing and response overrides ------------------------------


def _scope(method: str, raw_path: bytes, query: bytes, hdrs: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": raw_path.decode("latin-1"), "raw_path": raw_path,
            "query_string": query, "headers": hdrs}


_RAW_BYTES = st.one_of(st.binary(max_size=40), st.sampled_from([b"%", b"%zz", b"%ff", b"%c3%28", b"%00", b"%2F",
                                                                b"..", b"//", b"+", b"%e2%82"]))


@FUZZ
@given(st.sampled_from(["GET", "PUT", "POST", "HEAD", "DELETE", "OPTIONS", "PROPFIND", "get"]),
       st.lists(_RAW_BYTES, max_size=6).map(lambda parts: b"/" + b"".join(parts)),
       st.lists(st.tuples(st.one_of(_QUERY_NAMES, st.sampled_from(sorted(routes.SUB_RESOURCES))),
                          _QUERY_VALUES), max_size=4).map(lambda q: "&".join(f"{n}={v}" for n, v in q).encode()),
       st.lists(st.tuples(st.sampled_from([b"host", b"x-amz-meta-a", b"range", b"Host"]),
                          st.binary(max_size=20)), max_size=4), st.sampled_from([None, "s3.example.com"]))
def test_requests_are_routed_or_refused(method: str, raw_path: bytes, query: bytes,
                                        hdrs: list[tuple[bytes, bytes]], domain: str | None) -> None:
    TRIED["request line and routing"] += 1
    try:
        req = S3Request.from_scope(_scope(method, raw_path, query, hdrs), None, "REQUESTID")
        routes.address(req, domain)
        route = routes.resolve(req)
    except (S3Error, TierstoreError) as exc:
        refused(exc)
    else:
        assert route.op and req.path.startswith("/")


_VALID_FIELD_VALUE = st.text(st.characters(max_codepoint=0xFF), max_size=30).filter(
    lambda v: all(c == "\t" or " " <= c != "\x7f" for c in v))


@FUZZ
@given(st.dictionaries(st.sampled_from(sorted(headers.RESPONSE_OVERRIDES)), st.one_of(st.text(max_size=30), LATIN1),
                       max_size=3),
       st.dictionaries(st.sampled_from(["content-disposition", "cache-control"]), _VALID_FIELD_VALUE, max_size=2),
       st.dictionaries(st.text("abcdefghij-", min_size=1, max_size=8), _VALID_FIELD_VALUE, max_size=3))
@example({"response-content-type": "a\nb"}, {}, {})  # the server would refuse to send it
def test_response_headers_are_valid_http_or_the_override_is_refused(
        query: dict[str, str], stored: dict[str, str], user: dict[str, str]) -> None:
    got = outcome("response-* overrides", headers.object_headers, meta(headers=stored, user_meta=user), query)
    if isinstance(got, S3Error):
        assert got.code == "InvalidArgument" and got.fields["ArgumentName"] in headers.RESPONSE_OVERRIDES
        return
    for name, value in got:
        value.encode("latin-1")
        assert all(c == "\t" or " " <= c != "\x7f" for c in value), (name, value)


_TAGGING = st.one_of(
    LATIN1,
    st.lists(st.tuples(ANY_TEXT, ANY_TEXT), max_size=12).map(
        lambda pairs: "&".join(f"{quote(k, errors='replace')}={quote(v, errors='replace')}" for k, v in pairs)),
)


@FUZZ
@given(st.fixed_dictionaries({}, optional={"x-amz-meta-a": LATIN1, "x-amz-meta-b": st.text(max_size=3000),
                                           "content-type": LATIN1, "content-encoding": LATIN1,
                                           "if-none-match": LATIN1, "if-match": LATIN1, "x-amz-tagging": _TAGGING,
                                           "x-amz-server-side-encryption": st.one_of(
                                               st.sampled_from(["AES256", "aws:kms", "aws:kms:dsse"]), LATIN1),
                                           "x-amz-server-side-encryption-customer-key": LATIN1}))
@example({"x-amz-tagging": "TagSet=[{Key=string,Value=string}]"})  # one pair, three '='
@example({"x-amz-tagging": "a=%FF"})  # not UTF-8 once decoded
@example({"x-amz-tagging": "a=1&a=2"})
def test_write_headers_are_taken_or_refused(hdrs: dict[str, str]) -> None:
    got = outcome("write headers", headers.new_object, hdrs)
    if isinstance(got, S3Error):
        assert got.code in ("MetadataTooLarge", "InvalidArgument", "NotImplemented"), got
    else:
        outcome("tag set", check_tags, got.tags)
    outcome("write conditions", objects.write_conditions, request(hdrs=hdrs, method="PUT"))


_TAG_CHARS = st.characters(categories=("L", "N", "Zs"), exclude_characters="\ufffe\uffff") | st.sampled_from("_.:/=+-@")


@FUZZ
@given(st.dictionaries(st.text(_TAG_CHARS, min_size=1, max_size=128).filter(lambda k: not k.startswith("aws:")),
                       st.text(_TAG_CHARS, max_size=256), max_size=10))
def test_tag_sets_round_trip(tags: dict[str, str]) -> None:
    """Any tag set within S3's limits goes through both of its forms, the
    Tagging document and the x-amz-tagging header, and is accepted."""
    TRIED["tagging round trip"] += 1
    check_tags(tags)
    assert xml.parse_tagging(xml.tagging(tags)) == tags
    header = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in tags.items())
    assert headers.tagging(header) == tags


@pytest.mark.parametrize(("tags", "code"), [
    ({f"k{i}": "v" for i in range(11)}, "BadRequest"),
    ({"k" * 129: "v"}, "InvalidTag"),
    ({"k": "v" * 257}, "InvalidTag"),
    ({"\U00020000" * 65: "v"}, "InvalidTag"),  # 65 characters, 130 UTF-16 code units
    ({"": "v"}, "InvalidTag"),
    ({"aws:k": "v"}, "InvalidTag"),
    ({"k": "a\nb"}, "InvalidTag"),
    ({"k{": "v"}, "InvalidTag"),
])
def test_tag_sets_past_s3_limits_are_refused(tags: dict[str, str], code: str) -> None:
    TRIED["tag limits"] += 1
    with pytest.raises(TierstoreError) as info:
        check_tags(tags)
    assert to_s3_error(info.value).code == code


def test_tag_sets_at_s3_limits_are_accepted() -> None:
    check_tags({f"k{i}": "v" for i in range(9)} | {"k" * 128: "v" * 256})
    check_tags({"\U00020000" * 64: "\u00e9 +-=._:/@ 1"})


# -- error documents -------------------------------------------------------------------------


@FUZZ
@given(ANY_TEXT, ANY_TEXT, ANY_TEXT)
def test_every_error_document_is_well_formed_xml(message: str, key: str, resource: str) -> None:
    TRIED["error documents"] += 1
    err = S3Error("NoSuchKey", message or None, Key=key)
    document = ET.fromstring(xml.error(err, resource, "REQUESTID"))
    assert document.findtext("Code") == "NoSuchKey"
    if all(c in "\t\n" or " " <= c <= "\ud7ff" or "\ue000" <= c <= "\ufffd" or c > "\uffff" for c in key):
        assert document.findtext("Key") == key
