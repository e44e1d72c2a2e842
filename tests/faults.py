"""A fault-injecting HTTP/1.1 proxy for tests, in front of an S3 store (moto).

``FaultProxy(target_url, Rates(...), seed=0)`` listens on a free 127.0.0.1
port, reads each request whole (head, then body by Content-Length or chunks)
and, drawing from a seeded ``random.Random``, lets it pass or injects one of:

- ``latency``: ``delay`` seconds first (drawn apart from the others);
- ``internal_error``, ``slow_down``, ``unavailable``: the proxy answers 500
  InternalError, 503 SlowDown or 503 ServiceUnavailable (S3's XML error
  body) without forwarding;
- ``reset_before``, ``reset_after``: the client connection is reset (RST,
  SO_LINGER 0) before forwarding, or after the store answered (the write
  happened, its answer is lost);
- ``truncate``: the head with the full Content-Length, part of the body, close;
- ``flip``: one to three bytes of the body XOR'd, length unchanged;
- ``flip_request``: a byte of the request body flipped. moto checks no
  digest, so the proxy does as S3: a body that no longer matches its
  Content-MD5, x-amz-checksum-crc32/sha1/sha256 or signed
  x-amz-content-sha256 gets 400 BadDigest; one without any digest is
  forwarded corrupted (counted as ``flip_request_stored``).

The faults exclude each other, their rates sum to at most 1; truncate and
flip touch only 2xx answers with a body. ``max_streak`` bounds the faults in
a row on one request (method, target, Range): with 2, the third try passes,
so a test of retries cannot flake. ``only(method, target)`` (``get_object``,
``put``, ``multipart``, ``listing`` below) limits faults to some operations.
``proxy.rates`` may be replaced at any time; ``injected`` counts faults by
kind, ``forwarded`` the requests sent on, ``requests`` lists every request
received as (method, target, Range).

``partition()`` cuts the store off: every request received from then on is
held, unanswered, until ``heal()``, which forwards them all (``held`` counts
them), as TCP delivers what it retransmits once a link is back: a request
may reach the store long after its client gave up on it. Standard library
only.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import random
import socket
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from urllib.parse import urlsplit

from awscrt.checksums import crc32c

ERRORS = {  # kind -> (status, S3 code, message)
    "internal_error": (500, "InternalError", "We encountered an internal error. Please try again."),
    "slow_down": (503, "SlowDown", "Please reduce your request rate."),
    "unavailable": (503, "ServiceUnavailable", "Service is unable to handle request."),
}
KINDS = (*ERRORS, "reset_before", "reset_after", "truncate", "flip", "flip_request")
_REASONS = {400: "Bad Request", 500: "Internal Server Error", 503: "Service Unavailable"}


def _path(target: str) -> list[str]:
    return [p for p in urlsplit(target).path.split("/") if p]


def get_object(method: str, target: str) -> bool:
    return method == "GET" and len(_path(target)) >= 2 and "uploadId=" not in target


def put(method: str, target: str) -> bool:
    """PutObject and UploadPart."""
    return method == "PUT" and len(_path(target)) >= 2


def multipart(method: str, target: str) -> bool:
    names = {pair.partition("=")[0] for pair in urlsplit(target).query.split("&")}
    return "uploadId" in names or "uploads" in names


def listing(method: str, target: str) -> bool:
    return method == "GET" and len(_path(target)) == 1


@dataclass(frozen=True)
class Rates:
    """Probability of each fault per request (see the module docstring)."""

    latency: float = 0.0
    delay: float = 0.05
    internal_error: float = 0.0
    slow_down: float = 0.0
    unavailable: float = 0.0
    reset_before: float = 0.0
    reset_after: float = 0.0
    truncate: float = 0.0
    flip: float = 0.0
    flip_request: float = 0.0
    max_streak: int | None = None
    only: Callable[[str, str], bool] | None = None

    def __post_init__(self) -> None:
        if sum(getattr(self, kind) for kind in KINDS) > 1.0 + 1e-9:
            raise ValueError("fault rates must sum to at most 1")
        if any((getattr(self, f.name) or 0) < 0 for f in fields(self) if f.name != "only"):
            raise ValueError("rates, delay and max_streak must be >= 0")


@dataclass
class _Message:
    """One request or response: its head lines, and once read, its body."""

    lines: list[str]
    raw: bytes  # as received: head, then the framed body
    body: bytes = b""

    def header(self, name: str) -> str:
        for line in self.lines[1:]:
            key, _, value = line.partition(":")
            if key.strip().lower() == name:
                return value.strip()
        return ""

    def encode(self, body: bytes) -> bytes:
        """The same head with ``body``, framed by Content-Length."""
        skip = ("content-length", "transfer-encoding", "expect")
        keep = [ln for ln in self.lines[1:] if ln.partition(":")[0].strip().lower() not in skip]
        return "\r\n".join([self.lines[0], *keep, f"Content-Length: {len(body)}", "", ""]).encode("latin-1") + body


async def _read_head(reader: asyncio.StreamReader) -> _Message | None:
    """The next message head; None if the stream ends between messages."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise
        return None
    return _Message(head.decode("latin-1").strip("\r\n").split("\r\n"), head)


