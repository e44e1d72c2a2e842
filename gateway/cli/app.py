"""The ``tierstore`` command line (console script and ``python -m gateway``).

This module holds the app and the commands that run on the gateway's own
machine and data dir (``serve``, ``recover``, ``check``, ``env``); the commands that
talk to a running gateway are in ``gateway/cli/admin.py`` (docs/cli.md).

Flags default to None so that "not given" is distinguishable from a value and
the environment and the --config file can fill in (see ``gateway/config/values.py``).
Errors a user can fix print one line on stderr, never a traceback: exit 2 for
a bad configuration, 1 when the gateway cannot start.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from gateway.cli import admin as admin_commands
from gateway.cli import mounts as mount_commands
from gateway.cli import prefetch as prefetch_commands
from gateway.cli import users as user_commands
from gateway.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, fail, option, with_options
from gateway.client.target import resolve_s3, resolve_target
from gateway.config.settings import COERCERS
from gateway.config.values import Config, check_serving, load_config
from gateway.version import VERSION

# Set by main(): this process is the tierstore program (and serve may run
# itself again on another allocator), not a caller of the CLI in its own.
_PROGRAM = False

app = typer.Typer(
    name="tierstore",
    help="S3-compatible gateway: training data hot on local NVMe, tiered to an object store.",
    no_args_is_help=True,
    add_completion=False,
    # Locals in a traceback would include keys and tokens.
    pretty_exceptions_show_locals=False,
)

GATEWAY_PANEL = "Gateway"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"tierstore {VERSION}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", callback=_show_version, is_eager=True
        ),
    ] = False,
) -> None:
    """S3-compatible gateway: training data hot on local NVMe, tiered to an object store."""


# Help texts avoid square brackets: typer renders them as rich markup.
# The flags of `serve` and `recover`, grouped into SERVE_OPTIONS etc. below.
Host = Annotated[str | None, typer.Option(help="S3 listen address. (default: 127.0.0.1)")]
Port = Annotated[int | None, typer.Option(help="S3 port; 0 picks a free one. (default: 9100)")]
AdminHost = Annotated[
    str | None, typer.Option(help="Admin API listen address. (default: 127.0.0.1)")
]
AdminPort = Annotated[int | None, typer.Option(help="Admin API port. (default: 9101)")]
DataDir = Annotated[
    Path | None, typer.Option(help="Hot tier and local state. (default: ./tierstore-data)")
]
HotSize = Annotated[
    str | None,
    typer.Option(help="Hot tier budget in bytes, K/M/G/T suffixes. (default: half the size of the "
                 "data dir's filesystem, at most 1T)"),
]
FreeFloor = Annotated[
    str | None,
    typer.Option(help="Free space the hot tier leaves on its filesystem: below it, cache is evicted "
                 "and writes that do not fit are refused (503 SlowDown, or 507 when nothing can be freed). "
                 "(default: 2% of the filesystem, at least 256M, at most 16G and a quarter of it)"),
]
MemoryLimit = Annotated[
    str | None,
    typer.Option(help="Memory budget of the gateway process, K/M/G/T suffixes, or none: near it caches are "
                 "shrunk, at it new S3 requests get 503 SlowDown. (default: the container's cgroup memory "
                 "limit, if any)"),
]
CacheSizes = Annotated[
    str | None,
    typer.Option(help="Bounds in bytes of the in-memory caches, cache=size pairs separated by commas, e.g. "
                 "records=256M,heads=16M; caches: records, heads, tar_headers, batch_places, decisions, "
                 "memos. (default: a share of the machine's memory or of --memory-limit each)"),
]
Capacity = Annotated[
    str | None,
    typer.Option(
        help="Capacity store: file:///dir, s3://bucket or s3://bucket/prefix. "
        "(default: a directory under --data-dir)"
    ),
]
CapacityEndpoint = Annotated[
    str | None, typer.Option(help="URL of a non-AWS S3 capacity store (MinIO, Ceph RGW).")
]
CapacityRegion = Annotated[str | None, typer.Option(help="Region of the capacity store.")]
CapacityAccessKey = Annotated[
    str | None, typer.Option(help="Capacity store access key. (default: botocore chain)")
]
CapacitySecretKey = Annotated[
    str | None,
    typer.Option(help="Capacity store secret key (prefer TIERSTORE_CAPACITY_SECRET_KEY)."),
]
Region = Annotated[
    str | None, typer.Option(help="Region reported to clients. (default: us-east-1)")
]
Domain = Annotated[
    str | None, typer.Option(help="Domain for virtual-host style: <bucket>.<domain>.")
]
ConfigFile = Annotated[
    Path | None, typer.Option("--config", help='TOML file of settings, e.g. hot_size = "512G".')
]
SmallObjectSize = Annotated[
    str | None,
    typer.Option(help="Objects up to this size are packed into shared segments. (default: 4M)"),
]
PartSize = Annotated[
    str | None,
    typer.Option(
        help="Larger objects are split into extents of this size, at least 5M. (default: 8M)"
    ),
]
SegmentSize = Annotated[
    str | None,
    typer.Option(help="Target size of a packed segment in the capacity store. (default: 64M)"),
]
FlushDelay = Annotated[
    float | None, typer.Option(help="Seconds a write may wait before it is flushed. (default: 5)")
]
Compression = Annotated[
    bool | None,
    typer.Option(
        "--compression/--no-compression", help="zstd per extent where it saves space. (default: on)"
    ),
]
WriteThrough = Annotated[
    bool | None,
    typer.Option(
        "--write-through/--write-back",
        help="Policy of new buckets: acknowledge writes after the capacity store has them, "
        "or after the local fsync. (default: write-back)",
    ),
]
CompactThreshold = Annotated[
    float | None,
    typer.Option(help="Rewrite segments whose live fraction falls below this. (default: 0.5)"),
]
ClientTimeout = Annotated[
    float | None,
    typer.Option(help="Seconds a client may take to send a request head, or stall in a body. (default: 30)"),
]
Workers = Annotated[
    str | None,
    typer.Option(help="Processes serving S3 on the port, or auto. Above 1, that many read workers serve it: "
                 "hot GETs and HEADs themselves, the rest passed to this process, the only writer. "
                 "(default: auto, one worker per 8 cores, at most 8; one process below 16 cores)"),
]
NodeId = Annotated[
    str | None,
    typer.Option(help="Run as one of several gateways over one capacity store, under this name: the "
                 "writer of each bucket whose write lease it holds, a read replica of the others that "
                 "follows their writers. (default: the only gateway)"),
]
LeaseTtl = Annotated[
    float | None,
    typer.Option(help="Seconds a bucket's write lease lasts unless renewed; another node can take the "
                 "bucket over this long after its writer stops renewing. (default: 30)"),
]
LeaseIdle = Annotated[
    float | None,
    typer.Option(help="Seconds without a write to a bucket after which this node gives up its write lease "
                 "(once flushed, with no multipart upload open), so that another node can take the bucket "
                 "at once; 0: never. (default: 0)"),
]
FollowInterval = Annotated[
    float | None,
    typer.Option(help="The least time between this node's rounds of applying the other writers' new "
                 "segments, in seconds: the notices that start them are gathered meanwhile. (default: 2)"),
]
FollowFallback = Annotated[
    float | None,
    typer.Option(help="Seconds between this node's reads of what the other nodes last changed (segments, "
                 "users and policies), for a change whose notice from its node was lost. (default: 30)"),
]
HeartbeatInterval = Annotated[
    float | None,
    typer.Option(help="Seconds between this node's heartbeats in the node registry (each wait 90-100% of it); "
                 "a node is live while its last heartbeat is at most 2 of them and 5 s old. (default: 10)"),
]
MembersInterval = Annotated[
    float | None,
    typer.Option(help="Seconds between this node's listings of the node registry (each wait 90-100% of it): how "
                 "soon it sees a node join, leave or restart. (default: 20)"),
]
PeerConnections = Annotated[
    int | None,
    typer.Option(help="Connections this node keeps open to the other gateways, all of them together. "
                 "(default: 64)"),
]
Peers = Annotated[
    str | None,
    typer.Option(help="The gateways this one shares work with, itself included (with --node-id): read "
                 "misses ask an extent's owner before the store; cooperative warm jobs split the set. "
                 "node=URL pairs separated by commas, e.g. n1=http://10.0.0.1:9100,n2=http://10.0.0.2:9100."),
]
AdvertiseUrl = Annotated[
    str | None,
    typer.Option(help="The S3 URL other nodes reach this one at, in the node registry it joins with --node-id "
                 "and no --peers. (default: http(s)://host:port; needed when --host is 0.0.0.0 or ::)"),
]
TlsCert = Annotated[
    Path | None,
    typer.Option(help="PEM certificate (chain) to serve both ports over TLS with; needs --tls-key. "
                 "(default: plain HTTP)"),
]
TlsKey = Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert.")]
TlsCa = Annotated[
    Path | None,
    typer.Option(help="PEM CA bundle trusted for https peers, and the one `tierstore env` tells clients "
                 "to trust. (default: the system's CAs)"),
]
SecretsKeyFile = Annotated[
    Path | None,
    typer.Option(help="The key users' secret keys are sealed under at rest; every node of a cluster needs "
                 "the same file. Created (mode 0600) on first start. (default: secrets.key in --data-dir)"),
]
LogLevel = Annotated[
    str | None, typer.Option(help="critical, error, warning, info, debug or trace. (default: info)")
]
AccessLog = Annotated[
    str | None,
    typer.Option(help="One line per S3 request on stderr: off, text or json. (default: text)"),
]


SERVE_OPTIONS = (
    option("host", Host),
    option("port", Port),
    option("admin_host", AdminHost),
    option("admin_port", AdminPort),
    option("tls_cert", TlsCert),
    option("tls_key", TlsKey),
    option("tls_ca", TlsCa),
    option("secrets_key_file", SecretsKeyFile),
)
# What `recover` needs to reach the data dir and the capacity store.
STORAGE_OPTIONS = (
    option("data_dir", DataDir),
    option("capacity", Capacity),
    option("capacity_endpoint", CapacityEndpoint),
    option("capacity_region", CapacityRegion),
    option("capacity_access_key", CapacityAccessKey),
    option("capacity_secret_key", CapacitySecretKey),
    option("region", Region),
    option("config_file", ConfigFile),
)
TUNING_OPTIONS = (
    option("hot_size", HotSize),
    option("free_floor", FreeFloor),
    option("memory_limit", MemoryLimit),
    option("cache_sizes", CacheSizes),
    option("domain", Domain),
    option("log_level", LogLevel),
    option("access_log", AccessLog),
    option("small_object_size", SmallObjectSize),
    option("part_size", PartSize),
    option("segment_size", SegmentSize),
    option("flush_delay", FlushDelay),
    option("compression", Compression),
    option("write_through", WriteThrough),
    option("compact_threshold", CompactThreshold),
    option("client_timeout", ClientTimeout),
    option("workers", Workers),
    option("node_id", NodeId),
    option("lease_ttl", LeaseTtl),
    option("lease_idle", LeaseIdle),
    option("follow_interval", FollowInterval),
    option("follow_fallback", FollowFallback),
    option("heartbeat_interval", HeartbeatInterval),
    option("members_interval", MembersInterval),
    option("peer_connections", PeerConnections),
    option("peers", Peers),
    option("advertise_url", AdvertiseUrl),
)


@contextmanager
def _loaded_config(config_file: Path | None = None, **flags: object) -> Iterator[Config]:
    """The Config from the flags given (None = not given), the environment and the file."""
    try:
        config = load_config(flags, config_file=config_file)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    yield config


@app.command(rich_help_panel=GATEWAY_PANEL)
@with_options("config", (*SERVE_OPTIONS, *STORAGE_OPTIONS, *TUNING_OPTIONS), _loaded_config)
def serve(config: Config) -> None:
    """Serve S3 and the admin API (Ctrl-C to stop).

    Every flag is also TIERSTORE_<NAME> in the environment and <name> in the
    --config file; flags win over the environment over the file.
    """
    from gateway.config.allocator import use_jemalloc

    try:
        # Runs this command again on jemalloc (TIERSTORE_MALLOC): first of
        # all, before a module is loaded or a thread started; only as the
        # program, never where the CLI is called in another's process.
        not_used = use_jemalloc() if _PROGRAM else None
        check_serving(config)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    from gateway import server  # imported here: uvicorn and FastAPI take a second to load

    _configure_logging(config.log_level)
    if not_used:
        logging.getLogger("tierstore").warning("%s", not_used)
    try:
        server.run(config)
    except server.StartupError as exc:
        fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were in place
        raise typer.Exit(EXIT_INTERRUPTED) from None


@app.command(rich_help_panel=GATEWAY_PANEL)
@with_options("config", STORAGE_OPTIONS, _loaded_config)
def recover(config: Config) -> None:
    """Rebuild the index of an empty --data-dir from the capacity store.

    Reads every segment footer; the newest version of each key wins, deleted
    keys stay deleted. Run it with the gateway stopped.
    """
    from gateway.storage import run_recover

    try:
        report = asyncio.run(run_recover(config, _progress_printer()))
    except (ValueError, RuntimeError) as exc:
        fail(str(exc), EXIT_FAILED)
    typer.echo(
        f"recovered {report.objects} objects ({report.bytes} bytes) in {report.buckets} buckets "
        f"from {report.segments} segments; {report.deleted} deleted keys stay deleted"
        + (f"; {report.versions} noncurrent versions and delete markers" if report.versions else "")
        + (f"; {report.incomplete} versions lost (bytes in segments the store no longer has)" if report.incomplete else "")
    )


def _progress_printer() -> Callable[[int, int], None]:
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] > 0.5:
            last[0] = now
            typer.echo(f"\rreading footers: {done}/{total}", nl=done == total, err=True)

    return show


CheckedDir = Annotated[
    Path,
    typer.Option(
        "--data-dir", envvar="TIERSTORE_DATA_DIR", show_envvar=False,
        help="The stopped gateway's data dir; env TIERSTORE_DATA_DIR. (default: ./tierstore-data)",
    ),
]


@app.command(rich_help_panel=GATEWAY_PANEL)
def check(data_dir: CheckedDir = Path("tierstore-data")) -> None:
    """Check a stopped gateway's data dir: index and hot-tier files agree.

    Exits 0 when consistent, 1 with one line per problem otherwise.
    """
    from tiering.maintenance import fsck

    if not (data_dir / "index").exists():
        fail(f"{data_dir} holds no tierstore index", EXIT_USAGE)
    try:
        problems = fsck.check(data_dir)
    except Exception as exc:  # e.g. the index is locked by a running gateway
        fail(f"cannot check {data_dir}: {exc}", EXIT_FAILED)
    for problem in problems:
        typer.echo(problem)
    if problems:
        raise typer.Exit(EXIT_FAILED)
    typer.echo(f"{data_dir}: consistent")


@app.command("env", rich_help_panel=GATEWAY_PANEL)
def env_(config_file: ConfigFile = None, data_dir: DataDir = None) -> None:
    """Print shell exports that point S3 clients and the hints helper at the gateway.

    Run eval "$(tierstore env)" in the shell of a training job: boto3, the AWS
    CLI and s3fs then reach the gateway with no further arguments (other
    clients: docs/clients.md). With TLS and a CA bundle configured
    (TIERSTORE_TLS_CA), the exports make them trust that bundle.
    The endpoint, keys and token are found as by the admin commands (docs/cli.md).
    Not for the shell that starts a gateway over AWS S3: its AWS_* would win
    over the capacity store's own credentials chain.
    """
    try:
        s3 = resolve_s3(config_file=config_file, data_dir=data_dir, known=COERCERS)
        admin = resolve_target(admin_url=None, token=None, config_file=config_file, data_dir=data_dir,
                               known=COERCERS)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    exports = [
        ("AWS_ENDPOINT_URL", s3.endpoint),
        ("AWS_ACCESS_KEY_ID", s3.access_key),
        ("AWS_SECRET_ACCESS_KEY", s3.secret_key),
        ("AWS_DEFAULT_REGION", s3.region),
        ("AWS_REGION", s3.region),
        ("TIERSTORE_ADMIN_URL", admin.url),
        ("TIERSTORE_ADMIN_TOKEN", admin.token),
    ]
    if s3.ca is not None:
        # boto3, the AWS CLI and s3fs verify the gateway with AWS_CA_BUNDLE;
        # the CLI and the hints helper with TIERSTORE_TLS_CA. Absolute: the
        # training job may run from another directory.
        ca = str(s3.ca.resolve())
        exports += [("AWS_CA_BUNDLE", ca), ("TIERSTORE_TLS_CA", ca)]
    for name, value in exports:
        typer.echo(f"export {name}={shlex.quote(value)}")


def _configure_logging(level: str) -> None:
    # "trace" is uvicorn's level below DEBUG; for our own loggers it is DEBUG.
    numeric = logging.DEBUG if level == "trace" else getattr(logging, level.upper())
    logging.basicConfig(level=numeric, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


admin_commands.register(app)
mount_commands.register(app)
prefetch_commands.register(app)
user_commands.register(app)


def main() -> None:
    """Console-script entry point."""
    global _PROGRAM
    _PROGRAM = True
    app(prog_name="tierstore")
