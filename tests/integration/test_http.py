"""HTTP-level behaviour clients rely on: virtual-host addressing and
Expect: 100-continue, exercised with signed raw requests."""

from __future__ import annotations

import socket

import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.conftest import make_client
from tests.servers import ACCESS_KEY, SECRET_KEY, Gateway


def signed_headers(method: str, url: str, body: bytes = b"", secret: str = SECRET_KEY, **headers: str) -> dict[str, str]:
    request = AWSRequest(method=method, url=url, data=body, headers=headers)
    S3SigV4Auth(Credentials(ACCESS_KEY, secret), "s3", "us-east-1").add_auth(request)
    out = dict(request.headers.items())
    out["Host"] = url.split("/")[2]  # what was signed; the socket goes to 127.0.0.1
    return out


def test_virtual_host_addressing(tmp_path) -> None:
    gw = Gateway(tmp_path / "data", extra_args=["--domain", "s3.tierstore.test"]).start()
    try:
        make_client(gw.endpoint).create_bucket(Bucket="vhost")
        host = f"vhost.s3.tierstore.test:{gw.port}"
        put = signed_headers("PUT", f"http://{host}/dir/obj.txt", b"virtual")
        response = httpx.put(f"{gw.endpoint}/dir/obj.txt", content=b"virtual", headers=put)
        assert response.status_code == 200, response.text
        # The same object through path style.
        got = make_client(gw.endpoint).get_object(Bucket="vhost", Key="dir/obj.txt")
        assert got["Body"].read() == b"virtual"
        listing = httpx.get(f"{gw.endpoint}/?list-type=2", headers=signed_headers("GET", f"http://{host}/?list-type=2"))
        assert listing.status_code == 200
        assert "<Key>dir/obj.txt</Key>" in listing.text
        # A Host outside the domain stays path style.
        plain = httpx.get(f"{gw.endpoint}/vhost/dir/obj.txt",
                          headers=signed_headers("GET", f"{gw.endpoint}/vhost/dir/obj.txt"))
        assert plain.content == b"virtual"
    finally:
        gw.stop()


def _request_head(method: str, path: str, gw: Gateway, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_status(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_expect_continue_refused_before_body_is_sent(gateway: Gateway, s3, bucket: str) -> None:
    url = f"{gateway.endpoint}/{bucket}/big"
    headers = signed_headers("PUT", url, b"", secret="wrong-secret", **{"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
    headers.update({"Content-Length": str(50 * 1024 * 1024), "Expect": "100-continue"})
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(_request_head("PUT", f"/{bucket}/big", gateway, headers))
        answer = _read_status(sock)
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
    assert b"100 Continue" not in answer


def test_expect_continue_accepted_then_body_stored(gateway: Gateway, s3, bucket: str) -> None:
    body = b"z" * 100_000
    url = f"{gateway.endpoint}/{bucket}/cont"
    headers = signed_headers("PUT", url, body)
    headers.update({"Content-Length": str(len(body)), "Expect": "100-continue"})
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(_request_head("PUT", f"/{bucket}/cont", gateway, headers))
        interim = _read_status(sock)
        assert interim.startswith(b"HTTP/1.1 100"), interim[:200]
        sock.sendall(body)
        final = _read_status(sock)
    assert final.startswith(b"HTTP/1.1 200"), final[:300]
    assert s3.get_object(Bucket=bucket, Key="cont")["Body"].read() == body