async def read_body(reader: asyncio.StreamReader, msg: _Message, to_eof: bool) -> bool:
    """Read the body the head frames (with ``to_eof``, when the head gives
    no length, the rest of the stream: then True)."""
    raw, body = bytearray(msg.raw), bytearray()
    if "chunked" in msg.header("transfer-encoding").lower():
        while size := int((line := await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16):
            chunk = await reader.readexactly(size + 2)
            raw += line + chunk
            body += chunk[:-2]
        raw += line
        while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
            raw += trailer
        raw += trailer
    elif msg.header("content-length"):
        body += await reader.readexactly(int(msg.header("content-length")))
        raw += body
    elif to_eof:
        body += await reader.read()
        raw += body
    msg.raw, msg.body = bytes(raw), bytes(body)
    return to_eof and not msg.header("content-length") and not msg.header("transfer-encoding")


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0: the peer gets a TCP RST, not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _digest_refusal(request: _Message, body: bytes) -> str | None:
    """Why S3 would refuse ``body`` under the request's digests, or None."""
    digests = {
        "content-md5": lambda: hashlib.md5(body).digest(),
        "x-amz-checksum-crc32": lambda: zlib.crc32(body).to_bytes(4, "big"),
        "x-amz-checksum-crc32c": lambda: crc32c(body).to_bytes(4, "big"),
        "x-amz-checksum-sha1": lambda: hashlib.sha1(body).digest(),
        "x-amz-checksum-sha256": lambda: hashlib.sha256(body).digest(),
    }
    for name, digest in digests.items():
        if request.header(name) and request.header(name) != base64.b64encode(digest()).decode():
            return f"The {name} you specified did not match the body received."
    signed = request.header("x-amz-content-sha256")
    if len(signed) == 64 and signed != hashlib.sha256(body).hexdigest():
        return "The provided 'x-amz-content-sha256' header does not match what was computed."
    return None


def _error(status: int, code: str, message: str, target: str, head_only: bool = False) -> bytes:
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
        f"<Resource>{urlsplit(target).path}</Resource><RequestId>fault-proxy</RequestId></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/xml\r\n"
        f"x-amz-request-id: fault-proxy\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + (b"" if head_only else body)


class FaultProxy:
    """The proxy; a context manager running its event loop in a thread."""

    def __init__(self, target: str, rates: Rates | None = None, seed: int = 0) -> None:
        parts = urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rates = rates or Rates()
        self.random = random.Random(seed)
        self.injected: collections.Counter[str] = collections.Counter()
        self.forwarded = 0
        self.requests: list[tuple[str, str, str]] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._streaks: dict[tuple[str, str, str], int] = {}  # faults in a row, per request
        self._open = asyncio.Event()  # cleared while partitioned
        self._open.set()
        self.held = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.injected.items())) or "none"
        return f"faults injected: {kinds}; requests forwarded: {self.forwarded}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        start = asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def partition(self) -> None:
        """Hold every request from now on (see the module docstring)."""
        self._loop.call_soon_threadsafe(self._open.clear)

    def heal(self) -> None:
        """Forward the held requests, and every later one, again."""
        self._loop.call_soon_threadsafe(self._open.set)

    def _draw(self, method: str, target: str, range_: str) -> tuple[str, bool]:
        """This request's fault ("" for none) and whether it is delayed."""
        rates = self.rates
        if rates.only is not None and not rates.only(method, target):
            return "", False
        delayed = self.random.random() < rates.latency
        point, total, key = self.random.random(), 0.0, (method, target, range_)
        streak = self._streaks.pop(key, 0)
        if rates.max_streak is not None and streak >= rates.max_streak:
            return "", delayed
        for kind in KINDS:
            total += getattr(rates, kind)
            if point < total:
                self._streaks[key] = streak + 1
                return kind, delayed
        return "", delayed

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while (request := await _read_head(reader)) is not None:
                if request.header("expect").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                await read_body(reader, request, to_eof=False)
                answer, keep = await self._answer(request, writer)
                if answer:
                    writer.write(answer)
                    await writer.drain()
                if not keep:
                    break
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # a peer went away, or sent what this proxy cannot follow
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _answer(self, request: _Message, writer: asyncio.StreamWriter) -> tuple[bytes, bool]:
        """What the client gets for ``request``, and whether its connection
        stays open after that."""
        method, target = request.lines[0].split(" ")[:2]
        self.requests.append((method, target, request.header("range")))
        if not self._open.is_set():
            self.held += 1
            await self._open.wait()
        kind, delayed = self._draw(method, target, request.header("range"))
        if delayed:
            self.injected["latency"] += 1
            await asyncio.sleep(self.rates.delay)
        raw = request.raw
        if kind in ERRORS:
            self.injected[kind] += 1
            return _error(*ERRORS[kind], target, head_only=method == "HEAD"), True
        if kind == "reset_before":
            self.injected[kind] += 1
            _reset(writer)
            return b"", False
        if kind == "flip_request" and request.body:
            body = self._flip(request.body)
            refusal = _digest_refusal(request, body)
            self.injected[kind if refusal else "flip_request_stored"] += 1
            if refusal is not None:
                return _error(400, "BadDigest", refusal, target), True
            raw = request.encode(body)
        response = await self._exchange(raw, method)
        ok = response.lines[0].split(" ")[1].startswith("2") and response.body
        if kind == "reset_after":
            self.injected[kind] += 1
            _reset(writer)
            return b"", False
        if kind == "truncate" and ok:
            self.injected[kind] += 1
            return response.encode(response.body)[: -self.random.randint(1, len(response.body))], False
        if kind == "flip" and ok:
            self.injected[kind] += 1
            return response.encode(self._flip(response.body)), True
        return response.raw, response.header("connection").lower() != "close"

    async def _exchange(self, raw: bytes, method: str) -> _Message:
        """Send ``raw`` to the target, on a connection of its own; the
        response, read whole."""
        reader, writer = await asyncio.open_connection(*self.target, limit=1 << 20)
        try:
            writer.write(raw)
            await writer.drain()
            response = await _read_head(reader)
            while response is not None and response.lines[0].split(" ")[1].startswith("1"):
                response = await _read_head(reader)  # 1xx: interim, not for the client
            if response is None:
                raise ConnectionResetError("the target closed the connection")
            self.forwarded += 1
            if method != "HEAD" and response.lines[0].split(" ")[1] not in ("204", "304"):
                if await read_body(reader, response, to_eof=True):  # framed by the end of
                    response.raw = response.encode(response.body)  # the stream: give a length
            return response
        finally:
            writer.close()

    def _flip(self, body: bytes) -> bytes:
        data = bytearray(body)
        for _ in range(self.random.randint(1, 3)):
            data[self.random.randrange(len(data))] ^= self.random.randint(1, 255)
        return bytes(data)
