"""The capacity store's own HTTP/1.1 GETs (tiering/capacity/http_get.py)
against a scripted server on loopback: kept-alive connections, the ways an
answer is framed, and every way one can fail."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from tests.tls import make_pki
from tiering.capacity.http_get import BadAnswer, HttpGetPool

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body


class Server:
    """Answers each request with ``handler(reader, writer, n)`` (n counts
    requests over all connections; False closes the connection)."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.connections = 0
        self.requests = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"GET /")
                self.requests += 1
                if not await self.handler(reader, writer, self.requests):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def pool_for(server: Server, **options: float) -> AsyncIterator[HttpGetPool]:
    pool = HttpGetPool("127.0.0.1", server.port, tls=None, connections=int(options.pop("connections", 4)),
                       connect_timeout=2.0, read_timeout=options.pop("read_timeout", 5.0))
    try:
        yield pool
    finally:
        pool.close()


async def test_answers_reuse_one_kept_alive_connection(anyio_backend: str) -> None:
    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(answer(f"body {n}".encode(), "ETag: \"abc\"", "X-Amz-Meta-Two: a", "x-amz-meta-two: b"))
        return True

    async with Server(handler) as server:
        async for pool in pool_for(server):
            for n in range(1, 6):
                status, headers, body = await pool.get(f"/b/k{n}", {"host": "h"})
                assert (status, body) == (200, f"body {n}".encode())
                assert headers["etag"] == '"abc"' and headers["x-amz-meta-two"] == "a, b"
    assert (server.connections, server.requests) == (1, 5)


async def test_chunked_close_delimited_and_closing_answers(anyio_backend: str) -> None:
    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:  # chunked, kept alive
            w.write(b"HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
            return True
        if n == 2:  # says it closes
            w.write(answer(b"bye", "Connection: close"))
            return False
        w.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")  # ends where the connection does
        return False

    async with Server(handler) as server:
        async for pool in pool_for(server):
            assert await pool.get("/a", {}) == (206, {"transfer-encoding": "chunked"}, b"hello world")
            assert (await pool.get("/b", {}))[2] == b"bye"
            assert (await pool.get("/c", {}))[2] == b"until the end"
    assert server.connections == 2


async def test_a_kept_connection_the_store_closed_is_replaced(anyio_backend: str) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        if n == 2:
            return False  # the store drops the idle connection as the next request arrives
        w.write(answer(b"ok"))
        return True

    async with Server(handler) as server:
        async for pool in pool_for(server):
            assert (await pool.get("/1", {}))[2] == b"ok"
            assert (await pool.get("/2", {}))[2] == b"ok"  # sent again on a new connection
    assert (server.connections, server.requests) == (2, 3)


@pytest.mark.parametrize(("sent", "error"), [
    (b"", ConnectionResetError),  # a new connection closed before any answer
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", ConnectionResetError),
    (b"SSH-2.0-OpenSSH\r\n\r\n", BadAnswer),
])
async def test_answers_cut_short_or_not_http_fail(anyio_backend: str, sent: bytes, error: type) -> None:
    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        w.write(sent)
        return False

    async with Server(handler) as server:
        async for pool in pool_for(server):
            with pytest.raises(error):
                await pool.get("/x", {})
            assert not pool._idle  # noqa: SLF001  nothing broken kept


async def test_silence_times_out_and_a_slow_trickle_does_not(anyio_backend: str) -> None:
    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:
            await asyncio.sleep(1.0)  # nothing at all for longer than the read timeout
            return False
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")
        for byte in b"slow":  # a byte every 0.2 s: 0.8 s in all, never 0.4 s silent
            await w.drain()
            await asyncio.sleep(0.2)
            w.write(bytes([byte]))
        return True

    async with Server(handler) as server:
        async for pool in pool_for(server, read_timeout=0.4):
            with pytest.raises(TimeoutError):
                await pool.get("/silent", {})
            assert (await pool.get("/slow", {}))[2] == b"slow"


async def test_at_most_so_many_connections_at_once(anyio_backend: str) -> None:
    busy = 0
    most = 0

    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        nonlocal busy, most
        busy += 1
        most = max(most, busy)
        await asyncio.sleep(0.02)
        busy -= 1
        w.write(answer(b"x"))
        return True

    async with Server(handler) as server:
        async for pool in pool_for(server, connections=3):
            answers = await asyncio.gather(*(pool.get(f"/{i}", {}) for i in range(12)))
            assert all(body == b"x" for _, _, body in answers)
    assert most == 3 and server.connections == 3


async def test_a_cancelled_get_leaves_no_connection_behind(anyio_backend: str) -> None:
    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:
            await asyncio.sleep(0.5)
        w.write(answer(f"answer {n}".encode()))
        return True

    async with Server(handler) as server:
        async for pool in pool_for(server):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await pool.get("/slow", {})
            # The late answer to the cancelled GET is never taken for the next one's.
            assert (await pool.get("/next", {}))[2] == b"answer 2"
    assert server.connections == 2


async def test_an_https_store_is_verified_against_the_ca_it_was_given(anyio_backend: str, tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(pki.cert, pki.key)

    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(answer(f"secret {n}".encode()))
        return True

    async with Server(handler, tls=served) as server:
        trusting = HttpGetPool("127.0.0.1", server.port, tls=ssl.create_default_context(cafile=pki.ca),
                               connections=2, connect_timeout=2.0, read_timeout=5.0)
        try:
            for n in (1, 2):  # the second on the kept TLS connection
                assert (await trusting.get("/b/k", {"host": "127.0.0.1"}))[2] == f"secret {n}".encode()
        finally:
            trusting.close()
        doubting = HttpGetPool("127.0.0.1", server.port, tls=ssl.create_default_context(cafile=pki.other_ca),
                               connections=2, connect_timeout=2.0, read_timeout=5.0)
        try:
            with pytest.raises(ssl.SSLCertVerificationError):  # an OSError: the store's retry policy sees it
                await doubting.get("/b/k", {"host": "127.0.0.1"})
        finally:
            doubting.close()
    assert server.connections == 1  # one kept connection; the refused handshake never got to the handler
