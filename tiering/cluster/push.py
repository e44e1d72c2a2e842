"""Telling the other nodes of a change, so that they follow it at once.

Gateways already talk to each other over their S3 API, signed with the
cluster's key pair (``peers.py``); a notice does the same: ``POST
/?peer-news=<what>`` with no body, signed SigV4 with this gateway's first
key pair, which every node of a cluster accepts as root, answered 204.
``what`` is ``segments`` (a writer committed or deleted segments, or took
a bucket's lease: ``news.py``) or ``identity`` (users, keys or policies
changed: ``tiering/identity/store.py``). The receiving gateway
(``gateway/handlers/news.py``) hands it to ``Cluster.nudge`` or
``Identities.nudge``; a request signed by anyone but root is refused.

Fire and forget: a notice goes to every other node at once (at most
``CONCURRENCY`` requests at a time), each with a short ``timeout``, and is
never sent again: a node that missed it finds the change at its next
conditional read of the follow head or the identities document (within
``follow_fallback``). Notices of one kind asked for while one of that kind
is going out are sent once more after it, not once each.

No connection is kept: notices go out once per flush or change, seconds
apart, so one opened for a notice and closed after it costs less than a
connection kept open to each of N-1 nodes.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Mapping

import aiohttp
from botocore.exceptions import ClientError

from tiering.capacity.s3_get import Keys, LeanGetter

log = logging.getLogger("tierstore.cluster")

NEWS = "peer-news"  # the query parameter naming what changed
SEGMENTS = "segments"
IDENTITY = "identity"
KINDS = (SEGMENTS, IDENTITY)
TIMEOUT = 2.0  # seconds to connect, and of silence waiting for the answer
CONCURRENCY = 16


class Pusher:
    """This node's notices to the other nodes."""

    def __init__(self, me: str, region: str, keys: Keys, tls: ssl.SSLContext | None = None,
                 timeout: float = TIMEOUT) -> None:
        self.me = me
        self._region = region
        self._keys = keys
        self._tls = tls
        self._timeout = timeout
        self._endpoints: Callable[[], Mapping[str, str]] = dict
        self._sending: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._closed = False
        self.sent = 0  # notices a node answered
        self.failed = 0  # notices that did not reach a node, or that it refused

    def use(self, endpoints: Callable[[], Mapping[str, str]]) -> None:
        """Where the nodes are when a notice goes out: node id -> S3
        endpoint (this node may be among them; it is skipped)."""
        self._endpoints = endpoints

    def push(self, what: str) -> None:
        """Tell every other node that ``what`` (one of ``KINDS``) changed."""
        if what not in KINDS:
            raise ValueError(f"unknown news {what!r}")
        if self._closed:
            return
        sending = self._sending.get(what)
        if sending is not None and not sending.done():
            self._again.add(what)
            return
        self._sending[what] = asyncio.create_task(self._send(what), name=f"tierstore notice {what}")

    async def _send(self, what: str) -> None:
        gate = asyncio.Semaphore(CONCURRENCY)
        while True:
            targets = {node: url for node, url in self._endpoints().items() if node != self.me}
            await asyncio.gather(*(self._one(gate, node, url, what) for node, url in sorted(targets.items())))
            if what not in self._again:
                return
            self._again.discard(what)

    async def _one(self, gate: asyncio.Semaphore, node: str, url: str, what: str) -> None:
        async with gate:
            getter = LeanGetter(url, self._region, self._fixed_keys, connections=1,
                                connect_timeout=self._timeout, read_timeout=self._timeout, tls=self._tls)
            try:
                await getter.start()
                await getter.post(Bucket="", query=f"{NEWS}={what}", body=b"")
                self.sent += 1
            except (ClientError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                self.failed += 1  # the node finds the change at its fallback read
                log.debug("notice %s to node %s at %s failed: %r", what, node, url, exc)
            finally:
                await getter.close()

    async def _fixed_keys(self) -> Keys:
        return self._keys

    async def close(self) -> None:
        """Stop, once the notices going out (a last flush's) had their
        ``timeout``; those still going out then are dropped."""
        self._closed = True
        if self._sending:
            await asyncio.wait(self._sending.values(), timeout=2 * self._timeout)
        for task in self._sending.values():
            task.cancel()
        await asyncio.gather(*self._sending.values(), return_exceptions=True)
        self._sending.clear()
