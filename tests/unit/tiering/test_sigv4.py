"""The SigV4 arithmetic shared by the verifier and the capacity client."""

from __future__ import annotations

import hmac

from hypothesis import given
from hypothesis import strategies as st

from tiering.capacity.sigv4 import signature, signing_key


@given(st.binary(max_size=200), st.text(max_size=300))
def test_signature_is_hmac_sha256(key: bytes, message: str) -> None:
    expected = hmac.digest(key, message.encode("utf-8", "surrogateescape"), "sha256").hex()
    assert signature(key, message) == expected
    assert signature(key, message) == expected  # again, from the cached pads


def test_signing_key_is_the_documented_chain() -> None:
    # kSigning = HMAC chain over the date, region, service and terminator.
    key = hmac.digest(b"AWS4wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", b"20150830", "sha256")
    for part in (b"us-east-1", b"s3", b"aws4_request"):
        key = hmac.digest(key, part, "sha256")
    assert signing_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20150830", "us-east-1") == key
