"""Hostile request bodies through every body-taking route of one real
gateway, on both ports: property tests (issue 42, "Hostile input").

The parsers themselves are fuzzed in ``tests/unit/gateway/test_fuzz_parsers.py``;
this module drives whole requests through the running process, so that what
lies between the socket and the parser (body reading, size limits, digests,
FastAPI's JSON decoding and pydantic's validation, the handlers after the
parse, background jobs started by a body) is exercised too.

Routes: on the S3 port CreateBucket, DeleteObjects (on a plain and on a
versioned bucket), CompleteMultipartUpload (a new upload per example, with
and without a CRC32 checksum, so that a body can complete it),
PutObjectTagging, PutBucketVersioning, PutBucketAcl, PutObjectAcl, GetBatch
(JSON), PutBucketPolicy, and body-taking operations the gateway does not
implement (PutBucketTagging, PutBucketLifecycleConfiguration,
RestoreObject); on the admin port every route whose OpenAPI schema has a
request body (POST /buckets, PATCH /buckets/{name}, POST /mounts, POST
/jobs/warm|pin|evict|compact, POST /epochs, POST /users, PATCH
/users/{name}, PUT /policies/{name}) and POST /jobs/flush, which takes
none. Policy documents (PutBucketPolicy, PUT /policies/{name}) are also
drawn statement by statement (``test_policy_documents``): taken, or
MalformedPolicy, never a 500. S3 bodies are sent signed (SHA-256 of the body, or
UNSIGNED-PAYLOAD), some with Content-MD5 or x-amz-checksum-crc32.

Bodies: JSON (the admin API, GetBatch) and XML (the S3 bodies), each built
from a valid template of the route and then damaged one way per example:

* deep nesting (``[[[[...`` / ``{"a":{"a":...`` / ``<a><a>...`` up to 100,000
  levels), as the whole body or as one field's value;
* huge arrays (up to 1,000,001 items) and repeated XML items (up to 20,000);
* wrong types (a number for a string, a list for a flag, 10**40, NaN and
  Infinity as Python's json writes them, ...) and unknown fields;
* lone surrogates written as JSON ``\\ud800`` escapes, as XML character
  references, and as raw bytes (``ED A0 80``), and raw invalid UTF-8
  (``FF``, overlong ``C0 80``, truncated sequences, > U+10FFFF);
* control characters, raw and escaped; DOCTYPEs, entities, odd encodings;
* arbitrary and truncated bytes.

The property, per response: no 5xx except 501 (what S3 does not implement),
503 with Retry-After, and a mount's documented 502 SourceUnavailable (its
source is a closed local port here); an error has the documented error body
(S3: an XML <Error> with Code, Message and the RequestId of the
x-amz-request-id header; admin: ``{"error": {"code", "message"}}`` with the
code's own status). After the run the gateway still answers, and its log
holds no traceback.

Besides the drawn examples, ``test_classic_bodies`` sends a fixed list of
the worst of each class to every route on every run, and
``test_unread_body_then_next_request`` pins down a connection bug the fuzzer
found (a body the admin route never read spoiling the next request).

Examples per route: ``TIERSTORE_FUZZ_BODY_EXAMPLES`` (default 60, the CI
setting); derandomized, so a run is repeatable. The inputs tried are counted
per route and printed when the module ends.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import time
import xml.etree.ElementTree as ET
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.admin.errors import CODES
from tests import summary
from tests.conftest import assert_consistent
from tests.integration.s3raw import Answer, Sender, read_answer
from tests.servers import ADMIN_TOKEN, Gateway

EXAMPLES = int(os.environ.get("TIERSTORE_FUZZ_BODY_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same inputs on every run (and no example database)
    suppress_health_check=list(HealthCheck),
)
TRIED: Counter[str] = Counter()
NS = "http://s3.amazonaws.com/doc/2006-03-01/"

S3_BUCKET = "fuzz-s3"  # holds the tagged object and the multipart upload
VERSIONED = "fuzz-ver"  # PutBucketVersioning's
CREATED = "fuzz-create"  # CreateBucket's (re-created: 200 in us-east-1)
ADMIN_BUCKET = "fuzz-admin"  # what the admin bodies name
FUZZ_USER = "fz-user"  # the user PATCH /users/{name} changes
OBJECT = "tagged"
UPLOAD_KEY = "mpu"
CLOSED = "http://127.0.0.1:1"  # a mount source that never answers (a privileged port nothing listens on)


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def _crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


PART = b"p" * 100  # the one part of every upload CompleteMultipartUpload is fuzzed on
PART_ETAG = hashlib.md5(PART).hexdigest()


# -- the gateway --------------------------------------------------------------


@dataclass
class World:
    gw: Gateway
    s3: Sender
    admin: httpx.Client

    def new_upload(self, checksum: bool) -> str:
        """A new upload of ``UPLOAD_KEY`` with PART as part 1 (and a CRC32
        checksum if asked): a template body can complete it."""
        headers = {"x-amz-checksum-algorithm": "CRC32"} if checksum else {}
        created = self.s3.signed("POST", f"/{S3_BUCKET}/{UPLOAD_KEY}?uploads", headers)
        assert created.status_code == 200, created.text
        upload_id = ET.fromstring(created.content).findtext(f"{{{NS}}}UploadId")
        assert upload_id
        headers = {"x-amz-checksum-crc32": _crc32(PART)} if checksum else {}
        part = self.s3.signed("PUT", f"/{S3_BUCKET}/{UPLOAD_KEY}?partNumber=1&uploadId={upload_id}", headers, PART)
        assert part.status_code == 200, part.text
        return upload_id


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One gateway for the whole module, with the buckets and the object
    the S3 bodies name."""
    gw = Gateway(
        tmp_path_factory.mktemp("fuzz-bodies") / "data",
        # A fuzzed mount body must never send the gateway to AWS for keys.
        extra_env={"AWS_EC2_METADATA_DISABLED": "true"},
    ).start()
    s3 = Sender(gw)
    admin = httpx.Client(base_url=gw.admin_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                         timeout=120.0)
    try:
        for bucket in (S3_BUCKET, VERSIONED):
            assert s3.signed("PUT", f"/{bucket}").status_code == 200
        assert s3.signed("PUT", f"/{S3_BUCKET}/{OBJECT}", body=b"tagged bytes").status_code == 200
        enable = f'<VersioningConfiguration xmlns="{NS}"><Status>Enabled</Status></VersioningConfiguration>'
        assert s3.signed("PUT", f"/{VERSIONED}?versioning", body=enable.encode()).status_code == 200
        for key in ("gone", "x/y"):  # versions and a delete marker for DeleteObjects (versioned) to meet
            assert s3.signed("PUT", f"/{VERSIONED}/{key}", body=b"v1").status_code == 200
            assert s3.signed("DELETE", f"/{VERSIONED}/{key}").status_code == 204
        made = admin.post("/buckets", json={"name": ADMIN_BUCKET})
        assert made.status_code == 201, made.text
        made = admin.post("/users", json={"name": FUZZ_USER, "key": False})
        assert made.status_code == 201, made.text
        yield World(gw, s3, admin)
    finally:
        s3.close()
        admin.close()
        gw.stop()
    assert_consistent(gw)


