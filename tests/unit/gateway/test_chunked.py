"""gateway.s3.chunked: aws-chunked bodies from botocore, from the S3 docs and by hand."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import random
import zlib
from collections.abc import Iterable

import pytest
from botocore import httpchecksum as bc
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.s3.chunked import (
    MAX_LINE,
    MAX_TRAILERS,
    SIGNED,
    SIGNED_TRAILER,
    UNSIGNED_TRAILER,
    AwsChunkedDecoder,
)
from gateway.s3.errors import S3Error

EMPTY = hashlib.sha256(b"").hexdigest()


class HmacSigner:
    """Test double of gateway.auth.sigv4's chunk signer, written from the S3 docs."""

    def __init__(self, secret: str, date: str, region: str, seed: str) -> None:
        key = ("AWS4" + secret).encode()
        for part in (date[:8], region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        self._key = key
        self._date = date
        self._scope = f"{date[:8]}/{region}/s3/aws4_request"
        self.seed_signature = seed

    def _sign(self, *lines: str) -> str:
        text = "\n".join(lines).encode()
        return hmac.new(self._key, text, hashlib.sha256).hexdigest()

    def chunk_signature(self, previous_signature: str, chunk_sha256_hex: str) -> str:
        return self._sign(
            "AWS4-HMAC-SHA256-PAYLOAD", self._date, self._scope,
            previous_signature, EMPTY, chunk_sha256_hex,
        )

    def trailer_signature(self, previous_signature: str, trailer_bytes: bytes) -> str:
        return self._sign(
            "AWS4-HMAC-SHA256-TRAILER", self._date, self._scope,
            previous_signature, hashlib.sha256(trailer_bytes).hexdigest(),
        )


DOC_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def signer(seed: str = "0" * 64) -> HmacSigner:
    return HmacSigner("secret", "20240102T030405Z", "us-east-1", seed)


def crc32_b64(data: bytes) -> str:
    return base64.b64encode((zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big")).decode()


def build_signed(
    chunks: list[bytes], s: HmacSigner, trailers: dict[str, str] | None = None
) -> bytes:
    """Encode chunks the way the SDKs do for the two signed modes."""
    out, previous = bytearray(), s.seed_signature
    for chunk in [*chunks, b""]:
        previous = s.chunk_signature(previous, hashlib.sha256(chunk).hexdigest())
        out += b"%x;chunk-signature=%s\r\n" % (len(chunk), previous.encode())
        if chunk:
            out += chunk + b"\r\n"
    if trailers is None:
        return bytes(out + b"\r\n")
    canonical = "".join(f"{k}:{v}\n" for k, v in trailers.items())
    for k, v in trailers.items():
        out += f"{k}:{v}\r\n".encode()
    sig = s.trailer_signature(previous, canonical.encode())
    return bytes(out + f"x-amz-trailer-signature:{sig}\r\n\r\n".encode())


def build_unsigned(chunks: list[bytes], trailers: dict[str, str]) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c) + b"0\r\n"
    return body + b"".join(f"{k}:{v}\r\n".encode() for k, v in trailers.items()) + b"\r\n"


def botocore_body(data: bytes, chunk_size: int | None = None, cls: type = bc.CrtCrc32Checksum,
                  name: str = "x-amz-checksum-crc32") -> bytes:
    wrapper = bc.AwsChunkedWrapper(io.BytesIO(data), checksum_cls=cls, checksum_name=name,
                                   chunk_size=chunk_size)
    return wrapper.read()


def decode(mode: str, body: bytes, splits: Iterable[int] = (), s: HmacSigner | None = None,
           **kw: int) -> tuple[bytes, AwsChunkedDecoder]:
    dec = AwsChunkedDecoder(mode, s, **kw)
    out, last = bytearray(), 0
    for cut in [*sorted(splits), len(body)]:
        for piece in dec.feed(body[last:cut]):
            out += piece
        last = cut
    dec.finish()
    assert dec.done
    assert dec.decoded_length == len(out)
    return bytes(out), dec


# -- botocore's own framing (STREAMING-UNSIGNED-PAYLOAD-TRAILER) -------------

@pytest.mark.parametrize("size", [0, 1, 110, 8191, 1024 * 1024, 1024 * 1024 + 5, 3 * 1024 * 1024])
def test_botocore_default_chunks(size: int) -> None:
    data = random.Random(size).randbytes(size)
    body = botocore_body(data)
    payload, dec = decode(UNSIGNED_TRAILER, body)
    assert payload == data
    assert dec.trailers == {"x-amz-checksum-crc32": crc32_b64(data)}


@pytest.mark.parametrize(
    ("cls", "name"),
    [
        (bc.CrtCrc32cChecksum, "x-amz-checksum-crc32c"),
        (bc.CrtCrc64NvmeChecksum, "x-amz-checksum-crc64nvme"),
        (bc.Sha256Checksum, "x-amz-checksum-sha256"),
    ],
)
def test_botocore_other_algorithms(cls: type, name: str) -> None:
    data = b"abc" * 5000
    payload, dec = decode(UNSIGNED_TRAILER, botocore_body(data, 4096, cls, name))
    expected = cls()
    expected.update(data)
    assert payload == data
    assert dec.trailers == {name: expected.b64digest()}


def test_botocore_without_checksum_ends_with_empty_trailer() -> None:
    wrapper = bc.AwsChunkedWrapper(io.BytesIO(b"hello"))
    body = wrapper.read()
    assert body == b"5\r\nhello\r\n0\r\n\r\n"
    payload, dec = decode(UNSIGNED_TRAILER, body)
    assert payload == b"hello" and dec.trailers == {}


def test_botocore_put_object_body_byte_for_byte() -> None:
    """What boto3 really puts on the wire for PutObject over https."""
    import boto3
    from botocore.awsrequest import AWSResponse

    seen: dict[str, object] = {}

    class _Raw:
        def stream(self, **_: object) -> Iterable[bytes]:
            yield b""

    def capture(request, **_: object) -> AWSResponse:  # type: ignore[no-untyped-def]
        seen["headers"] = {k.lower(): v for k, v in request.headers.items()}
        seen["body"] = request.body.read()
        return AWSResponse(request.url, 200, {"ETag": '"x"'}, _Raw())

    client = boto3.client(
        "s3", endpoint_url="https://s3.example.invalid", region_name="us-east-1",
        aws_access_key_id="AK", aws_secret_access_key="SK",
    )
    client.meta.events.register("before-send.s3.PutObject", capture)
    data = bytes(range(256)) * 5000  # > 1 MiB: two chunks
    client.put_object(Bucket="b", Key="k", Body=data)
    headers = seen["headers"]
    assert isinstance(headers, dict)
    assert headers["x-amz-content-sha256"] == UNSIGNED_TRAILER.encode()
    assert headers["content-encoding"] == b"aws-chunked"
    assert headers["x-amz-trailer"] == b"x-amz-checksum-crc32"
    body = seen["body"]
    assert isinstance(body, bytes)
    assert body.startswith(b"100000\r\n")
    assert body.endswith(b"\r\n0\r\nx-amz-checksum-crc32:" + crc32_b64(data).encode() + b"\r\n\r\n")
    payload, dec = decode(UNSIGNED_TRAILER, body)
    assert payload == data
    assert int(headers["x-amz-decoded-content-length"]) == dec.decoded_length


def test_unsigned_one_byte_at_a_time() -> None:
    data = b"0123456789" * 50
    body = botocore_body(data, chunk_size=64)
    payload, dec = decode(UNSIGNED_TRAILER, body, splits=range(1, len(body)))
    assert payload == data
    assert dec.trailers == {"x-amz-checksum-crc32": crc32_b64(data)}


def test_unsigned_streams_before_chunk_is_complete() -> None:
    dec = AwsChunkedDecoder(UNSIGNED_TRAILER)
    pieces = dec.feed(b"a\r\nhello")
    assert [bytes(p) for p in pieces] == [b"hello"]
    assert [bytes(p) for p in dec.feed(b"world\r\n0\r\n\r\n")] == [b"world"]
    dec.finish()
    assert dec.decoded_length == 10


def test_unsigned_slices_are_zero_copy_views_of_the_input() -> None:
    body = botocore_body(b"x" * 100_000, chunk_size=50_000)
    pieces = AwsChunkedDecoder(UNSIGNED_TRAILER).feed(body)
    assert [len(p) for p in pieces] == [50_000, 50_000]
    assert all(isinstance(p, memoryview) and p.obj is body for p in pieces)


def test_bytearray_input_is_snapshotted() -> None:
    buf = bytearray(b"5\r\nhello\r\n0\r\n\r\n")
    dec = AwsChunkedDecoder(UNSIGNED_TRAILER)
    pieces = dec.feed(buf)
    buf[:] = b"X" * len(buf)  # a caller reusing its read buffer
    assert b"".join(pieces) == b"hello"


def test_unsigned_chunk_extensions_are_ignored() -> None:
    crc = crc32_b64(b"hello").encode()
    body = b"5;foo=bar;baz\r\nhello\r\n0;x=y\r\nx-amz-checksum-crc32:" + crc + b"\r\n\r\n"
    payload, dec = decode(UNSIGNED_TRAILER, body)
    assert payload == b"hello"
    assert dec.trailers["x-amz-checksum-crc32"] == crc32_b64(b"hello")


def test_trailer_parsing() -> None:
    body = (
        b"3\r\nabc\r\n0\r\n"
        b"X-Amz-Checksum-CRC32C: sOO8/Q== \r\nx-amz-meta-a:b:c\r\nempty:\r\n\r\n"
    )
    _, dec = decode(UNSIGNED_TRAILER, body)
    assert dec.trailers == {"x-amz-checksum-crc32c": "sOO8/Q==", "x-amz-meta-a": "b:c", "empty": ""}


def test_leading_zeros_and_upper_case_hex() -> None:
    payload, _ = decode(UNSIGNED_TRAILER, b"000A\r\n0123456789\r\n00\r\n\r\n")
    assert payload == b"0123456789"


# -- signed modes: the S3 documentation's own examples ----------------------

def test_aws_doc_example_signed_payload() -> None:
    s = HmacSigner(DOC_SECRET, "20130524T000000Z", "us-east-1",
                   "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9")
    sig = b";chunk-signature="
    body = (
        b"10000" + sig + b"ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648\r\n"
        + b"a" * 65536 + b"\r\n"
        + b"400" + sig + b"0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497\r\n"
        + b"a" * 1024 + b"\r\n"
        + b"0" + sig + b"b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9\r\n\r\n"
    )
    assert body == build_signed([b"a" * 65536, b"a" * 1024], s)
    payload, dec = decode(SIGNED, body, s=s)
    assert payload == b"a" * 66560 and dec.trailers == {}


DOC_TRAILER_CHUNKS = (
    b"10000;chunk-signature=b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2\r\n"
    + b"a" * 65536 + b"\r\n"
    b"400;chunk-signature=1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7\r\n"
    + b"a" * 1024 + b"\r\n"
    b"0;chunk-signature=2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992\r\n"
)
DOC_TRAILERS = (
    b"x-amz-checksum-crc32c:sOO8/Q==\r\n"
    b"x-amz-trailer-signature:d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435\r\n"
    b"\r\n"
)


def doc_trailer_signer() -> HmacSigner:
    return HmacSigner(DOC_SECRET, "20130524T000000Z", "us-east-1",
                      "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e")


@pytest.mark.parametrize("blank", [b"", b"\r\n"], ids=["sdk-framing", "blank-after-zero-chunk"])
def test_aws_doc_example_signed_trailer(blank: bytes) -> None:
    s = doc_trailer_signer()
    body = DOC_TRAILER_CHUNKS + blank + DOC_TRAILERS
    if not blank:
        assert body == build_signed([b"a" * 65536, b"a" * 1024], s,
                                    {"x-amz-checksum-crc32c": "sOO8/Q=="})
    payload, dec = decode(SIGNED_TRAILER, body, s=s)
    assert payload == b"a" * 66560
    assert dec.trailers == {"x-amz-checksum-crc32c": "sOO8/Q=="}


def test_two_blank_lines_after_zero_chunk_are_rejected() -> None:
    with pytest.raises(S3Error) as info:
        body = DOC_TRAILER_CHUNKS + b"\r\n\r\n" + DOC_TRAILERS
        decode(SIGNED_TRAILER, body, s=doc_trailer_signer())
    assert info.value.code == "IncompleteBody"


# -- signed modes: hand-built bodies -----------------------------------------

@pytest.mark.parametrize("mode", [SIGNED, SIGNED_TRAILER])
def test_signed_one_byte_at_a_time(mode: str) -> None:
    s = signer()
    chunks = [b"a" * 100, b"b" * 100, b"c" * 7]
    trailers = None
    if mode == SIGNED_TRAILER:
        trailers = {"x-amz-checksum-crc32": crc32_b64(b"".join(chunks))}
    body = build_signed(chunks, s, trailers)
    payload, dec = decode(mode, body, splits=range(1, len(body)), s=s)
    assert payload == b"".join(chunks)
    assert dec.trailers == (trailers or {})


def test_signed_emits_only_verified_whole_chunks() -> None:
    s = signer()
    body = build_signed([b"x" * 1000, b"y" * 10], s)
    dec = AwsChunkedDecoder(SIGNED, s)
    head = body.index(b"\r\n") + 2
    assert dec.feed(body[: head + 999]) == []  # all but one byte of chunk 1
    pieces = dec.feed(body[head + 999 : head + 1000])
    assert [bytes(p) for p in pieces] == [b"x" * 1000]
    assert b"".join(dec.feed(body[head + 1000 :])) == b"y" * 10
    dec.finish()


def test_signed_whole_chunk_in_one_feed_is_not_copied() -> None:
    s = signer()
    body = build_signed([b"z" * 65536], s)
    pieces = AwsChunkedDecoder(SIGNED, s).feed(body)
    assert len(pieces) == 1 and pieces[0].obj is body


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, list[bytes], bytes, dict[str, str]]:
    mode = draw(st.sampled_from([SIGNED, SIGNED_TRAILER, UNSIGNED_TRAILER]))
    chunks = draw(st.lists(st.binary(min_size=1, max_size=300), max_size=6))
    data = b"".join(chunks)
    trailers = {} if mode == SIGNED else {"x-amz-checksum-crc32": crc32_b64(data)}
    if mode == UNSIGNED_TRAILER:
        body = build_unsigned(chunks, trailers)
    else:
        body = build_signed(chunks, signer(), trailers if mode == SIGNED_TRAILER else None)
    return mode, chunks, body, trailers


@settings(max_examples=300, deadline=None)
@given(bodies(), st.data())
def test_random_splits(
    case: tuple[str, list[bytes], bytes, dict[str, str]], data: st.DataObject
) -> None:
    mode, chunks, body, trailers = case
    splits = data.draw(st.sets(st.integers(0, len(body)), max_size=20))
    payload, dec = decode(mode, body, splits, s=signer() if mode != UNSIGNED_TRAILER else None)
    assert payload == b"".join(chunks)
    assert dec.trailers == trailers
    assert dec.decoded_length == len(payload)


def all_modes_bodies() -> list[tuple[str, bytes]]:
    s = signer()
    chunks = [b"first chunk", b"second"]
    trailers = {"x-amz-checksum-crc32": crc32_b64(b"".join(chunks))}
    return [
        (SIGNED, build_signed(chunks, s)),
        (SIGNED_TRAILER, build_signed(chunks, s, trailers)),
        (UNSIGNED_TRAILER, build_unsigned(chunks, trailers)),
        (UNSIGNED_TRAILER, botocore_body(b"first chunksecond", chunk_size=11)),
    ]


@pytest.mark.parametrize(("mode", "body"), all_modes_bodies())
def test_truncated_at_every_position(mode: str, body: bytes) -> None:
    for cut in range(len(body)):
        dec = AwsChunkedDecoder(mode, signer() if mode != UNSIGNED_TRAILER else None)
        emitted = b"".join(dec.feed(body[:cut]))  # a valid prefix never raises
        assert not dec.done
        with pytest.raises(S3Error) as info:
            dec.finish()
        assert info.value.code == "IncompleteBody" and info.value.status == 400
        assert b"first chunksecond".startswith(emitted)
        if mode != UNSIGNED_TRAILER:
            assert emitted in (b"", b"first chunk", b"first chunksecond")  # whole chunks only


# -- signatures --------------------------------------------------------------

def test_corrupted_chunk_signatures() -> None:
    s = signer()
    body = build_signed([b"a" * 10, b"b" * 10], s)
    marker = b"chunk-signature="
    sigs = [i + len(marker) for i in range(len(body)) if body.startswith(marker, i)]
    assert len(sigs) == 3
    for n, at in enumerate(sigs):
        bad = bytearray(body)
        bad[at] = ord("0") if bad[at] != ord("0") else ord("1")
        dec = AwsChunkedDecoder(SIGNED, s)
        good = bytearray()
        with pytest.raises(S3Error) as info:
            for i in range(len(bad)):
                good += b"".join(dec.feed(bytes(bad[i : i + 1])))
        assert info.value.code == "SignatureDoesNotMatch" and info.value.status == 403
        assert bytes(good) == b"".join([b"a" * 10, b"b" * 10][:n])  # nothing unverified leaked
        with pytest.raises(S3Error):  # the decoder stays failed
            dec.feed(b"")


def test_corrupted_chunk_data() -> None:
    s = signer()
    body = bytearray(build_signed([b"hello world"], s))
    body[body.index(b"hello")] = ord("j")
    with pytest.raises(S3Error) as info:
        decode(SIGNED, bytes(body), s=s)
    assert info.value.code == "SignatureDoesNotMatch"


def test_wrong_seed_signature() -> None:
    body = build_signed([b"data"], signer("1" * 64))
    with pytest.raises(S3Error) as info:
        decode(SIGNED, body, s=signer("2" * 64))
    assert info.value.code == "SignatureDoesNotMatch"


def test_upper_case_signature_hex_is_accepted() -> None:
    s = signer()
    body = build_signed([b"data"], s)
    head, rest = body.split(b"\r\n", 1)
    payload, _ = decode(SIGNED, head.upper().replace(b"CHUNK-SIGNATURE", b"chunk-signature")
                        + b"\r\n" + rest, s=s)
    assert payload == b"data"


@pytest.mark.parametrize("tamper", ["value", "signature", "name"])
def test_trailer_signature_mismatch(tamper: str) -> None:
    s = signer()
    body = build_signed([b"data"], s, {"x-amz-checksum-crc32": crc32_b64(b"data")})
    if tamper == "value":
        body = body.replace(crc32_b64(b"data").encode(), b"AAAAAA==")
    elif tamper == "name":
        body = body.replace(b"x-amz-checksum-crc32:", b"x-amz-checksum-crc32c:")
    else:
        at = body.index(b"x-amz-trailer-signature:") + len(b"x-amz-trailer-signature:")
        body = body[:at] + (b"f" if body[at] != ord("f") else b"e") + body[at + 1 :]
    with pytest.raises(S3Error) as info:
        decode(SIGNED_TRAILER, body, s=s)
    assert info.value.code == "SignatureDoesNotMatch"


def test_trailer_signature_covers_canonical_lines() -> None:
    class Recorder(HmacSigner):
        seen: list[bytes] = []

        def trailer_signature(self, previous_signature: str, trailer_bytes: bytes) -> str:
            self.seen.append(trailer_bytes)
            return super().trailer_signature(previous_signature, trailer_bytes)

    s = Recorder("k", "20240102T030405Z", "us-east-1", "a" * 64)
    trailers = {"x-amz-checksum-sha256": "x", "x-amz-meta-z": "y"}
    decode(SIGNED_TRAILER, build_signed([b"d"], s, trailers), s=s)
    assert s.seen[-1] == b"x-amz-checksum-sha256:x\nx-amz-meta-z:y\n"


# -- framing errors ------------------------------------------------------------

def _sig_line(size: int, s: HmacSigner, prev: str | None = None, data: bytes = b"") -> bytes:
    sig = s.chunk_signature(prev or s.seed_signature, hashlib.sha256(data).hexdigest())
    return b"%x;chunk-signature=%s\r\n" % (size, sig.encode())


@pytest.mark.parametrize(
    ("mode", "body"),
    [
        (UNSIGNED_TRAILER, b"zz\r\nab\r\n0\r\n\r\n"),  # not hex
        (UNSIGNED_TRAILER, b"\r\n"),  # empty size
        (UNSIGNED_TRAILER, b"1" * 17 + b"\r\n"),  # more than 16 hex digits
        (UNSIGNED_TRAILER, b"2 \r\nab\r\n0\r\n\r\n"),  # junk after the size
        (UNSIGNED_TRAILER, b"-2\r\nab\r\n0\r\n\r\n"),
        (UNSIGNED_TRAILER, b"2\nab\r\n0\r\n\r\n"),  # bare LF
        (UNSIGNED_TRAILER, b"2\r\nabX\n0\r\n\r\n"),  # data longer than announced
        (UNSIGNED_TRAILER, b"2\r\nab\n0\r\n\r\n"),  # missing CR after data
        (UNSIGNED_TRAILER, b"2\r\nab0\r\n\r\n"),  # missing CRLF after data
        (UNSIGNED_TRAILER, b"0\r\nno-colon\r\n\r\n"),
        (UNSIGNED_TRAILER, b"0\r\n:value\r\n\r\n"),
        (UNSIGNED_TRAILER, b"0\r\nbad name:v\r\n\r\n"),
        (UNSIGNED_TRAILER, b"0\r\na:1\r\nA:2\r\n\r\n"),  # duplicate
        (UNSIGNED_TRAILER, b"0\r\na:\xff\r\n\r\n"),  # not ASCII
        (UNSIGNED_TRAILER, b"0\r\nx-amz-trailer-signature:" + b"a" * 64 + b"\r\n\r\n"),
        (UNSIGNED_TRAILER, b"0\r\n\r\nextra"),  # data after the end
        (SIGNED, b"5\r\nhello\r\n"),  # no chunk-signature
        (SIGNED, b"5;chunk-signature=abc\r\nhello\r\n"),  # short signature
        (SIGNED, b"5;chunk-signature=" + b"g" * 64 + b"\r\n"),  # not hex
        (SIGNED, b"5;chunk-signature=" + b"a" * 64 + b";x=y\r\n"),  # extra extension
        (SIGNED, b"5;signature=" + b"a" * 64 + b"\r\n"),
    ],
)
def test_malformed_framing_is_incomplete_body(mode: str, body: bytes) -> None:
    with pytest.raises(S3Error) as info:
        decode(mode, body, s=signer() if mode != UNSIGNED_TRAILER else None)
    assert info.value.code == "IncompleteBody"


def test_signed_mode_rejects_trailers() -> None:
    s = signer()
    body = _sig_line(0, s) + b"x-amz-checksum-crc32:AAAAAA==\r\n\r\n"
    with pytest.raises(S3Error) as info:
        decode(SIGNED, body, s=s)
    assert info.value.code == "IncompleteBody"


def test_signed_trailer_requires_trailer_signature() -> None:
    s = signer()
    body = _sig_line(0, s) + b"x-amz-checksum-crc32:AAAAAA==\r\n\r\n"
    with pytest.raises(S3Error) as info:
        decode(SIGNED_TRAILER, body, s=s)
    assert info.value.code == "IncompleteBody"


def test_nothing_may_follow_the_trailer_signature() -> None:
    s = signer()
    good = build_signed([b"d"], s, {"a": "b"})
    body = good[:-2] + b"c:d\r\n\r\n"
    with pytest.raises(S3Error) as info:
        decode(SIGNED_TRAILER, body, s=s)
    assert info.value.code == "IncompleteBody"


# -- bounded buffers -----------------------------------------------------------

def test_size_line_limit() -> None:
    ok = b"5" + b";e" * ((MAX_LINE - 5) // 2) + b"\r\n"  # just under the limit
    assert len(ok) <= MAX_LINE
    payload, _ = decode(UNSIGNED_TRAILER, ok + b"hello\r\n0\r\n\r\n")
    assert payload == b"hello"
    for splits in ([], list(range(1, MAX_LINE + 10))):
        with pytest.raises(S3Error) as info:
            decode(UNSIGNED_TRAILER, b"5;" + b"e" * MAX_LINE + b"\r\nhello\r\n0\r\n\r\n", splits)
        assert info.value.code == "IncompleteBody"


def test_endless_line_fails_fast_without_buffering() -> None:
    dec = AwsChunkedDecoder(UNSIGNED_TRAILER)
    with pytest.raises(S3Error):
        dec.feed(b"1" * (16 * 1024 * 1024))
    assert len(dec._line) <= MAX_LINE


def test_trailer_section_limit() -> None:
    lines = b"".join(b"x-amz-meta-%05d:%s\r\n" % (i, b"v" * 100) for i in range(200))
    assert len(lines) > MAX_TRAILERS
    with pytest.raises(S3Error) as info:
        decode(UNSIGNED_TRAILER, b"0\r\n" + lines + b"\r\n")
    assert info.value.code == "IncompleteBody"
    fits = lines[: 100 * len(lines) // 200]
    _, dec = decode(UNSIGNED_TRAILER, b"0\r\n" + fits + b"\r\n")
    assert len(dec.trailers) == 100


@pytest.mark.parametrize("mode", [SIGNED, UNSIGNED_TRAILER])
def test_chunk_larger_than_limit(mode: str) -> None:
    s = signer()
    head = _sig_line(1025, s) if mode == SIGNED else b"401\r\n"
    dec = AwsChunkedDecoder(mode, s if mode == SIGNED else None, max_chunk_size=1024)
    with pytest.raises(S3Error) as info:
        dec.feed(head)
    assert info.value.code == "InvalidRequest" and info.value.status == 400
    # Exactly at the limit is fine.
    payload, _ = decode(UNSIGNED_TRAILER, build_unsigned([b"q" * 1024], {}), max_chunk_size=1024)
    assert payload == b"q" * 1024


def test_signed_buffer_holds_one_chunk_at_most() -> None:
    s = signer()
    chunks = [bytes([i]) * 65536 for i in range(8)]
    body = build_signed(chunks, s)
    dec = AwsChunkedDecoder(SIGNED, s)
    total = 0
    for i in range(0, len(body), 1000):
        total += sum(len(p) for p in dec.feed(body[i : i + 1000]))
        assert len(dec._buffer) < 65536
    dec.finish()
    assert total == dec.decoded_length == 8 * 65536


# -- construction ----------------------------------------------------------------

def test_unknown_mode_is_not_implemented() -> None:
    with pytest.raises(S3Error) as info:
        AwsChunkedDecoder("STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD")
    assert info.value.code == "NotImplemented"


def test_signed_mode_needs_a_signer() -> None:
    with pytest.raises(ValueError):
        AwsChunkedDecoder(SIGNED)


def test_finish_twice_and_feed_after_done() -> None:
    dec = AwsChunkedDecoder(UNSIGNED_TRAILER)
    dec.feed(b"0\r\n\r\n")
    dec.finish()
    dec.finish()
    assert dec.feed(b"") == []
    with pytest.raises(S3Error):
        dec.feed(b"0")
