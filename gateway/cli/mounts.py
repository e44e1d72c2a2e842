"""The ``tierstore`` commands for mounted buckets: ``mount``, ``unmount``, ``mounts``.

A mounted bucket is a gateway bucket over an existing ``s3://bucket/prefix``:
the objects stay at the source and are read through the hot tier, which
caches them (docs/cli.md, "Mounted buckets"). These are admin API commands
like those of ``gateway/cli/admin.py``: the same shared options, session and
one-line errors; ``gateway/cli/app.py`` adds them to the app.
"""

from __future__ import annotations

import math
from typing import Annotated

import typer

from gateway.cli import render
from gateway.cli.admin import PANEL, Session, admin, parse_s3_url
from gateway.cli.common import EXIT_USAGE, fail

IMMUTABLE = "immutable"
SECRET_KEY_ENV = "TIERSTORE_MOUNT_SECRET_KEY"

# Help texts avoid square brackets: typer renders them as rich markup.
MountName = Annotated[str, typer.Argument(metavar="NAME", help="The mounted bucket's name.")]
Source = Annotated[
    str,
    typer.Argument(
        metavar="S3_URL", help="The existing data: s3://bucket or s3://bucket/prefix."
    ),
]
Endpoint = Annotated[
    str | None,
    typer.Option(help="URL of a non-AWS source (MinIO, Ceph RGW). (default: AWS S3)"),
]
Region = Annotated[str | None, typer.Option(help="Region of the source bucket.")]
AccessKey = Annotated[
    str | None,
    typer.Option(
        help="Access key for the source. (default: the botocore chain of the gateway's machine)"
    ),
]
SecretKey = Annotated[
    str | None,
    typer.Option(
        envvar=SECRET_KEY_ENV,
        show_envvar=False,  # said in the help text, as for the other env variables
        help=f"Secret key for the source; env {SECRET_KEY_ENV}, preferred: a flag shows in "
        "ps and the shell history.",
    ),
]
Freshness = Annotated[
    str | None,
    typer.Option(
        metavar="SECONDS",
        help="Seconds a checked object is trusted before the source is asked again, or "
        "immutable: never ask again. (default: 60)",
    ),
]
ReadWrite = Annotated[
    bool,
    typer.Option(
        "--read-write",
        help="Write PUT, copy, DELETE and multipart uploads through to the source "
        "(default: read-only, writes answer AccessDenied).",
    ),
]
ListingTtl = Annotated[
    float | None,
    typer.Option(
        metavar="SECONDS",
        help="Seconds a listing page from the source is reused, for huge data sets listed "
        "often; writes through the gateway drop the pages at once. (default: 0, off)",
    ),
]
CheckMd5 = Annotated[
    bool,
    typer.Option(
        "--check-md5",
        help="Also check whole objects the source sends no checksum of against their MD5 ETag: "
        "for a source reached over plain HTTP (costs about 2 ms of CPU per MiB read cold). "
        "(default: the source's checksum where it sends one, else the length)",
    ),
]
ServeStale = Annotated[
    bool | None,
    typer.Option(
        "--serve-stale/--no-serve-stale",
        help="While the source does not answer, serve what is cached, or fail. (default: serve)",
    ),
]


def parse_freshness(text: str) -> str | float:
    """``immutable``, or a number of seconds above 0, as the API takes it."""
    if text.strip().lower() == IMMUTABLE:
        return IMMUTABLE
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"expected immutable or a number of seconds above 0, got {text!r}")
    return seconds


@admin
def mount(
    session: Session,
    name: MountName,
    source: Source,
    endpoint: Endpoint = None,
    region: Region = None,
    access_key: AccessKey = None,
    secret_key: SecretKey = None,
    freshness: Freshness = None,
    serve_stale: ServeStale = None,
    read_write: ReadWrite = False,
    listing_ttl: ListingTtl = None,
    check_md5: CheckMd5 = False,
) -> None:
    """Mount an existing S3 bucket or prefix as a gateway bucket, read through and cached.

    The objects stay at the source, one object per key; what is read is kept
    in the hot tier. Read-only unless --read-write: then PUT, copy, DELETE and
    multipart uploads go through to the source natively.
    """
    try:
        parse_s3_url(source)  # sent as typed; checked here for a one-line usage error
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    try:
        fresh = None if freshness is None else parse_freshness(freshness)
    except ValueError as exc:
        fail(f"--freshness: {exc}", EXIT_USAGE)
    if listing_ttl is not None and not 0 <= listing_ttl <= 86400:
        fail(f"--listing-ttl: expected 0 to 86400 seconds, got {listing_ttl:g}", EXIT_USAGE)
    # The gateway needs both or neither, as for the capacity store; say so before sending.
    access_key, secret_key = access_key or None, secret_key or None
    if (access_key is None) != (secret_key is None):
        fail(
            f"--access-key and --secret-key (or {SECRET_KEY_ENV}) go together: "
            "give both or neither",
            EXIT_USAGE,
        )
    given = {
        "endpoint": endpoint,
        "region": region,
        "access_key": access_key,
        "secret_key": secret_key,
        "freshness": fresh,
        "serve_stale": serve_stale,
        "read_write": read_write or None,
        "listing_ttl": listing_ttl,
        "check_md5": check_md5 or None,
    }
    options = {field: value for field, value in given.items() if value is not None}
    session.show(session.api.mount(name, source, options), render.mount)


@admin
def unmount(session: Session, name: MountName) -> None:
    """Remove a mounted bucket and its cached data; the source is not touched."""
    session.api.unmount(name)
    session.done(f"unmounted {name}")


@admin
def mounts(session: Session) -> None:
    """List the mounted buckets and their sources."""
    session.show(session.api.mounts(), render.mounts)


def register(app: typer.Typer) -> None:
    """Add the mount commands to the ``tierstore`` app, beside the admin ones."""
    for command in (mount, unmount, mounts):
        app.command(rich_help_panel=PANEL)(command)