@pytest.fixture(scope="module", autouse=True)
def _count_inputs(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if TRIED:
        parts = ", ".join(f"{name} {n}" for name, n in sorted(TRIED.items()))
        summary.report(request.config, f"body fuzz inputs tried: {sum(TRIED.values())} ({parts})")


# -- hostile text, the same for both formats ----------------------------------

# Stands for raw invalid UTF-8 in a string: replaced, once the body is
# encoded, by one of BAD_BYTES (a private-use character no template holds).
MARK = "\U000f0000"
BAD_BYTES = [
    b"\xff", b"\xfe\xff", b"\x80", b"\xc0\x80", b"\xc1\xbf",  # never valid; overlong NUL
    b"\xed\xa0\x80", b"\xed\xbf\xbf",  # lone surrogates as raw (CESU-8) bytes
    b"\xe2\x82", b"\xf0\x9f\x98",  # sequences cut short
    b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80",  # above U+10FFFF; 5-byte form
]
CHARS = st.one_of(
    st.characters(blacklist_categories=()),  # anything, lone surrogates included
    st.integers(0, 0x1F).map(chr),  # C0 controls
    st.integers(0xD800, 0xDFFF).map(chr),  # lone surrogates
    st.sampled_from(list("\x7f\x85\u2028\u2029\ufeff\ufffe\uffff\u202e{}[],.*?/\\\"'<>&;:=%# ") + [MARK]),
)
SPECIAL = st.sampled_from([
    "", " ", "\x00", "\ud800", "\udfff", "a\ud800b", "\udc80\udcff", "\x00\x01\x1f", "\t\r\n", "/", "//",
    "../../etc/passwd", "a" * 1025, "\u00e9" * 600, "k" * 70_000, "{0..99999999}", "{a,{b,{c,{d,{e,{f,{g,{h,{i,j}}}}}}}}}",
    "{0..9}{0..9}{0..9}{0..9}{0..9}{0..9}{0..9}{0..9}", "s3://other/k", f"s3://{ADMIN_BUCKET}/k", "%00", "%ff",
    "NaN", "-1", "1e999", "null", "true", MARK, "a" + MARK + "b",
])
TEXT = st.one_of(st.text(CHARS, max_size=40), SPECIAL)
NUMBERS = st.sampled_from([
    "", " ", "0", "-1", "+1", "1 ", " 1", "1.5", "1e3", "0x10", "\u00b2", "\u0663", "10001", "2147483648",
    "9" * 19, "9" * 400, "1_0", "NaN", "true", "Enabled", "enabled", "Suspended ", "\ud800",
])


class Body(bytes):
    """A request body whose repr (in hypothesis' report of a failing
    example) is cut short: some are megabytes long."""

    def __repr__(self) -> str:
        if len(self) <= 2000:
            return bytes.__repr__(self)
        return f"{bytes.__repr__(self[:1000])} + ... ({len(self):,} bytes) ... + {bytes.__repr__(self[-200:])}"


@dataclass(frozen=True)
class Raw:
    """Text written into a body as it is (deep nesting, huge arrays)."""

    text: str


def nested_json(depth: int, kind: str) -> Raw:
    if kind == "list":
        return Raw("[" * depth + "]" * depth)
    if kind == "dict":
        return Raw('{"a":' * depth + "0" + "}" * depth)
    return Raw('[{"a":' * (depth // 2) + "0" + "}]" * (depth // 2))


DEPTHS = st.sampled_from([20, 200, 1000, 5000, 100_000])
DEEP_JSON = st.builds(nested_json, DEPTHS, st.sampled_from(["list", "dict", "mixed"]))
SIZES = st.sampled_from([1001, 10_001, 100_001, 1_000_001])
HUGE_JSON = st.builds(
    lambda n, item: Raw("[" + ",".join([item] * n) + "]"),
    SIZES, st.sampled_from(['"k"', "0", "null", "[]", '"\\ud800"']),
)


# -- JSON ---------------------------------------------------------------------

LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(),
    st.sampled_from([10**40, -(10**40), 2**63, -(2**63) - 1, 2**31, 0, -1]),
    st.just(Raw("9" * 4400)),  # past int()'s default limit of 4300 digits
    st.floats(allow_nan=True, allow_infinity=True),  # NaN and Infinity as json writes them
    TEXT,
)
def _containers(kids: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(kids, max_size=5), st.dictionaries(TEXT, kids, max_size=5))


VALUES = st.recursive(LEAVES, _containers, max_leaves=20)
HOSTILE_VALUES = st.one_of(VALUES, VALUES, DEEP_JSON, HUGE_JSON)


def _json_string(s: str, mode: str) -> str:
    if mode == "escape":  # every non-ASCII character escaped: surrogates as \ud800
        return json.dumps(s, ensure_ascii=True)
    # Raw: only what must be escaped is; controls and surrogates go as they are.
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dump_json(value: Any, mode: str) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, str):
        return _json_string(value, mode)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_json_string(str(k), mode)}:{dump_json(v, mode)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump_json(v, mode) for v in value) + "]"
    return json.dumps(value)


