"""TLS: the server and client contexts both ports and https peers use, and the
start-up check of the configured certificate, key and CA bundle."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path

from gateway.client.admin import client_tls


def check_tls(
    cert: Path | None, key: Path | None, ca: Path | None, sources: Mapping[str, str]
) -> None:
    """The configured ``tls_cert``, ``tls_key`` and ``tls_ca`` (``sources``
    says where each came from): certificate and key both or neither, and
    loadable: a mistake here is one line at start, not a server that fails
    every handshake."""
    if (cert is None) != (key is None):
        given, missing = ("tls_cert", "tls_key") if key is None else ("tls_key", "tls_cert")
        raise ValueError(f"{given} is set (from {sources[given]}) but {missing} is not: set both")
    if cert is not None and key is not None:
        try:
            server_tls(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"cannot use tls_cert {cert} (from {sources['tls_cert']}) with tls_key "
                f"{key} (from {sources['tls_key']}): {_tls_reason(exc)}"
            ) from None
    if ca is not None:
        try:
            client_tls(ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"cannot use tls_ca {ca} (from {sources['tls_ca']}): {_tls_reason(exc)}"
            ) from None


def server_tls(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for ``cert`` (the chain) and ``key``, as uvicorn
    makes one (Python's default: TLS 1.2 at least)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def _tls_reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)  # e.g. KEY_VALUES_MISMATCH, NO_START_LINE
    return exc.strerror or str(exc)
