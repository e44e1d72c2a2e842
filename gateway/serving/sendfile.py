"""A hot body's blocks sent from their files by the kernel (``sendfile``).

A hot GET of a large object read each MiB of its cache file into a new
buffer in the pool (``pread``: a copy, and fresh pages for the buffer)
and wrote it to the socket (a second copy, in the kernel). With
``sendfile(2)`` the kernel moves the file's page-cache pages to the socket
itself: no buffer, no copy in Python's process, one pool call for as much
as the socket takes at once.

How it fits uvicorn, which knows nothing of files: uvicorn writes a body
block with ``transport.write(block)``, after ``len(block)`` for its
Content-Length accounting, and the S3 listener's transport is ours
(``gateway/serving/client_bounds.py``, ``_HeadsWithBodies``). A
``tiering.reads.plan.Region`` (a descriptor, an offset and a length, whose
``len()`` is its length) written to it is sent by :func:`send_region`; the
response (``gateway/s3/http.py``) awaits ``region.sent`` before it asks the
body for the next block, so nothing else is written meanwhile and the
descriptor stays open until the kernel has taken the bytes.

- **Only on a plain socket.** TLS needs the bytes in this process to
  encrypt them. The listener's protocol puts the ``tierstore.blocks``
  extension in a request's scope only on a connection without TLS (and
  with uvicorn's httptools protocol, whose writes are the plain
  ``transport.write`` above); a GET asks tiering for such blocks only then
  (``Read.blocks``).
- **In order.** Whatever was written before (the response's head) must
  have left the transport's buffer first: uvloop writes to the socket at
  once when it can, so the buffer is empty at once but for a client that
  has not read an earlier answer; then this waits.
- **Never on the event loop.** ``sendfile`` reads the file's pages, which
  may have to come from the disk: it runs in the pool, on a non-blocking
  duplicate of the socket's descriptor, as many bytes as the socket takes.
  A full socket that takes bytes again within 5 ms (a client reading as
  fast as it can) is waited for in the pool thread; one that stays full
  longer (a slow client) is waited for by the event loop, so a slow client
  never holds a pool thread. uvloop does not let anyone else watch the
  descriptor its transport owns, so the watch is on the duplicate, which
  also keeps the socket open while a pool thread uses it, whatever the
  transport does meanwhile.
- **Failures.** A client gone mid-region (EPIPE, ECONNRESET) aborts the
  connection and ``region.sent`` raises ``ClientDisconnected``; a file
  shorter than the region (a cache file torn under its descriptor) aborts
  it too (``EOFError``), as any body cut short: the client sees fewer
  bytes than the Content-Length. A cancelled send waits for its pool call
  to end before the descriptors it uses can be closed.
"""

from __future__ import annotations

import asyncio
import os
import select
from typing import Any

from gateway.s3.http import ClientDisconnected
from tiering import pool
from tiering.reads.plan import Region

# Bytes asked of one sendfile call (the kernel caps a call near 2 GiB).
_STEP = 1 << 30
# How often to look again while what was written before a region drains.
_DRAIN_POLL = 0.001
# How long a pool thread waits for a full socket to take bytes again before
# it leaves the wait to the event loop (ms).
_BRIEF_WAIT_MS = 5


def send_region(transport: Any, region: Region) -> asyncio.Task[None]:
    """Send ``region`` on ``transport``'s socket, after what was written to
    it before; the task ends once the kernel has all of its bytes."""
    return asyncio.ensure_future(_send(transport, region))


async def _send(transport: Any, region: Region) -> None:
    try:
        while transport.get_write_buffer_size():
            if transport.is_closing():
                raise ClientDisconnected()
            await asyncio.sleep(_DRAIN_POLL)
        sock = transport.get_extra_info("socket")
        if sock is None or transport.is_closing():
            raise ClientDisconnected()
        out = os.dup(sock.fileno())
    except BaseException:
        transport.abort()
        raise
    try:
        offset, left = region.offset, region.count
        while left:
            sent, full = await _pooled(out, region.fd, offset, left)
            offset += sent
            left -= sent
            if full:
                await _writable(out)
            elif not sent and left:
                raise EOFError(f"{region}: the file ended {left} bytes early")
    except OSError as exc:  # EPIPE, ECONNRESET: the client is gone
        transport.abort()
        raise ClientDisconnected(str(exc)) from exc
    except BaseException:
        transport.abort()  # cut short: the rest of the answer cannot follow
        raise
    finally:
        os.close(out)


async def _pooled(out: int, fd: int, offset: int, count: int) -> tuple[int, bool]:
    """``_sendfile`` in the pool. Cancelled, it still waits for the call to
    end before it raises: the call uses both descriptors, which are closed
    (and their numbers free for any new file) once this returns."""
    call = asyncio.ensure_future(pool.run(_sendfile, out, fd, offset, count))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        await asyncio.wait([call])
        raise


def _sendfile(out: int, fd: int, offset: int, count: int) -> tuple[int, bool]:
    """Blocking: as many of ``count`` bytes as the socket ``out`` takes; a
    full socket that takes bytes again within ``_BRIEF_WAIT`` (a client
    reading as fast as it can) is waited for here, without a trip through
    the event loop and back. (bytes sent, whether it stopped because the
    socket stayed full: a slower client, waited for on the loop instead, so
    it never holds a pool thread.)"""
    sent = 0
    poller: select.poll | None = None
    while count:
        try:
            n = os.sendfile(out, fd, offset, min(count, _STEP))
        except BlockingIOError:
            if poller is None:
                poller = select.poll()
                poller.register(out, select.POLLOUT)
            if not poller.poll(_BRIEF_WAIT_MS):
                return sent, True
            continue
        if not n:  # the file ended
            break
        sent += n
        offset += n
        count -= n
    return sent, False


async def _writable(fd: int) -> None:
    """Until the socket ``fd`` takes bytes again (or fails: the next send says)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_writer(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_writer(fd)
