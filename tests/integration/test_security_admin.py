"""The admin API's door of a real gateway process.

- Every route of the admin app, hidden ones included, refuses the S3 secret,
  the access key and near misses of the admin token (test_admin.py covers no
  token, a wrong one and Basic auth); only the probes and the schema pages
  answer without it.
- The admin API (and the S3 port) listens on loopback unless configured
  otherwise.
"""

from __future__ import annotations

import base64
import functools
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.admin import build_admin_app, page
from gateway.config.values import Config
from gateway.observability.metrics import Metrics
from tests.servers import ACCESS_KEY, ADMIN_TOKEN, SECRET_KEY, Gateway

PUBLIC_ADMIN_ROUTES = {
    # Probes: load balancers and orchestrators call them without secrets;
    # they say "ok" or which check failed, nothing about the data.
    ("GET", "/health"), ("GET", "/ready"),
    # The schema and its two viewers describe the API; they hold no data.
    ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc"),
    # The status page's files: a shell with no data, which asks the API with
    # the token like any client (gateway/admin/page.py).
    *(("GET", route) for route in page.FILES),
}


# -- the admin API's token ------------------------------------------------------------


class _NoS3:
    started = False
    service = None
    metrics = Metrics()


@functools.cache
def _admin_routes() -> tuple[tuple[str, str], ...]:
    """Every (method, path) the admin app serves, from the app itself, so a
    route left out of the OpenAPI schema is found too. Routers included in
    routers are walked into (FastAPI keeps them as routes of their own)."""
    app = build_admin_app(Config(admin_token="unused"), _NoS3())

    def walk(routes: list[object]) -> Iterator[tuple[str, str]]:
        for route in routes:
            for method in getattr(route, "methods", None) or ():
                yield method, route.path  # type: ignore[attr-defined]
            included = getattr(route, "original_router", None)
            inner = getattr(route, "routes", None) or getattr(included, "routes", None)
            if inner:
                yield from walk(inner)

    return tuple(sorted(set(walk(app.routes))))


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def test_every_admin_route_is_in_the_schema_or_public(gateway: Gateway) -> None:
    with httpx.Client(base_url=gateway.admin_url, timeout=30) as admin:
        schema = admin.get("/openapi.json").json()
        documented = {(m.upper(), p) for p, ops in schema["paths"].items() for m in ops}
        served = {(m, re.sub(r":path\}", "}", p)) for m, p in _admin_routes() if m != "HEAD"}
        assert served - PUBLIC_ADMIN_ROUTES == documented - PUBLIC_ADMIN_ROUTES
        for method, path in sorted(PUBLIC_ADMIN_ROUTES):
            assert admin.request(method, path).status_code == 200, path
        # A method a path does not have gets no further than the method check,
        # and the 405 names every method the path has (RFC 9110, 15.5.6); a
        # concrete path goes before templated ones, as in OpenAPI (/jobs/flush
        # is the flush action, not GET /jobs/{job_id}).
        for path in sorted({p for _, p in served} - {p for _, p in PUBLIC_ADMIN_ROUTES}):
            url = _concrete(path)
            methods = {m for m, p in served if p == url} or {
                m for m, p in served if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", p), url)}
            for method in {"HEAD", "OPTIONS", "PUT", "PATCH", "POST"} - methods:
                response = admin.request(method, url)
                assert response.status_code == 405, (method, path, response.status_code)
                assert set(response.headers["allow"].split(", ")) == methods, (method, path, response.headers)


NEAR_MISSES = {
    "the S3 secret key": {"Authorization": f"Bearer {SECRET_KEY}"},
    "the S3 access key": {"Authorization": f"Bearer {ACCESS_KEY}"},
    "access key:secret key": {"Authorization": f"Bearer {ACCESS_KEY}:{SECRET_KEY}"},
    "a SigV4 header": {"Authorization": f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/20260101/us-east-1/s3/"
                                        "aws4_request, SignedHeaders=host, Signature=" + "0" * 64},
    "the token with a suffix": {"Authorization": f"Bearer {ADMIN_TOKEN}x"},
    "the token cut short": {"Authorization": f"Bearer {ADMIN_TOKEN[:-1]}"},
    "the token without a scheme": {"Authorization": ADMIN_TOKEN},
    "the token as Basic": {"Authorization": "Basic " + base64.b64encode(f"x:{ADMIN_TOKEN}".encode()).decode()},
    "the token elsewhere": {"X-Admin-Token": ADMIN_TOKEN, "X-Api-Key": ADMIN_TOKEN},
    "a bearer without a token": {"Authorization": "Bearer"},
}


@pytest.mark.parametrize("what", list(NEAR_MISSES))
def test_the_admin_api_takes_nothing_but_its_token(gateway: Gateway, what: str) -> None:
    headers = NEAR_MISSES[what]
    wrong = []
    with httpx.Client(timeout=30) as client:
        for method, path in _admin_routes():
            if path in {p for _, p in PUBLIC_ADMIN_ROUTES}:
                continue
            url = gateway.admin_url + _concrete(path)
            query = {"token": ADMIN_TOKEN, "access_token": ADMIN_TOKEN} if what == "the token elsewhere" else {}
            response = client.request(method, url, headers=headers, params=query)
            if response.status_code != 401 or response.json()["error"]["code"] != "Unauthorized" \
                    or not response.headers.get("www-authenticate", "").startswith("Bearer"):
                wrong.append(f"{method} {path}: {response.status_code} {response.text[:200]}")
    assert not wrong, f"with {what}:\n" + "\n".join(wrong)


def test_the_admin_token_opens_what_near_misses_do_not(gateway: Gateway) -> None:
    """The control for the test above: the same requests with the token pass."""
    response = httpx.get(f"{gateway.admin_url}/buckets", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 200 and "buckets" in response.json()


# -- where the admin port listens ----------------------------------------------------------


def _listeners(port: int) -> list[str]:
    """Local addresses of the sockets listening on ``port`` (from /proc/net)."""
    found = []
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, _, state = line.split()[1:4]
            address, _, port_hex = local.partition(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.append(_address(address))
    return found


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # /proc/net prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)


def test_the_admin_api_binds_loopback_by_default(gateway: Gateway) -> None:
    assert (Config().admin_host, Config().host) == ("127.0.0.1", "127.0.0.1")
    if not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp to read listening sockets from")
    for port in (gateway.admin_port, gateway.port):
        assert _listeners(port) == ["127.0.0.1"], (port, _listeners(port))


def _non_loopback_addresses() -> list[str]:
    found = set()
    try:
        found.update(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET))
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: picks the outgoing interface, sends nothing
            found.add(probe.getsockname()[0])
        except OSError:
            pass
    return sorted(a for a in found if not a.startswith("127.") and a != "0.0.0.0")


def test_the_admin_port_refuses_other_addresses_of_the_machine(gateway: Gateway) -> None:
    addresses = _non_loopback_addresses()
    if not addresses:
        pytest.skip("this machine has no address but loopback")
    for address in addresses:
        for port in (gateway.admin_port, gateway.port):
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=5).close()
