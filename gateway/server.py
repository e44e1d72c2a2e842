"""Process start-up: one event loop serving the S3 port and the admin port.

:func:`serve` is the gateway's composition root: it builds the node
(``gateway.node.Node``: configuration, metrics, access log, the tiering node)
once, and hands it to the S3 app, the admin API and, with ``--workers``, the
read workers' lookup server. It runs two servers (``gateway.serving.listener``) side
by side. Order, and why:

1. Bind both listening sockets first, so a busy port fails before the data
   directory is opened, with a one-line :class:`StartupError`.
2. Start the admin server, then the node: while the data plane opens
   (crash recovery may take a while) ``GET /health`` answers 503, so a probe
   can tell "starting" from "dead".
3. Start the S3 server (or the read workers); once both listen, print the
   banner and call ``on_ready(s3_port, admin_port)`` with the real ports
   (port 0 picks one).
4. On SIGINT/SIGTERM, or when ``stop`` is set, unwind in reverse: stop the S3
   server (drain in-flight requests), stop the node, stop the admin server.
   A second SIGINT stops waiting for open connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from gateway.admin import NodeStatus, build_admin_app
from gateway.client.sources import stored_secrets
from gateway.config.sizes import size
from gateway.config.values import HOT_CAP, HOT_SHARE, Config
from gateway.serving import listener, process
from gateway.serving.listener import StartupError, authority
from gateway.version import VERSION

if TYPE_CHECKING:
    from tiering.identity.store import Identities


class Root(NodeStatus, Protocol):
    """The gateway's node as serve() drives it (``gateway.node.Node``): what
    the admin API reads, and its life."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def workers_listening(self) -> None: ...

    @property
    def identities(self) -> Identities | None:
        """Users, keys and policies, pushed to the read workers as they change."""


# The S3 data plane as serve() runs it: the node, and the ASGI app serving from it.
DataPlane = Callable[[Config], tuple[Root, Any]]


def gateway_plane(config: Config) -> tuple[Root, Any]:
    """The node, and the S3 app it is handed to."""
    # Imported late so this module (and the admin API) can be tested with a
    # fake data plane, and so `tierstore --version` stays fast.
    from gateway.app import S3App
    from gateway.node import Node

    node = Node(config)
    return node, S3App(config, node, node.metrics, node.access_log, node.memory)


async def serve(
    config: Config,
    *,
    on_ready: Callable[[int, int], None] | None = None,
    stop: asyncio.Event | None = None,
    data_plane: DataPlane = gateway_plane,
) -> None:
    """Serve S3 and the admin API until a signal arrives or ``stop`` is set."""
    stop = stop if stop is not None else asyncio.Event()
    # With read workers, they listen on the S3 port and this process only
    # holds it (bound, not listening: the kernel gives it no connections).
    s3_sock = listener.listen(config.host, config.port, "S3", reuse_port=config.workers > 1,
                              listen=config.workers == 1)
    with contextlib.closing(s3_sock):
        admin_sock = listener.listen(config.admin_host, config.admin_port, "admin API")
        with contextlib.closing(admin_sock):
            node, s3_app = data_plane(config)
            s3_server = listener.http_server(s3_app, config, s3=True)
            admin_server = listener.http_server(build_admin_app(config, node), config, s3=False)
            with listener.signals(stop, [s3_server, admin_server]):
                await _serve(
                    config, node, s3_app, (s3_server, s3_sock), (admin_server, admin_sock), stop, on_ready
                )


async def _serve(
    config: Config,
    node: Root,
    s3_app: Any,
    s3_listener: tuple[listener.Server, socket.socket],
    admin_listener: tuple[listener.Server, socket.socket],
    stop: asyncio.Event,
    on_ready: Callable[[int, int], None] | None,
) -> None:
    # The exit stack unwinds in reverse: S3 server, node, admin.
    async with contextlib.AsyncExitStack() as stack:
        admin_task = await stack.enter_async_context(listener.running(*admin_listener, "admin API"))
        await node.start()
        stack.push_async_callback(node.stop)
        if stop.is_set():  # a signal arrived during a long start-up
            return
        s3_port, admin_port = s3_listener[1].getsockname()[1], admin_listener[0].port
        if config.workers > 1:
            s3_task = await _start_read_workers(config, node, s3_app, s3_port, stack)
        else:
            s3_task = await stack.enter_async_context(listener.running(*s3_listener, "S3"))
        print(banner(config, s3_port, admin_port), flush=True)
        if on_ready is not None:
            on_ready(s3_port, admin_port)
        # A server that ends by itself (it crashed) takes the process down too.
        await listener.first_of(stop.wait(), admin_task, s3_task)