def encode(text: str, bad: bytes) -> bytes:
    return text.encode("utf-8", "surrogatepass").replace(MARK.encode(), bad)


# Fields that name what a request acts on: kept valid in half the "strings"
# examples, so that hostile keys and prefixes get past the name lookup.
NAMES = frozenset({"bucket", "name", "source", "endpoint"})


def _strings(value: Any, draw: Callable[[Any], Any], keep: frozenset[str] = frozenset()) -> Any:
    """Every string of a template (but the fields in ``keep``) replaced by hostile text."""
    if isinstance(value, str):
        return draw(TEXT)
    if isinstance(value, list):
        return [_strings(v, draw) for v in value]
    if isinstance(value, dict):
        return {k: v if k in keep else _strings(v, draw) for k, v in value.items()}
    return value


@st.composite
def _json_bodies(draw: st.DrawFn, template: Callable[[str], dict], fields: tuple[str, ...]) -> bytes:
    # A new valid name per example (a valid body creates something new),
    # drawn: fixed width, so that the example replays byte for byte.
    body: Any = template(f"{draw(st.integers(0, 999_999_999)):09d}")
    how = draw(st.sampled_from(["field", "field", "field", "strings", "strings", "whole", "deep", "huge",
                                "bytes", "truncated", "empty"]))
    if how == "field":  # one field, known or not, of a hostile value or type
        name = draw(st.sampled_from((*fields, "unknown", "", "__proto__")) | TEXT)
        body[name] = draw(HOSTILE_VALUES)
    elif how == "strings":
        body = _strings(body, draw, NAMES if draw(st.booleans()) else frozenset())
    elif how == "whole":
        body = draw(VALUES)
    elif how == "deep":
        body = draw(DEEP_JSON)
    elif how == "huge":
        lists = [k for k, v in body.items() if isinstance(v, list)]
        if lists:
            body[draw(st.sampled_from(lists))] = draw(HUGE_JSON)
        else:
            body = draw(HUGE_JSON)
    elif how == "bytes":
        return draw(st.binary(max_size=300))
    elif how == "empty":
        return draw(st.sampled_from([b"", b" ", b"\n", b"null", b"{}", b"[]", b"\xef\xbb\xbf{}", b"{}{}", b"{} x"]))
    text = dump_json(body, draw(st.sampled_from(["escape", "raw"])))
    data = encode(text, draw(st.sampled_from(BAD_BYTES)))
    if how == "truncated":
        data = data[: draw(st.integers(0, max(0, len(data) - 1)))]
    return data


# -- XML ----------------------------------------------------------------------

