"""The ``tierstore`` command line (console script and ``python -m gateway``).

Flags default to None so that "not given" is distinguishable from a value and
the environment and the --config file can fill in (see ``gateway/config.py``).
Errors a user can fix print one line on stderr, never a traceback: exit 2 for
a bad configuration, 1 when the gateway cannot start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from gateway import server
from gateway.config import VERSION, load_config

app = typer.Typer(
    name="tierstore",
    help="S3-compatible gateway: training data hot on local NVMe, tiered to an object store.",
    no_args_is_help=True,
    add_completion=False,
    # Locals in a traceback would include keys and tokens.
    pretty_exceptions_show_locals=False,
)

EXIT_CONFIG = 2
EXIT_STARTUP = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells expect after Ctrl-C


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"tierstore: {message}", err=True)
    raise typer.Exit(code)


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
# Storage flags are shared with commands added later (e.g. `recover`).
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
    str | None, typer.Option(help="Hot tier budget in bytes, K/M/G/T suffixes. (default: 64G)")
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
    str | None, typer.Option(help="Objects up to this size are packed into shared segments. (default: 4M)")
]
PartSize = Annotated[
    str | None, typer.Option(help="Larger objects are split into extents of this size, at least 5M. (default: 8M)")
]
SegmentSize = Annotated[
    str | None, typer.Option(help="Target size of a packed segment in the capacity store. (default: 64M)")
]
FlushDelay = Annotated[
    float | None, typer.Option(help="Seconds a write may wait before it is flushed. (default: 5)")
]
Compression = Annotated[
    bool | None, typer.Option("--compression/--no-compression", help="zstd per extent where it saves space. (default: on)")
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
    float | None, typer.Option(help="Rewrite segments whose live fraction falls below this. (default: 0.5)")
]
LogLevel = Annotated[
    str | None, typer.Option(help="critical, error, warning, info, debug or trace. (default: info)")
]


@app.command()
def serve(
    host: Host = None,
    port: Port = None,
    admin_host: AdminHost = None,
    admin_port: AdminPort = None,
    data_dir: DataDir = None,
    hot_size: HotSize = None,
    capacity: Capacity = None,
    capacity_endpoint: CapacityEndpoint = None,
    capacity_region: CapacityRegion = None,
    capacity_access_key: CapacityAccessKey = None,
    capacity_secret_key: CapacitySecretKey = None,
    region: Region = None,
    domain: Domain = None,
    config_file: ConfigFile = None,
    log_level: LogLevel = None,
    small_object_size: SmallObjectSize = None,
    part_size: PartSize = None,
    segment_size: SegmentSize = None,
    flush_delay: FlushDelay = None,
    compression: Compression = None,
    write_through: WriteThrough = None,
    compact_threshold: CompactThreshold = None,
) -> None:
    """Serve S3 and the admin API (Ctrl-C to stop).

    Every flag is also TIERSTORE_<NAME> in the environment and <name> in the
    --config file; flags win over the environment over the file.
    """
    flags = dict(locals())
    config_path = flags.pop("config_file")
    try:
        config = load_config(flags, config_file=config_path)
    except ValueError as exc:
        _fail(str(exc), EXIT_CONFIG)
    _configure_logging(config.log_level)
    try:
        server.run(config)
    except server.StartupError as exc:
        _fail(str(exc), EXIT_STARTUP)
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were in place
        raise typer.Exit(EXIT_INTERRUPTED) from None


@app.command()
def recover(
    data_dir: DataDir = None,
    capacity: Capacity = None,
    capacity_endpoint: CapacityEndpoint = None,
    capacity_region: CapacityRegion = None,
    capacity_access_key: CapacityAccessKey = None,
    capacity_secret_key: CapacitySecretKey = None,
    region: Region = None,
    config_file: ConfigFile = None,
) -> None:
    """Rebuild the index of an empty --data-dir from the capacity store.

    Reads every segment footer; the newest version of each key wins, deleted
    keys stay deleted. Run it with the gateway stopped.
    """
    flags = dict(locals())
    config_path = flags.pop("config_file")
    try:
        config = load_config(flags, config_file=config_path)
    except ValueError as exc:
        _fail(str(exc), EXIT_CONFIG)
    from gateway.storage import run_recover

    try:
        report = asyncio.run(run_recover(config, _progress_printer()))
    except (ValueError, RuntimeError) as exc:
        _fail(str(exc), 1)
    typer.echo(
        f"recovered {report.objects} objects ({report.bytes} bytes) in {report.buckets} buckets "
        f"from {report.segments} segments; {report.deleted} deleted keys stay deleted"
        + (f"; {report.incomplete} incomplete manifests skipped" if report.incomplete else "")
    )


def _progress_printer() -> Callable[[int, int], None]:
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] > 0.5:
            last[0] = now
            typer.echo(f"\rreading footers: {done}/{total}", nl=done == total, err=True)

    return show


@app.command()
def check(data_dir: DataDir = None) -> None:
    """Check a stopped gateway's data dir: index and hot-tier files agree.

    Exits 0 when consistent, 1 with one line per problem otherwise.
    """
    from tiering import fsck

    path = data_dir or Path("tierstore-data")
    if not (path / "index").exists():
        _fail(f"{path} holds no tierstore index", EXIT_CONFIG)
    try:
        problems = fsck.check(path)
    except Exception as exc:  # e.g. the index is locked by a running gateway
        _fail(f"cannot check {path}: {exc}", 1)
    for problem in problems:
        typer.echo(problem)
    if problems:
        raise typer.Exit(1)
    typer.echo(f"{path}: consistent")


def _configure_logging(level: str) -> None:
    # "trace" is uvicorn's level below DEBUG; for our own loggers it is DEBUG.
    numeric = logging.DEBUG if level == "trace" else getattr(logging, level.upper())
    logging.basicConfig(level=numeric, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main() -> None:
    """Console-script entry point."""
    app(prog_name="tierstore")