async def _start_read_workers(
    config: Config, node: Root, s3_app: Any, port: int, stack: contextlib.AsyncExitStack
) -> asyncio.Task[None]:
    """The writer's Unix socket for the requests workers pass on (its own S3
    app), the lookup socket, and ``config.workers`` worker processes on the
    S3 port; all stopped by ``stack``, workers first. Returns the task of
    the writer's socket server."""
    from gateway.workers.supervisor import read_workers, socket_dir
    from gateway.workers.worker import WorkerSetup
    from tiering.index.generations import Generations

    tiering = node.tiering
    if tiering is None:
        raise StartupError("read workers need the gateway's object service")
    sockets = stack.enter_context(socket_dir())
    writer_path = str(sockets / "writer.sock")
    writer_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stack.callback(writer_sock.close)
    writer_sock.bind(writer_path)
    writer_sock.listen(listener.BACKLOG)
    writer_server = listener.http_server(s3_app, config, s3=True, tls=False)  # a local socket
    task = await stack.enter_async_context(listener.running(writer_server, writer_sock, "writer socket"))
    # Every write of an object's record moves its key's counter in this
    # table, which workers read to know their kept lookups still hold.
    generations = Generations(sockets / "generations", create=True)
    records = tiering.index.records
    records.share(generations)
    stack.callback(generations.close)
    stack.callback(records.share, None)
    setup = WorkerSetup(replace(config, port=port), str(sockets / "lookup.sock"), writer_path,
                        str(sockets / "generations"))
    await stack.enter_async_context(read_workers(setup, tiering.objects, node.metrics, config.workers,
                                                 node.identities))
    node.workers_listening()  # /health: 503 until now
    return task


def run(config: Config) -> None:
    """Run :func:`serve` on a fresh event loop (uvloop when installed)."""
    process.run_loop(serve(config))


# --------------------------------------------------------------------------
# Banner


def banner(config: Config, s3_port: int, admin_port: int) -> str:
    """What a newcomer needs to point a client at this gateway.

    Secrets are shown only when the gateway generated them (the user has no
    other way to learn them); configured ones stay out of logs.
    """
    try:
        generated = stored_secrets(config.data_dir)
    except ValueError:
        generated = {}
    keys = f"  access key: {'(none configured)'}"
    if config.credentials:
        access_key, secret_key = next(iter(config.credentials.items()))
        is_generated = (generated.get("access_key"), generated.get("secret_key")) == (
            access_key,
            secret_key,
        )
        shown = secret_key if is_generated else "(as configured)"
        more = len(config.credentials) - 1
        keys = f"  access key: {access_key}   secret key: {shown}"
        keys += f"   (+{more} more key pairs)" if more else ""
    token = config.admin_token
    shown_token = token if token and generated.get("admin_token") == token else "(as configured)"
    scheme = config.scheme
    return "\n".join(
        [
            f"tierstore {VERSION} serving S3 at {scheme}://{authority(config.host, s3_port)}"
            f"  (region {config.region})",
            keys,
            f"  admin API: {scheme}://{authority(config.admin_host, admin_port)}"
            f"  (token: {shown_token})",
            f"  data: {config.data_dir}  capacity: {config.capacity_url}"
            + (f" at {config.capacity_endpoint}" if config.capacity_endpoint else ""),
            f"  hot tier: {_hot_tier(config)}",
            f"  free-space floor: {_floor(config)}",
        ]
        + ([f"  TLS: certificate {config.tls_cert}"] if config.tls_cert is not None else [])
    )


def _floor(config: Config) -> str:
    """The free space the hot tier leaves, and where it came from when nobody set it."""

    if not config.free_floor_from:
        return size(config.free_floor)
    return (f"{size(config.free_floor)} (of the data dir's {size(config.free_floor_from)} filesystem; "
            "--free-floor sets it)")


def _hot_tier(config: Config) -> str:
    """The budget, and where it came from when nobody set it."""

    if not config.hot_size_from:
        return size(config.hot_size)
    share = f"{HOT_SHARE:.0%}"
    return (f"{size(config.hot_size)} ({share} of the data dir's {size(config.hot_size_from)} "
            f"filesystem, at most {size(HOT_CAP)}; --hot-size sets it)")
