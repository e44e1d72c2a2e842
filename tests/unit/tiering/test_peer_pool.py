"""One connection budget for all of a node's peers (``PeerClient``'s
``connections``): however many peers there are and however many reads go
to them at once, the node holds at most that many connections; the
connections to a peer that left are closed once its grace is over.

The peers are small HTTP servers on loopback that answer every GET with
the same ten bytes and count the connections open to them."""

from __future__ import annotations

import asyncio

import pytest

from tiering.cluster import peers as peers_module
from tiering.cluster.peers import Keys, PeerClient, PeerGroup

BODY = b"0123456789"
ANSWER = (b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nContent-Range: bytes 0-9/10\r\n\r\n" + BODY)


class FakePeer:
    """An HTTP server that answers each request with ANSWER, keeping the connection."""

    def __init__(self) -> None:
        self.open = 0
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                    return  # closed by the client, or the server stopped
                self.requests += 1
                await asyncio.sleep(0.001)  # let other reads pile up meanwhile
                writer.write(ANSWER)
                await writer.drain()
        finally:
            self.open -= 1
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


async def settled(check: object, bound: int = 500) -> None:
    """Poll ``check()`` until it holds (the servers see closes a little later), at most ``bound`` times."""
    for _ in range(bound):
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    assert check()  # type: ignore[operator]


def test_connections_to_many_peers_stay_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    limit, count = 6, 20

    async def go() -> None:
        fakes = [FakePeer() for _ in range(count)]
        urls = [await fake.start() for fake in fakes]
        endpoints = {"me": "http://127.0.0.1:9", **{f"p{i:02d}": url for i, url in enumerate(urls)}}
        client = PeerClient(PeerGroup("me", endpoints), "us-east-1", Keys("AK", "SK", None), timeout=5.0,
                            connections=limit)
        await client.start()
        try:
            # 400 reads at once, spread over every peer, twice.
            for _ in range(2):
                got = await asyncio.gather(*(client.get(f"p{i % count:02d}", "b", "k", "etag", 0, 10)
                                             for i in range(400)))
                assert all(data == BODY for data in got)
            assert sum(fake.requests for fake in fakes) == 800
            assert client.budget.most <= limit
            assert client.budget.open <= limit
            await settled(lambda: sum(fake.open for fake in fakes) <= limit)

            # Half the peers leave: their connections close once the grace is over.
            staying = {n: u for n, u in endpoints.items() if n == "me" or int(n[1:]) < count // 2}
            await client.follow(staying)
            with monkeypatch.context() as later:  # the event loop's clock too: undone at once
                later.setattr(peers_module.time, "monotonic", lambda: 1e12)
                await client.follow(staying)
            await settled(lambda: sum(fake.open for fake in fakes[count // 2:]) == 0)
            assert client.budget.open == sum(fake.open for fake in fakes[: count // 2]) <= limit
        finally:
            await client.close()
            for fake in fakes:
                await fake.stop()
        assert client.budget.open == 0

    asyncio.run(go())
