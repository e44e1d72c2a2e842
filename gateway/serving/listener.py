"""uvicorn, run our way: listening sockets and the servers on them.

Every HTTP listener of the gateway (the S3 port, the admin port, the
writer's Unix socket for read workers, a read worker's S3 port) is a
:class:`Server` made by :func:`http_server`, run with :func:`running` on a
socket bound by :func:`listen`. uvicorn's own lifespan handling is off
(what a server serves is started and stopped by its process: see
gateway/server.py and gateway/workers/worker.py) and its signal capture is bypassed
for :func:`signals`: with two servers in one process, each would install its
own handlers and only the last one would hear the signal.

Abusive clients (heads that are slow or too large, bodies that stall) are
bounded below the application, by the protocol and the app wrapper that
:func:`http_server` puts in place: gateway/serving/client_bounds.py says how and why.
How a process is tuned before it serves (its loop, malloc, gc, descriptors)
is gateway/serving/process.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from typing import Any

import uvicorn

from gateway.config.values import Config
from gateway.serving.client_bounds import MAX_REQUEST_HEAD, BodyDeadline, Limits, bounded_protocol

# Idle keep-alive connections are kept longer than the clients keep theirs, so
# a pooled connection is closed by the client, not under a request it is
# sending (the same 75 s nginx uses; uvicorn's 5 s default causes resets).
KEEP_ALIVE_SECONDS = 75
# On shutdown, in-flight requests (a large GET, say) get this long to finish.
GRACEFUL_SHUTDOWN_SECONDS = 30
BACKLOG = 2048


class StartupError(Exception):
    """The gateway could not start serving (e.g. a port is in use)."""


class Server(uvicorn.Server):
    """A uvicorn server that leaves signals to :func:`signals` and says when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # signals() handles them for every server of the process

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.listening.set()

    @property
    def port(self) -> int:
        """The port actually bound (differs from the configured one for port 0)."""
        sockets = self.servers[0].sockets
        return int(sockets[0].getsockname()[1])


def http_server(app: Any, config: Config, *, s3: bool, tls: bool = True) -> Server:
    """A server for ``app``. An S3 app (``s3``) gets the bound on stalled
    bodies, and the requests refused below it are answered in S3 XML; the
    admin API's in uvicorn's plain text. With ``tls`` and a configured
    certificate it speaks TLS (uvicorn's ssl options); a process-local
    socket (the writer's, for read workers) passes ``tls=False``.

    A client that speaks plain HTTP to a TLS port fails the handshake and
    its connection is closed; asyncio logs that at debug level only, so a
    port scan or a misconfigured client costs no log spam."""
    if s3:
        app = BodyDeadline(app, config.client_timeout)
    return Server(_uvicorn_config(app, config, s3_errors=s3, tls=tls))


def _uvicorn_config(app: Any, config: Config, *, s3_errors: bool, tls: bool) -> uvicorn.Config:
    tls_files: dict[str, Any] = {}
    if tls and config.tls_cert is not None:
        tls_files = {"ssl_certfile": str(config.tls_cert), "ssl_keyfile": str(config.tls_key)}
    return Limits(
        app,
        client_timeout=config.client_timeout,
        s3_errors=s3_errors,
        lifespan="off",  # what the app serves is started and stopped by its process
        interface="asgi3",
        loop="none",  # the loop is ours (run_loop() or the caller's)
        http=bounded_protocol(),
        ws="none",
        log_level=config.log_level,
        # Off for both: uvicorn's access logger is one process-wide logger, so
        # it cannot be on for admin and off for S3; a structured access log
        # of our own replaces it.
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        h11_max_incomplete_event_size=MAX_REQUEST_HEAD,
        backlog=BACKLOG,
        # The app names itself; uvicorn's header would be a second Server line.
        server_header=False,
        # botocore corrects its clock skew from the Date of responses.
        date_header=True,
        **tls_files,
    )


def listen(host: str, port: int, label: str, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """Bind and listen; a failure becomes one readable line. With
    ``reuse_port``, other processes may listen on the same port (SO_REUSEPORT:
    read workers), and the kernel spreads connections over them; a socket
    bound but not ``listen``ing holds the port and gets no connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    dualstack = family == socket.AF_INET6 and host == "::" and socket.has_dualstack_ipv6()
    try:
        if listen:
            return socket.create_server(
                (host, port), family=family, backlog=BACKLOG, dualstack_ipv6=dualstack, reuse_port=reuse_port
            )
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if dualstack:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((host, port))
        except BaseException:
            sock.close()
            raise
        return sock
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise StartupError(
            f"cannot listen for {label} on {authority(host, port)}: {reason}"
        ) from exc


def authority(host: str, port: int) -> str:
    """``host:port``, with IPv6 literals in brackets (RFC 3986)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@contextlib.asynccontextmanager
async def running(
    server: Server, sock: socket.socket, label: str
) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``server`` on ``sock`` as a task while the block runs; stop it after."""
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"tierstore {label} server")
    try:
        await first_of(server.listening.wait(), task)
        if not server.listening.is_set():
            task.result()  # raises what stopped it, if anything
            raise StartupError(f"the {label} server stopped during start-up")
        yield task
    finally:
        server.should_exit = True
        await task  # uvicorn drains connections, then returns (or raises)


async def first_of(*waitables: Awaitable[Any]) -> None:
    """Wait until the first of ``waitables`` finishes; cancel the coroutines."""
    tasks = [asyncio.ensure_future(w) for w in waitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task, waitable in zip(tasks, waitables, strict=True):
            if task is not waitable:  # ours to cancel; passed-in tasks are not
                task.cancel()


@contextlib.contextmanager
def signals(stop: asyncio.Event, servers: Sequence[uvicorn.Server]) -> Iterator[None]:
    """SIGINT/SIGTERM set ``stop``; a second SIGINT also drops open connections."""
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set() and sig == signal.SIGINT:
            for server in servers:
                server.force_exit = True
        stop.set()

    installed: list[tuple[signal.Signals, Any]] = []
    # Signal handlers can only be installed from the main thread.
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, on_signal, sig)
            except (NotImplementedError, RuntimeError):  # e.g. Windows event loops
                continue
            installed.append((sig, previous))
    try:
        yield
    finally:
        for sig, previous in installed:
            loop.remove_signal_handler(sig)
            if previous is not None:  # None: installed from C, cannot restore
                signal.signal(sig, previous)
