"""The ``tierstore`` commands that make data hot before it is read: ``warm``.

Admin API commands built like those of ``gateway/cli_admin.py`` (the same
shared options, session, job progress bar and one-line errors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gateway._cli import EXIT_USAGE, fail
from gateway.cli_admin import PANEL, Location, Session, Wait, _location, _run, admin
from gateway.config import parse_size

KeysFrom = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE", exists=True, dir_okay=False,
        help="Warm the keys listed in FILE, one per line (shard patterns such as "
        "train-{0000..0099}.tar are expanded); S3_URL names the bucket only.",
    ),
]
Manifest = Annotated[
    str | None,
    typer.Option(
        metavar="KEY",
        help="Warm the keys listed in the object KEY of the bucket, one per line or shard pattern.",
    ),
]
Concurrency = Annotated[
    int | None,
    typer.Option(metavar="N", help="Batches (managed) or objects (mounted) fetched at once, 1 to 64. "
                 "(default: 4)"),
]
Bandwidth = Annotated[
    str | None,
    typer.Option(metavar="SIZE", help="Bytes per second the job may read from the store, e.g. 200M."),
]


@admin
def warm(
    session: Session,
    url: Location,
    keys_from: KeysFrom = None,
    manifest: Manifest = None,
    concurrency: Concurrency = None,
    bandwidth: Bandwidth = None,
    wait: Wait = True,
) -> None:
    """Bring a prefix, a key list or a manifest's keys into the hot tier before it is read.

    Works on managed and mounted buckets. A set larger than the hot tier is
    warmed as far as it fits; the result says what was left out.
    """
    location = _location(url)
    scope: dict[str, Any] = {}
    if keys_from is not None or manifest is not None:
        if location.prefix:
            fail("with --keys-from or --manifest, give the bucket alone: s3://bucket", EXIT_USAGE)
        if keys_from is not None and manifest is not None:
            fail("give --keys-from or --manifest, not both", EXIT_USAGE)
        if keys_from is not None:
            lines = (line.strip() for line in keys_from.read_text(encoding="utf-8").splitlines())
            scope["keys"] = [line for line in lines if line and not line.startswith("#")]
        else:
            scope["manifest"] = manifest
    else:
        scope["prefix"] = location.prefix
    if concurrency is not None:
        scope["concurrency"] = concurrency
    if bandwidth is not None:
        try:
            scope["bandwidth"] = parse_size(bandwidth)
        except ValueError as exc:
            fail(f"--bandwidth: {exc}", EXIT_USAGE)
    _run(session, session.api.warm(location.bucket, scope), wait)


def register(app: typer.Typer) -> None:
    """Add the prefetch commands to the ``tierstore`` app."""
    app.command(rich_help_panel=PANEL)(warm)