Node = tuple[str, Any]  # (tag, text | [Node] | Raw)
_XML_OK = re.compile("[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_XML_ESC = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _xml_text(s: str, mode: str) -> str:
    out = []
    for ch in s:
        if ch in _XML_ESC:
            out.append(_XML_ESC[ch])
        elif mode == "ref" and ch != MARK and (not _XML_OK.match(ch) or ord(ch) > 0x7E):
            out.append(f"&#x{ord(ch):x};")  # &#x0;, &#xd800;: references XML forbids
        else:
            out.append(ch)
    return "".join(out)


def dump_xml(node: Node, mode: str, root: bool = False) -> str:
    tag, content = node
    attrs = f' xmlns="{NS}"' if root else ""
    if isinstance(content, Raw):
        inner = content.text
    elif isinstance(content, list):
        inner = "".join(dump_xml(c, mode) for c in content)
    else:
        inner = _xml_text(content, mode)
    return f"<{tag}{attrs}>{inner}</{tag}>"


def _leaves(node: Node, path: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    _, content = node
    if isinstance(content, list):
        return [p for i, c in enumerate(content) for p in _leaves(c, (*path, i))]
    return [path]


def _replace(node: Node, path: tuple[int, ...], new: Callable[[Node], Node]) -> Node:
    if not path:
        return new(node)
    tag, content = node
    content = list(content)
    content[path[0]] = _replace(content[path[0]], path[1:], new)
    return (tag, content)


TAGS = ["ChecksumFOO", "Checksum", "ChecksumSHA256", "ChecksumCRC64NVME", "ChecksumCRC32C", "ChecksumType",
        "PartNumber", "ETag", "Key", "VersionId", "Quiet", "Status", "MfaDelete", "LocationConstraint", "Value",
        "Tag", "Object", "Part", "x:Key", "\u00e9"]
PROLOGS = [
    '<?xml version="1.0" encoding="UTF-8"?>', '<?xml version="1.0" encoding="UTF-16"?>',
    '<?xml version="1.0" encoding="bogus"?>', '<?xml version="1.0" encoding="ISO-8859-1"?>',
    '<?xml version="1.1"?>', "\ufeff", '<?xml version="1.0"?><!-- \x01 -->', "<?pi \ud800?>",
    ('<!DOCTYPE x [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
     '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">]>'),
    '<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>', '<!DOCTYPE x SYSTEM "http://127.0.0.1:1/x.dtd">',
]


@st.composite
def _xml_bodies(draw: st.DrawFn, template: Callable[[], Node]) -> bytes:
    tree = template()
    prolog = ""
    how = draw(st.sampled_from(["leaf", "leaf", "leaf", "texts", "texts", "repeat", "deep", "structure",
                                "retag", "prolog", "bytes", "truncated", "empty"]))
    leaves = _leaves(tree)
    if how == "leaf":  # one value: hostile text or a wrong type
        path = draw(st.sampled_from(leaves))
        value = draw(TEXT | NUMBERS)
        tree = _replace(tree, path, lambda n: (n[0], value))
    elif how == "texts":
        for path in leaves:
            value = draw(TEXT)
            tree = _replace(tree, path, lambda n, v=value: (n[0], v))
    elif how == "repeat":  # many items: past each route's own limit, and its body size limit
        n = draw(st.sampled_from([2, 11, 101, 1001, 10_001, 20_000]))
        tag, content = tree
        tree = (tag, content + [content[-1]] * (n - 1))
    elif how == "retag":  # a field under another (S3) name, or one no S3 body has
        path = draw(st.sampled_from(leaves))
        tag = draw(st.sampled_from(TAGS))
        tree = _replace(tree, path, lambda n: (tag, n[1]))
    elif how == "deep":
        depth = draw(DEPTHS)
        path = draw(st.sampled_from(leaves))
        deep = Raw("<a>" * depth + "x" + "</a>" * depth)
        tree = _replace(tree, path, lambda n: (n[0], deep))
    elif how == "structure":
        tag, content = tree
        change = draw(st.sampled_from(["rename", "drop", "unknown", "empty", "cdata", "prefix", "text"]))
        if change == "rename":
            tree = (draw(st.sampled_from(["Foo", "Delete", "Tagging", "a:b", "CompleteMultipartUpload"])), content)
        elif change == "drop":
            tree = (tag, content[:-1])
        elif change == "unknown":
            tree = (tag, [("Unknown", Raw("<x y='1'/>")), *content])
        elif change == "empty":
            tree = (tag, [])
        elif change == "cdata":
            path = draw(st.sampled_from(leaves))
            tree = _replace(tree, path, lambda n: (n[0], Raw("<![CDATA[" + draw(TEXT).replace("]]>", "") + "]]>")))
        elif change == "prefix":
            return encode(f'<s3:{tag} xmlns:s3="{NS}">' + "".join(dump_xml(c, "raw") for c in content)
                          + f"</s3:{tag}>", b"\xff")
        else:
            tree = (tag, [(c[0], Raw("text")) if isinstance(c[1], list) else c for c in content])
    elif how == "prolog":
        prolog = draw(st.sampled_from(PROLOGS))
        if draw(st.booleans()):
            path = draw(st.sampled_from(leaves))
            tree = _replace(tree, path, lambda n: (n[0], Raw("&d;&e;&undefined;")))
    elif how == "bytes":
        return draw(st.binary(max_size=300))
    elif how == "empty":
        return draw(st.sampled_from([b"", b" ", b"\n", b"<", b"<a/>", b"<?xml version='1.0'?>", b"\x00", b"\xef\xbb\xbf"]))
    text = prolog + dump_xml(tree, draw(st.sampled_from(["raw", "ref"])), root=True)
    data = encode(text, draw(st.sampled_from(BAD_BYTES)))
    if how == "truncated":
        data = data[: draw(st.integers(0, max(0, len(data) - 1)))]
    return data


def json_bodies(template: Callable[[str], dict], fields: tuple[str, ...]) -> st.SearchStrategy[Body]:
    return _json_bodies(template, fields).map(Body)


def xml_bodies(template: Callable[[], Node]) -> st.SearchStrategy[Body]:
    return _xml_bodies(template).map(Body)


# -- the properties -----------------------------------------------------------


def describe(method: str, path: str, body: bytes, resp: httpx.Response) -> str:
    shown = body if len(body) <= 300 else body[:300] + b"...(%d bytes)" % len(body)
    return f"{method} {path} body={shown!r} -> {resp.status_code} {resp.content[:600]!r}"


def allowed_status(resp: httpx.Response, where: str, extra: tuple[int, ...] = ()) -> None:
    status = resp.status_code
    assert status < 500 or status == 501 or status in extra or (status == 503 and "retry-after" in resp.headers), where


def check_s3(method: str, path: str, body: bytes, resp: httpx.Response) -> None:
    where = describe(method, path, body, resp)
    allowed_status(resp, where)
    request_id = resp.headers.get("x-amz-request-id")
    assert request_id, where
    if resp.status_code >= 300:
        try:
            root = ET.fromstring(resp.content)
        except ET.ParseError as exc:
            raise AssertionError(f"error body does not parse ({exc}): {where}") from None
        assert root.tag == "Error", where
        assert root.findtext("Code"), where
        assert root.findtext("Message"), where
        assert root.findtext("RequestId") == request_id, where


def check_admin(method: str, path: str, body: bytes, resp: httpx.Response) -> None:
    where = describe(method, path, body, resp)
    # A mount whose source does not answer (a closed port here) is 502 SourceUnavailable, as documented.
    allowed_status(resp, where, (502,) if path == "/mounts" else ())
    if resp.status_code >= 400:
        try:
            doc = resp.json()
        except ValueError:
            hint = ""
            if b"header section" in resp.content:
                hint = " (the bytes of an earlier request's unread body on this connection? see " \
                       "test_unread_body_then_next_request)"
            raise AssertionError(f"error body is not JSON{hint}: {where}") from None
        assert isinstance(doc, dict) and set(doc) == {"error"}, where
        error = doc["error"]
        assert isinstance(error, dict) and set(error) == {"code", "message"}, where
        assert isinstance(error["message"], str) and error["message"], where
        assert CODES.get(error["code"]) == resp.status_code, where


# -- S3 routes ------------------------------------------------------------------


@dataclass(frozen=True)
class S3Route:
    method: str
    path: Callable[[World], str]
    bodies: st.SearchStrategy[bytes]
    md5: bool = False  # send Content-MD5 (as SDKs do for DeleteObjects)


def _complete_template() -> Node:
    # Valid but for the second part, which the upload lacks: "drop" completes it.
    return ("CompleteMultipartUpload", [
        ("Part", [("PartNumber", "1"), ("ETag", f'"{PART_ETAG}"'), ("ChecksumCRC32", _crc32(PART))]),
        ("Part", [("PartNumber", "2"), ("ETag", "0123456789abcdef0123456789abcdef"), ("ChecksumCRC32", "AAAAAA==")]),
    ])


S3_ROUTES = {
    "CreateBucket": S3Route("PUT", lambda w: f"/{CREATED}", xml_bodies(
        lambda: ("CreateBucketConfiguration", [("LocationConstraint", "us-east-1")]))),
    "DeleteObjects": S3Route("POST", lambda w: f"/{S3_BUCKET}?delete", xml_bodies(
        lambda: ("Delete", [("Quiet", "true"), ("Object", [("Key", "gone")]),
                            ("Object", [("Key", "x/y"), ("VersionId", "null"), ("ETag", '"abc"')])])), md5=True),
    # The same on the bucket PutBucketVersioning turns on and suspends: version ids and delete markers.
    "DeleteObjects (versioned)": S3Route("POST", lambda w: f"/{VERSIONED}?delete", xml_bodies(
        lambda: ("Delete", [("Object", [("Key", "gone")]),
                            ("Object", [("Key", "x/y"), ("VersionId", "3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY")])])),
        md5=True),
    # A new upload per example (two requests more), so that each can complete.
    "CompleteMultipartUpload": S3Route(
        "POST", lambda w: f"/{S3_BUCKET}/{UPLOAD_KEY}?uploadId={w.new_upload(False)}", xml_bodies(_complete_template)),
    "CompleteMultipartUpload+CRC32": S3Route(
        "POST", lambda w: f"/{S3_BUCKET}/{UPLOAD_KEY}?uploadId={w.new_upload(True)}", xml_bodies(_complete_template)),
    "PutObjectTagging": S3Route("PUT", lambda w: f"/{S3_BUCKET}/{OBJECT}?tagging", xml_bodies(
        lambda: ("Tagging", [("TagSet", [("Tag", [("Key", "k"), ("Value", "v")]),
                                         ("Tag", [("Key", "k2"), ("Value", "")])])]))),
    "PutBucketVersioning": S3Route("PUT", lambda w: f"/{VERSIONED}?versioning", xml_bodies(
        lambda: ("VersioningConfiguration", [("Status", "Enabled"), ("MfaDelete", "Disabled")]))),
    "PutBucketAcl": S3Route("PUT", lambda w: f"/{S3_BUCKET}?acl", xml_bodies(
        lambda: ("AccessControlPolicy", [("Owner", [("ID", "owner")]), ("AccessControlList", [
            ("Grant", [("Grantee", [("ID", "owner")]), ("Permission", "FULL_CONTROL")])])]))),
    "PutObjectAcl": S3Route("PUT", lambda w: f"/{S3_BUCKET}/{OBJECT}?acl", xml_bodies(
        lambda: ("AccessControlPolicy", [("Owner", [("ID", "owner")]), ("AccessControlList", [
            ("Grant", [("Grantee", [("ID", "owner")]), ("Permission", "READ")])])]))),
    # Body-taking operations the gateway does not implement: 501 NotImplemented
    # (or a 4xx) with an S3 error document, whatever the body.
    "PutBucketTagging": S3Route("PUT", lambda w: f"/{S3_BUCKET}?tagging", xml_bodies(
        lambda: ("Tagging", [("TagSet", [("Tag", [("Key", "k"), ("Value", "v")])])]))),
    "PutBucketLifecycleConfiguration": S3Route("PUT", lambda w: f"/{S3_BUCKET}?lifecycle", xml_bodies(
        lambda: ("LifecycleConfiguration", [("Rule", [("ID", "r"), ("Status", "Enabled"),
                                                      ("Expiration", [("Days", "1")])])])), md5=True),
    "RestoreObject": S3Route("POST", lambda w: f"/{S3_BUCKET}/{OBJECT}?restore", xml_bodies(
        lambda: ("RestoreRequest", [("Days", "1")]))),
    # A valid policy of the bucket, its top-level fields damaged; the
    # statements themselves are drawn by test_policy_documents below.
    "PutBucketPolicy": S3Route("PUT", lambda w: f"/{S3_BUCKET}?policy", json_bodies(
        lambda _: _policy_template(S3_BUCKET), ("Version", "Statement", "Id"))),
    "GetBatch": S3Route("POST", lambda w: f"/{S3_BUCKET}?batch", json_bodies(
        lambda _: {"keys": [OBJECT, "missing", "a/b"], "on_error": "skip"}, ("keys", "on_error"))),
}


# How the body is vouched for: its signed SHA-256 (the default), none
# (UNSIGNED-PAYLOAD), or beside either, a Content-MD5 or x-amz-checksum-crc32.
FRAMINGS = st.sampled_from(["signed", "signed", "unsigned", "md5", "crc32", "unsigned+crc32"])


@pytest.mark.parametrize("name", list(S3_ROUTES))
@FUZZ
@given(data=st.data())
def test_s3_bodies(world: World, name: str, data: st.DataObject) -> None:
    route = S3_ROUTES[name]
    body = data.draw(route.bodies, label="body")
    framing = data.draw(FRAMINGS, label="framing")
    path = route.path(world)
    headers = {"Content-MD5": _md5(body)} if route.md5 or framing == "md5" else {}
    if framing.endswith("crc32"):
        headers["x-amz-checksum-crc32"] = _crc32(body)
    options = {"payload_hash": "UNSIGNED-PAYLOAD"} if framing.startswith("unsigned") else {}
    TRIED[name] += 1
    resp = world.s3.signed(route.method, path, headers, body, **options)  # read whole: a cut stream raises
    check_s3(route.method, path, body, resp)


# -- admin routes ---------------------------------------------------------------


@dataclass(frozen=True)
class AdminRoute:
    method: str
    path: str
    template: Callable[[str], dict]
    fields: tuple[str, ...]


def _policy_template(bucket: str | None) -> dict:
    """A valid policy document: a bucket's (with a Principal) or a user's."""
    statement: dict[str, Any] = {
        "Sid": "read", "Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"],
        "Resource": [f"arn:aws:s3:::{bucket or ADMIN_BUCKET}", f"arn:aws:s3:::{bucket or ADMIN_BUCKET}/*"],
        "Condition": {"StringLike": {"s3:prefix": ["team/*"]}},
    }
    if bucket is not None:
        statement["Principal"] = "*"
    return {"Version": "2012-10-17", "Id": "p", "Statement": [statement]}


def _mount(n: str) -> dict:
    return {"name": f"fz-m-{n}", "source": "s3://src/prefix", "endpoint": CLOSED,
            "access_key": "ak", "secret_key": "sk", "freshness": 60.0}


ADMIN_ROUTES = {
    "POST /buckets": AdminRoute("POST", "/buckets", lambda n: {"name": f"fz-b-{n}", "pinned": False},
                                ("name", "write_through", "compression", "part_size", "small_object_size", "pinned")),
    "PATCH /buckets/{name}": AdminRoute(
        "PATCH", f"/buckets/{ADMIN_BUCKET}", lambda _: {"compression": True, "small_object_size": 65536},
        ("write_through", "compression", "part_size", "small_object_size", "pinned")),
    "POST /mounts": AdminRoute("POST", "/mounts", _mount, (
        "name", "source", "region", "access_key", "secret_key", "freshness", "serve_stale", "read_write",
        "listing_ttl", "check_md5")),  # never "endpoint": with none the gateway would ask AWS (see _safe_mount)
    "POST /jobs/warm": AdminRoute("POST", "/jobs/warm", lambda _: {"bucket": ADMIN_BUCKET, "keys": ["a", "b/c"]}, (
        "bucket", "prefix", "keys", "manifest", "patterns", "urls", "concurrency", "bandwidth", "cooperative",
        "peers", "peer_wait")),
    "POST /jobs/pin": AdminRoute("POST", "/jobs/pin", lambda _: {"bucket": ADMIN_BUCKET, "prefix": "p/"},
                                 ("bucket", "prefix")),
    "POST /jobs/evict": AdminRoute("POST", "/jobs/evict", lambda _: {"bucket": ADMIN_BUCKET, "prefix": "p/"},
                                   ("bucket", "prefix")),
    "POST /jobs/compact": AdminRoute("POST", "/jobs/compact", lambda _: {"threshold": 0.5}, ("threshold",)),
    # No body in the schema: whatever is sent must be ignored or refused, never crash.
    "POST /jobs/flush": AdminRoute("POST", "/jobs/flush", lambda _: {}, ("bucket",)),
    "POST /epochs": AdminRoute("POST", "/epochs", lambda _: {"bucket": ADMIN_BUCKET, "keys": ["a", "b"]}, (
        "bucket", "keys", "patterns", "urls", "prefix", "seed", "readers", "lookahead_bytes",
        "lookahead_objects", "idle_timeout")),
    "POST /users": AdminRoute("POST", "/users", lambda n: {"name": f"fz-u-{n}", "policies": ["read-only"],
                                                           "key": False}, ("name", "policies", "key")),
    "PATCH /users/{name}": AdminRoute("PATCH", f"/users/{FUZZ_USER}", lambda _: {
        "enabled": True, "policies": [f"read-write:{ADMIN_BUCKET}"]}, ("enabled", "policies")),
    "PUT /policies/{name}": AdminRoute("PUT", "/policies/fz-policy", lambda _: _policy_template(None),
                                       ("Version", "Statement", "Id")),
}


def _safe_mount(body: bytes) -> bytes:
    """A mount body that parses keeps its endpoint on the closed local port:
    without one (or with null) the gateway would ask AWS itself."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(doc, dict) or not doc:
        return body
    endpoint = doc.get("endpoint")
    if "endpoint" not in doc:
        return body.replace(b"{", b'{"endpoint":"' + CLOSED.encode() + b'",', 1)
    if endpoint is None or (isinstance(endpoint, str) and endpoint.lower().startswith("http")
                            and not endpoint.startswith(CLOSED)):
        return b"{}"
    return body


@pytest.mark.parametrize("name", list(ADMIN_ROUTES))
@FUZZ
@given(data=st.data())
def test_admin_bodies(world: World, name: str, data: st.DataObject) -> None:
    route = ADMIN_ROUTES[name]
    body = data.draw(json_bodies(route.template, route.fields), label="body")
    if route.path == "/mounts":
        body = _safe_mount(body)
    TRIED[name] += 1
    resp = world.admin.request(route.method, route.path, content=body,
                               headers={"Content-Type": "application/json"})
    check_admin(route.method, route.path, body, resp)


# -- policy documents ----------------------------------------------------------------

# Statements put together from IAM's words and hostile values, so that the
# evaluator's parser meets near-misses (a known field holding the wrong
# type, an operator it lacks, a resource of another bucket), not only noise.
POLICY_WORDS = st.sampled_from([
    "*", "s3:*", "s3:GetObject", "S3:getobject", "s3:Get*", "ec2:RunInstances", "s3:", "",
    "arn:aws:s3:::", "arn:aws:s3:::*", f"arn:aws:s3:::{S3_BUCKET}", f"arn:aws:s3:::{S3_BUCKET}/*",
    f"arn:aws:s3:::{ADMIN_BUCKET}/a*b?c", "arn:aws:s3:::other/*", "arn:aws:iam::1:user/x", "arn:aws:iam::1:root",
    "Allow", "Deny", "allow", "2012-10-17", "2008-10-17", "true", "false", "[", "\ud800",
])
POLICY_VALUES = st.recursive(
    st.one_of(POLICY_WORDS, TEXT, st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.one_of(POLICY_WORDS, TEXT), inner,
                                                                          max_size=3)),
    max_leaves=12,
)
STATEMENT_FIELDS = st.sampled_from([
    "Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Principal", "NotPrincipal", "Condition",
    "Extra",
])
CONDITIONS = st.dictionaries(
    st.sampled_from(["StringEquals", "StringLike", "StringNotLike", "StringLikeIfExists", "Null", "IpAddress",
                     "NullIfExists", "StringEqualsIgnoreCase", "Bool"]),
    st.dictionaries(st.sampled_from(["s3:prefix", "s3:delimiter", "aws:SourceIp", ""]), POLICY_VALUES, max_size=2),
    max_size=3,
)
STATEMENTS = st.dictionaries(STATEMENT_FIELDS, st.one_of(POLICY_VALUES, CONDITIONS), max_size=7)
POLICIES = st.builds(
    lambda version, statements, single: {"Version": version, "Statement": statements[0] if single and statements
                                         else statements},
    st.one_of(POLICY_WORDS, st.none()), st.lists(STATEMENTS, max_size=4), st.booleans(),
)


@pytest.mark.parametrize("where", ["PutBucketPolicy", "PUT /policies/{name}"])
@FUZZ
@given(document=POLICIES)
def test_policy_documents(world: World, where: str, document: dict) -> None:
    """Random policy documents: taken (204, 200) or MalformedPolicy (S3's
    400, the admin API's), never anything else."""
    body = json.dumps(document).encode()
    TRIED[f"{where} (documents)"] += 1
    if where == "PutBucketPolicy":
        resp = world.s3.signed("PUT", f"/{S3_BUCKET}?policy", {}, body)
        check_s3("PUT", f"/{S3_BUCKET}?policy", body, resp)
        assert resp.status_code == 204 or ET.fromstring(resp.content).findtext("Code") == "MalformedPolicy", \
            describe("PUT", "?policy", body, resp)
    else:
        resp = world.admin.put("/policies/fz-doc", content=body, headers={"Content-Type": "application/json"})
        check_admin("PUT", "/policies/fz-doc", body, resp)
        assert resp.status_code == 200 or resp.json()["error"]["code"] in ("MalformedPolicy", "InvalidRequest"), \
            describe("PUT", "/policies/fz-doc", body, resp)


# -- every route, the classic hostile bodies ----------------------------------------

# Tried on every route whatever the fuzzer draws, so that each class above is
# covered on every run: JSON bodies on the JSON routes, XML on the XML ones.
CLASSIC_JSON = {
    "deep list": b"[" * 100_000 + b"]" * 100_000,
    "deep object": b'{"a":' * 50_000 + b"0" + b"}" * 50_000,
    "4400-digit number": b'{"bucket":' + b"9" * 4400 + b"}",
    "NaN": b'{"threshold":NaN,"keys":[Infinity]}',
    "escaped lone surrogate": b'{"bucket":"\\ud800","name":"\\udfff","keys":["\\ud800"],"prefix":"\\udc80"}',
    "raw invalid UTF-8": b'{"bucket":"\xff","keys":["\xed\xa0\x80"],"prefix":"\xc0\x80"}',
    "raw control characters": b'{"bucket":"a\x00b","keys":["\x01\x1f"],"prefix":"\x7f"}',
    "escaped controls, valid names": f'{{"bucket":"{ADMIN_BUCKET}","keys":["\\u0000","a\\u001fb"],"prefix":"\\u0001"}}'.encode(),
    "escaped surrogates, valid names": f'{{"bucket":"{ADMIN_BUCKET}","keys":["\\ud800"],"prefix":"\\udfff"}}'.encode(),
    "1,000,001 keys": f'{{"bucket":"{ADMIN_BUCKET}","keys":['.encode() + b",".join([b'"k"'] * 1_000_001) + b"]}",
    "wrong types": b'{"bucket":["x"],"keys":"k","name":{},"threshold":"0.5","prefix":7,"patterns":"true"}',
    "duplicate keys": b'{"bucket":"a","bucket":"b","keys":[],"keys":null}',
    "not an object": b'"just a string"',
    "BOM": b"\xef\xbb\xbf{}",
}
CLASSIC_XML = {
    "deep": b"<a>" * 100_000 + b"</a>" * 100_000,
    "billion laughs": b'<!DOCTYPE x [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
                      b'<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]><Delete><Object><Key>&c;</Key></Object></Delete>',
    "external entity": b'<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><Tagging><TagSet><Tag><Key>&e;</Key>'
                       b"<Value>v</Value></Tag></TagSet></Tagging>",
    "surrogate reference": b"<Delete><Object><Key>&#xd800;</Key></Object></Delete>",
    "raw surrogate": b"<Delete><Object><Key>\xed\xa0\x80</Key></Object></Delete>",
    "raw invalid UTF-8": b"<Tagging><TagSet><Tag><Key>\xff</Key><Value>\xc0\x80</Value></Tag></TagSet></Tagging>",
    "control reference": b"<Tagging><TagSet><Tag><Key>&#x1;</Key><Value>&#x0;</Value></Tag></TagSet></Tagging>",
    "tab and newline in a tag": b"<Tagging><TagSet><Tag><Key>a&#x9;b</Key><Value>&#xa;</Value></Tag></TagSet></Tagging>",
    "1001 objects": b"<Delete>" + b"<Object><Key>k</Key></Object>" * 1001 + b"</Delete>",
    "10,001 parts": b"<CompleteMultipartUpload>" + b"".join(
        b"<Part><PartNumber>%d</PartNumber><ETag>e</ETag></Part>" % i for i in range(1, 10_002)) + b"</CompleteMultipartUpload>",
    "huge part number": b"<CompleteMultipartUpload><Part><PartNumber>" + b"9" * 4400
                        + b"</PartNumber><ETag>e</ETag></Part></CompleteMultipartUpload>",
    "empty key": b"<Delete><Object><Key></Key></Object></Delete>",
    "UTF-16": '<?xml version="1.0" encoding="UTF-16"?><Delete><Object><Key>k</Key></Object></Delete>'.encode("utf-16"),
    "5 MiB": b"<Delete>" + b" " * (5 * 1024 * 1024) + b"</Delete>",
}
JSON_S3 = {"GetBatch", "PutBucketPolicy"}


@pytest.mark.parametrize("name", [*S3_ROUTES, *ADMIN_ROUTES])
def test_classic_bodies(world: World, name: str) -> None:
    """Each of the classic hostile bodies, on a route of each port."""
    classics = CLASSIC_JSON if name in ADMIN_ROUTES or name in JSON_S3 else CLASSIC_XML
    for label, body in classics.items():
        TRIED[name] += 1
        if name in S3_ROUTES:
            route = S3_ROUTES[name]
            path = route.path(world)
            headers = {"Content-MD5": _md5(body)} if route.md5 else {}
            check_s3(route.method, path, body, world.s3.signed(route.method, path, headers, body))
        else:
            admin = ADMIN_ROUTES[name]
            body = _safe_mount(body) if admin.path == "/mounts" else body
            resp = world.admin.request(admin.method, admin.path, content=body,
                                       headers={"Content-Type": "application/json"})
            check_admin(admin.method, admin.path, f"[{label}] ".encode() + body, resp)


def test_unread_body_then_next_request(world: World) -> None:
    """A route that answers before it reads its body (POST /jobs/flush takes
    none) must not let the unread bytes spoil the connection's next request:
    either its answer says ``connection: close``, or the next request on the
    connection is answered as if the body had been read. Found by the fuzzer
    above: after a 200 KB body the next request on the kept-alive connection
    got a plain-text 400 "Your request header section exceeds the maximum
    allowed size" (the body's late bytes were counted as a request head)."""
    body = b"[" * 200_000
    head = (f"POST /jobs/flush HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    following = f"GET /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", world.gw.admin_port), timeout=30) as sock:
        sock.sendall(head + body[:1])  # the answer comes before the rest of the body
        first = read_answer(sock)
        assert first is not None and first.status == 202, first
        if first.headers.get("connection", "").lower() == "close":
            return  # the client will not reuse the connection
        try:
            sock.sendall(body[1:])
            time.sleep(0.2)
            sock.sendall(following)
            second = read_answer(sock)
        except OSError as exc:  # reset: the server dropped a connection it had kept alive
            second = exc  # type: ignore[assignment]
    assert isinstance(second, Answer) and second.status == 200, (
        f"the request after an unread 200 KB body on a kept-alive admin connection got {second!r}")


# -- afterwards -------------------------------------------------------------------


def test_zz_gateway_still_answers(world: World) -> None:
    """Runs last: the gateway serves both ports, and nothing above left a
    traceback, an unhandled ASGI exception or a lost task in its log."""
    listed = world.s3.signed("GET", "/")
    assert listed.status_code == 200, listed.text
    assert ET.fromstring(listed.content).find(f".//{{{NS}}}Bucket") is not None
    for path in ("/jobs", "/epochs", "/buckets", "/mounts", "/users", "/policies"):
        resp = world.admin.get(path)
        assert resp.status_code == 200, (path, resp.text[:2000])
    log = world.gw.log()
    for bad in ("Traceback", "Exception in ASGI application", "was never retrieved"):
        at = log.find(bad)
        assert at < 0, f"{bad!r} in the gateway's log:\n{log[max(0, at - 3000):at + 3000]}"
