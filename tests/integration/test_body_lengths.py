"""Body lengths no number can hold, against the real gateway: never a 500.

A fuzzed PUT (tests/integration/test_hostile.py) once drew an
``x-amz-decoded-content-length`` of 5,000 digits, past the interpreter's
``int()`` limit, and the memory budget's admission, which parsed it with
``int()``, answered 500 with a traceback. Every S3 number is parsed by
``gateway.s3.headers.decimal`` now; these keep the cases that crashed.
"""

from __future__ import annotations

import pytest

from tests.integration.test_hostile import s3_error, send_signed, sound
from tests.servers import Gateway


@pytest.mark.parametrize("value", ["7" * 5000, "\u00b2", "99999999999999999999999"])
def test_a_decoded_length_past_any_number_is_never_a_server_error(gateway: Gateway, bucket: str,
                                                                  value: str) -> None:
    """Thousands of digits (past the interpreter's int() limit), a digit
    str.isdigit() accepts and int() does not, a length past 2**64: on a
    chunked upload, a 400 in S3's XML and nothing stored; on a plain one,
    which has no use for it, whatever the body makes it; never a 500 (a
    fuzzer's find: the memory budget's admission parsed it with int())."""
    offset = len(gateway.log())
    framed = b"5\r\nhello\r\n0\r\n\r\n"
    chunked = send_signed(gateway, "PUT", f"/{bucket}/huge",
                          {"x-amz-decoded-content-length": value, "Content-Encoding": "aws-chunked"}, framed,
                          payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    sound(chunked, "PUT")
    assert chunked is not None and 400 <= chunked.status < 500, chunked
    s3_error(send_signed(gateway, "GET", f"/{bucket}/huge"), 404, "NoSuchKey")
    plain = send_signed(gateway, "PUT", f"/{bucket}/plain", {"x-amz-decoded-content-length": value},
                        b"body")
    sound(plain, "PUT")
    tail = gateway.log()[offset:]
    assert "Traceback" not in tail, tail[-3000:]
