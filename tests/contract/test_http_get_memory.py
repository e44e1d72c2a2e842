"""Memory of the capacity store's own GET connections
(tiering/capacity/http_get.py): a connection the store closed must not
outlive it.

Each connection held a 256 KiB read buffer. A connection that cannot be
freed by reference counting (its httptools parser refers back to it: a
cycle) waits for the cycle collector, and the gateway collects its older
generations rarely (gateway/serving/process.py raises the youngest
generation's threshold to 20,000): under the soak's hostile mix, where the
store closes connections often, these buffers grew RssAnon by about
60 MiB a minute (docs/reliability.md, "Memory under a hostile mix"). The
connections of one event loop now share one read buffer.
"""

from __future__ import annotations

import asyncio
import gc

import pytest

from tiering.capacity.http_get import HttpGetPool, _Connection

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def live_connections() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, _Connection))


async def test_connections_the_store_closed_are_freed_without_the_cycle_collector(
        anyio_backend: str) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = HttpGetPool("127.0.0.1", port, tls=None, connections=4, connect_timeout=2.0, read_timeout=5.0)
    gc.collect()
    before = live_connections()
    gc.disable()  # as if the older generations were not collected for a while
    try:
        for n in range(20):
            assert (await pool.get(f"/b/k{n}", {"host": "h"}))[2] == b"ok"
        for _ in range(10):  # let connection_lost run for each
            await asyncio.sleep(0.01)
        kept = live_connections() - before
    finally:
        gc.enable()
        pool.close()
        server.close()
    # 20 connections of 256 KiB each, every one closed: none should be left.
    assert kept <= 1, f"{kept} closed connections still held (256 KiB each)"


async def test_the_connections_of_a_loop_share_one_read_buffer(anyio_backend: str) -> None:
    """Eight GETs at once on eight connections, their answers sent in small
    pieces that interleave: each body comes back whole and right, read
    through the one buffer the loop's connections share."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            name = head.split(b" ")[1].rsplit(b"/", 1)[1]
            body = name * 5000
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
            for at in range(0, len(body), 1000):  # pieces the other answers' pieces fall between
                writer.write(body[at:at + 1000])
                await writer.drain()
                await asyncio.sleep(0)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = HttpGetPool("127.0.0.1", port, tls=None, connections=8, connect_timeout=2.0, read_timeout=5.0)
    try:
        names = [f"k{n}".encode() for n in range(8)]
        for _ in range(3):
            answers = await asyncio.gather(*(pool.get(f"/b/{name.decode()}", {"host": "h"}) for name in names))
            assert [answer[2] for answer in answers] == [name * 5000 for name in names]
        connections = [o for o in gc.get_objects() if isinstance(o, _Connection) and not o.closed]
        assert len(connections) >= 8
        assert len({id(c._read.obj) for c in connections}) == 1  # one buffer, not 256 KiB each
    finally:
        pool.close()
        server.close()
