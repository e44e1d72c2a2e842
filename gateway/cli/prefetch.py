"""The ``tierstore`` commands that make data hot before it is read:
``warm``, and ``epochs start|list|show|end`` for epoch hints.

Admin API commands built like those of ``gateway/cli/admin.py`` (the same
shared options, session, job progress bar and one-line errors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli import render
from gateway.cli.admin import PANEL, Location, Session, Wait, _ListByDefault, _location, _run, admin
from gateway.cli.common import EXIT_USAGE, fail
from gateway.config.sizes import parse_size

KeysFrom = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE", exists=True, dir_okay=False,
        help="Warm the keys listed in FILE, one per line, each taken literally (see --patterns, --urls); "
        "S3_URL names the bucket only.",
    ),
]
Manifest = Annotated[
    str | None,
    typer.Option(
        metavar="KEY",
        help="Warm the keys listed in the object KEY of the bucket, one per line, each taken literally "
        "(see --patterns, --urls).",
    ),
]
Patterns = Annotated[
    bool,
    typer.Option(
        "--patterns",
        help="Expand brace patterns in the listed keys: train-{0000..0099}.tar is 100 keys, {a,b} a choice. "
        "Without it, braces and commas are part of the key.",
    ),
]
Urls = Annotated[
    bool,
    typer.Option(
        "--urls",
        help="Read listed keys of the form s3://BUCKET/KEY as URLs of the bucket (BUCKET/ stripped, another "
        "bucket refused). Without it, s3://... is the key itself.",
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
    patterns: Patterns = False,
    urls: Urls = False,
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
            scope["keys"] = _keys_file(keys_from)
        else:
            scope["manifest"] = manifest
        scope.update(_forms(patterns, urls))
    else:
        if patterns or urls:
            fail("--patterns and --urls go with --keys-from or --manifest", EXIT_USAGE)
        scope["prefix"] = location.prefix
    if concurrency is not None:
        scope["concurrency"] = concurrency
    if bandwidth is not None:
        scope["bandwidth"] = _size("--bandwidth", bandwidth)
    _run(session, session.api.warm(location.bucket, scope), wait)


def _size(flag: str, text: str) -> int:
    """A SIZE flag's bytes; a bad one is a one-line usage error."""
    try:
        return parse_size(text)
    except ValueError as exc:
        fail(f"{flag}: {exc}", EXIT_USAGE)


def _forms(patterns: bool, urls: bool) -> dict[str, bool]:
    """The request fields that ask for the key forms (sent only when set)."""
    return {name: True for name, on in (("patterns", patterns), ("urls", urls)) if on}


def _keys_file(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


epochs_app = typer.Typer(
    cls=_ListByDefault,
    help="Epoch hints: the order the next epoch reads a bucket in. Without a subcommand: list.",
)
EpochId = Annotated[str, typer.Argument(metavar="ID", help="The epoch id.")]
OrderFrom = Annotated[
    Path | None,
    typer.Option(
        "--keys-from", metavar="FILE", exists=True, dir_okay=False,
        help="The keys in read order, one per line, each taken literally (see --patterns, --urls); "
        "S3_URL names the bucket only.",
    ),
]
Seed = Annotated[
    int | None,
    typer.Option(help="Read every key under the prefix in the order of this seed (the gateway's shuffle).")
]
Readers = Annotated[int, typer.Option(metavar="N", help="Readers sharing the order, each an interleaved share.")]
Lookahead = Annotated[
    str | None, typer.Option(metavar="SIZE", help="Most bytes kept in flight ahead of the readers. (default: 256M)")
]


@epochs_app.command("start")
@admin
def start_epoch(
    session: Session,
    url: Location,
    keys_from: OrderFrom = None,
    seed: Seed = None,
    readers: Readers = 1,
    lookahead: Lookahead = None,
    patterns: Patterns = False,
    urls: Urls = False,
) -> None:
    """Register the order the next epoch reads: a key file, or a prefix and a seed."""
    location = _location(url)
    body: dict[str, Any] = {"bucket": location.bucket, "readers": readers}
    if keys_from is not None:
        if location.prefix or seed is not None:
            fail("with --keys-from, give the bucket alone and no --seed", EXIT_USAGE)
        body["keys"] = _keys_file(keys_from)
        body.update(_forms(patterns, urls))
    else:
        if patterns or urls:
            fail("--patterns and --urls go with --keys-from", EXIT_USAGE)
        body["prefix"] = location.prefix
        if seed is not None:
            body["seed"] = seed
    if lookahead is not None:
        body["lookahead_bytes"] = _size("--lookahead", lookahead)
    session.show(session.api.register_epoch(body), render.epoch)


@epochs_app.command("list")
@admin
def list_epochs(session: Session) -> None:
    """Live epochs and the last finished ones, newest first."""
    session.show(session.api.epochs(), render.epochs)


@epochs_app.command("show")
@admin
def show_epoch(session: Session, epoch_id: EpochId) -> None:
    """One epoch: readers' positions, hits, misses, what was prefetched, and what looks wrong."""
    session.show(session.api.epoch(epoch_id), render.epoch)


@epochs_app.command("end")
@admin
def end_epoch(session: Session, epoch_id: EpochId) -> None:
    """End an epoch: its hints are dropped, the bucket's next queued epoch starts."""
    session.show(session.api.end_epoch(epoch_id), render.epoch)


def register(app: typer.Typer) -> None:
    """Add the prefetch commands to the ``tierstore`` app."""
    app.command(rich_help_panel=PANEL)(warm)
    app.add_typer(epochs_app, name="epochs", rich_help_panel=PANEL)
