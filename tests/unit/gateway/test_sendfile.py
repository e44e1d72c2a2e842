"""A body block sent from its file (gateway/serving/sendfile.py), over a socket pair:
after what was written before it, through a full socket buffer, and a
client gone in the middle."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest
import uvloop

from gateway.s3.http import ClientDisconnected
from gateway.serving.sendfile import send_region
from tiering.reads.plan import Region

MiB = 1024 * 1024

# The gateway runs uvloop, which lets nobody else watch its transport's
# descriptor; asyncio's own loop for comparison.
loops = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


async def _pair() -> tuple[asyncio.Transport, socket.socket]:
    """A transport on one end of a socket pair whose send buffer is small
    (sendfile meets a full socket many times), and the other end."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)
    theirs.setblocking(False)
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(asyncio.Protocol, ours)
    return transport, theirs  # type: ignore[return-value]


@loops
def test_a_region_follows_what_was_written_before_it(tmp_path: Path, run) -> None:  # type: ignore[no-untyped-def]
    async def go() -> None:
        loop = asyncio.get_running_loop()
        data = os.urandom(3 * MiB)
        (tmp_path / "piece").write_bytes(data)
        fd = os.open(tmp_path / "piece", os.O_RDONLY)
        transport, theirs = await _pair()
        try:
            transport.write(b"HEAD" * 50_000)  # more than the socket takes at once: it waits in the buffer
            sent = send_region(transport, Region(fd, 100, len(data) - 200))
            want = b"HEAD" * 50_000 + data[100:-100]
            got = bytearray()
            while len(got) < len(want):
                got += await loop.sock_recv(theirs, 256 * 1024)
                await asyncio.sleep(0.0005)  # a slow reader
            await sent
            assert got == want
        finally:
            os.close(fd)
            transport.close()
            theirs.close()

    run(go())


@loops
def test_a_client_gone_mid_region_aborts_the_connection(tmp_path: Path, run) -> None:  # type: ignore[no-untyped-def]
    async def go() -> None:
        loop = asyncio.get_running_loop()
        (tmp_path / "piece").write_bytes(os.urandom(8 * MiB))
        fd = os.open(tmp_path / "piece", os.O_RDONLY)
        transport, theirs = await _pair()
        try:
            sent = send_region(transport, Region(fd, 0, 8 * MiB))
            await loop.sock_recv(theirs, 64 * 1024)
            theirs.close()  # the client goes away with most of the region unsent
            with pytest.raises(ClientDisconnected):
                await sent
            assert transport.is_closing()
        finally:
            os.close(fd)

    run(go())


@loops
def test_a_file_shorter_than_its_region_cuts_the_answer_short(tmp_path: Path, run) -> None:  # type: ignore[no-untyped-def]
    async def go() -> None:
        loop = asyncio.get_running_loop()
        (tmp_path / "piece").write_bytes(b"x" * 1000)
        fd = os.open(tmp_path / "piece", os.O_RDONLY)
        transport, theirs = await _pair()
        try:
            sent = send_region(transport, Region(fd, 0, 5000))  # a torn cache file
            with pytest.raises(EOFError):
                await sent
            assert transport.is_closing()
            assert await loop.sock_recv(theirs, 10_000) == b"x" * 1000
        finally:
            os.close(fd)
            theirs.close()

    run(go())
