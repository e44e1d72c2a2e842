"""The ``tierstore`` commands that drive a running gateway through its admin API.

Each command is a thin wrapper: one or two calls of :class:`AdminClient`, then
a renderer of ``gateway/cli/render.py`` (or the raw JSON with ``--json``);
the mount commands are in ``gateway/cli/mounts.py``, built the same way.
The options every one of them takes (``--json``, ``--admin-url``, ``--token``,
``--config``, ``--data-dir``) are declared once, in ``CONNECTION``, and
resolved once, by :func:`_session`, which also turns every API failure into
one line on stderr.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import click
import typer
from typer.core import TyperGroup

from gateway.cli import browser, render
from gateway.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, fail, option, with_options
from gateway.client.admin import JSON, AdminClient, ApiError, Unreachable
from gateway.client.target import Target, resolve_target
from gateway.config.settings import COERCERS
from gateway.config.sizes import parse_size

PANEL = "Admin API (talk to a running gateway)"
POLL_INTERVAL = 0.2  # seconds between GET /jobs/{id} while a progress bar is shown


# --------------------------------------------------------------------------
# s3:// arguments


@dataclass(frozen=True, slots=True)
class S3Location:
    """``s3://bucket/prefix``; an empty prefix means the whole bucket."""

    bucket: str
    prefix: str = ""


def parse_s3_url(text: str) -> S3Location:
    """``s3://bucket/a/b`` -> S3Location("bucket", "a/b").

    Split by hand, not with urlsplit: keys may hold ``?`` and ``#``, which
    would be taken for a query and a fragment.
    """
    if not text.startswith("s3://"):
        raise ValueError(f"expected s3://bucket or s3://bucket/prefix, got {text!r}")
    bucket, _, prefix = text.removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {text!r}: expected s3://bucket or s3://bucket/prefix")
    return S3Location(bucket, prefix)


def parse_object_url(text: str) -> S3Location:
    """``s3://bucket/key``, where the key may not be empty."""
    location = parse_s3_url(text)
    if not location.prefix:
        raise ValueError(f"no key in {text!r}: expected s3://bucket/key")
    return location


def _location(text: str, parse: Callable[[str], S3Location] = parse_s3_url) -> S3Location:
    """Parse an S3_URL argument; a bad one is a usage error, reported in one line."""
    try:
        return parse(text)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)


Location = Annotated[
    str, typer.Argument(metavar="S3_URL", help="s3://bucket or s3://bucket/prefix")
]


# --------------------------------------------------------------------------
# The options every command takes, and the session built from them


CONNECTION = (
    option(
        "json_output",
        Annotated[bool, typer.Option("--json", help="Print the API's JSON answer, nothing else.")],
        default=False,
    ),
    option(
        "admin_url",
        Annotated[
            str | None,
            typer.Option(
                help="Admin API address; env TIERSTORE_ADMIN_URL. (default: admin_host and "
                "admin_port of --config, else http://127.0.0.1:9101)"
            ),
        ],
    ),
    option(
        "token",
        Annotated[
            str | None,
            typer.Option(
                help="Admin token; env TIERSTORE_ADMIN_TOKEN. (default: admin_token of --config, "
                "else the token the gateway generated in --data-dir)"
            ),
        ],
    ),
    option(
        "config_file",
        Annotated[
            Path | None,
            typer.Option("--config", help="The gateway's TOML config file; env TIERSTORE_CONFIG."),
        ],
    ),
    option(
        "data_dir",
        Annotated[
            Path | None,
            typer.Option(
                help="The gateway's data dir, holding its generated token; env "
                "TIERSTORE_DATA_DIR. (default: data_dir of --config, else ./tierstore-data)"
            ),
        ],
    ),
)


@dataclass(frozen=True, slots=True)
class Session:
    """What every admin command gets: the API client, how to print its
    answers, and the address and token it was built from."""

    api: AdminClient
    json: bool
    target: Target

    def show(self, document: JSON, renderer: Callable[[JSON], None]) -> None:
        if self.json:
            render.print_json(document)
        else:
            renderer(document)

    def done(self, message: str) -> None:
        """For an API answer without a body (204): ``{}`` with --json, else ``message``."""
        self.show({}, lambda _: print(message))


@contextmanager
def _session(
    *,
    json_output: bool,
    admin_url: str | None,
    token: str | None,
    config_file: Path | None,
    data_dir: Path | None,
) -> Iterator[Session]:
    try:
        target = resolve_target(
            admin_url=admin_url, token=token, config_file=config_file, data_dir=data_dir, known=COERCERS
        )
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    try:
        with AdminClient(target.url, target.token, ca=target.ca) as api:
            yield Session(api, json_output, target)
    except Unreachable as exc:
        fail(_unreachable(exc), EXIT_FAILED)
    except ApiError as exc:
        fail(_api_failure(exc, target), EXIT_FAILED)


def _unreachable(exc: Unreachable) -> str:
    if exc.refused:
        return f"no gateway answers at {exc.url}: is `tierstore serve` running?"
    return f"cannot talk to the admin API at {exc.url}: {exc.reason}"


def _api_failure(exc: ApiError, target: Target) -> str:
    if exc.status == 401:
        return (
            f"the admin API refused the token from {target.token_source} ({exc.message}): "
            "pass the gateway's token with --token or TIERSTORE_ADMIN_TOKEN"
        )
    return exc.message or exc.code


admin = with_options("session", CONNECTION, _session)


# --------------------------------------------------------------------------
# Jobs: start, follow, finish


Wait = Annotated[
    bool,
    typer.Option(
        "--wait/--no-wait",
        help="Show a progress bar until the job ends, or print its id and return at once.",
    ),
]


def _run(session: Session, job: JSON, wait: bool) -> None:
    if wait:
        _finish(session, job)
    else:
        session.show(job, render.job_started)


def _finish(session: Session, job: JSON) -> None:
    """Follow the job to its end, show the result; exit 1 unless it succeeded."""
    final = _follow(session, job)
    session.show(final, render.job_finished)
    if final.get("state") != "succeeded":
        errors = final.get("errors") or []
        detail = f": {errors[0]}" if errors else ""
        fail(f"job {final.get('id')} {final.get('state')}{detail}", EXIT_FAILED)


def _follow(session: Session, job: JSON) -> JSON:
    """Poll the job until it ends; Ctrl-C stops waiting, not the job."""
    try:
        if session.json or job.get("state") != "running":
            return _poll(session.api, job, lambda _: None)
        with render.JobProgress(job) as bar:
            return _poll(session.api, job, bar.update)
    except KeyboardInterrupt:
        job_id = job.get("id")
        fail(
            f"stopped waiting; job {job_id} keeps running "
            f"(`tierstore jobs cancel {job_id}` cancels it)",
            EXIT_INTERRUPTED,
        )


def _poll(api: AdminClient, job: JSON, update: Callable[[JSON], None]) -> JSON:
    while job.get("state") == "running":
        time.sleep(POLL_INTERVAL)
        job = api.job(str(job["id"]))
        update(job)
    return job


# --------------------------------------------------------------------------
# Top-level commands


@admin
def status(
    session: Session,
    open_page: Annotated[
        bool,
        typer.Option(
            "--open",
            help="Open the status page (live charts, jobs, epochs, buckets) in a browser, signed "
            "in with the token; it goes through a file only you can read, on no command line.",
        ),
    ] = False,
    url: Annotated[
        bool,
        typer.Option("--url", help="Print the status page's address and exit; it asks for the token."),
    ] = False,
    with_token: Annotated[
        bool,
        typer.Option(
            "--with-token",
            help="With --url: sign the address in, the token in its #fragment (browsers send no "
            "fragment to a server; the terminal keeps it in its scrollback).",
        ),
    ] = False,
) -> None:
    """Hot and capacity tier, hit ratio and running jobs, at a glance; or the status page."""
    api = session.api
    if with_token and not url:
        fail("--with-token goes with --url", EXIT_USAGE)
    if not (open_page or url):
        session.show({"tiers": api.tiers(), "stats": api.stats(), "jobs": api.jobs()}, render.status)
        return
    api.stats()  # the gateway answers and takes the token: say so here, not in the browser
    target = session.target
    if url:
        print(browser.page_url(target.url, target.token if with_token else None))
        return
    address = browser.page_url(target.url)

    def opened() -> None:
        print(f"opened {address} in a browser, signed in (its sign-in file goes in "
              f"{browser.OPEN_GRACE:g} s)")

    if not browser.open_page(target.url, target.token, opened):
        fail(
            f"no browser found here: open {address} in one that reaches this address "
            "(from another machine: ssh -L, or `tierstore status --url --with-token`)",
            EXIT_FAILED,
        )


@admin
def stats(session: Session) -> None:
    """Requests per S3 operation: count, errors, bytes, latency percentiles."""
    session.show(session.api.stats(), render.stats)


@admin
def flush(session: Session, wait: Wait = True) -> None:
    """Write every staged object to the capacity store now."""
    _run(session, session.api.flush(), wait)


@admin
def compact(
    session: Session,
    threshold: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Rewrite segments whose live fraction is below this. (default: the gateway's "
            "--compact-threshold)",
        ),
    ] = None,
    wait: Wait = True,
) -> None:
    """Reclaim capacity-store space: delete unused segments, rewrite sparse ones."""
    _run(session, session.api.compact(threshold), wait)


@admin
def evict(
    session: Session,
    url: Annotated[
        str | None,
        typer.Argument(
            metavar="S3_URL", help="s3://bucket or s3://bucket/prefix. (default: the whole cache)"
        ),
    ] = None,
    wait: Wait = True,
) -> None:
    """Drop cached data from the hot tier; staged and pinned data stay."""
    if url is None:
        _run(session, session.api.evict(None, ""), wait)
        return
    location = _location(url)
    _run(session, session.api.evict(location.bucket, location.prefix), wait)


@admin
def pin(session: Session, url: Location, wait: Wait = True) -> None:
    """Keep a bucket or prefix in the hot tier: record the pin, then fetch its objects."""
    location = _location(url)
    _run(session, session.api.pin(location.bucket, location.prefix), wait)


@admin
def unpin(session: Session, url: Location) -> None:
    """Remove a pin; its data stays cached but may be evicted again."""
    location = _location(url)
    session.api.unpin(location.bucket, location.prefix)
    session.done(f"unpinned {render.s3_url(location.bucket, location.prefix)}")


@admin
def pins(session: Session) -> None:
    """List the pinned buckets and prefixes."""
    session.show(session.api.pins(), render.pins)


@admin
def where(
    session: Session,
    url: Annotated[str, typer.Argument(metavar="S3_URL", help="s3://bucket/key")],
) -> None:
    """Where one object lives: hot, staged or in the capacity store, chunk by chunk."""
    location = _location(url, parse_object_url)
    session.show(session.api.object(location.bucket, location.prefix), render.where)


# --------------------------------------------------------------------------
# Groups


class _ListByDefault(TyperGroup):
    """A group that runs ``list`` when no subcommand is named (``tierstore jobs --json``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0].startswith("-") and args[0] not in ctx.help_option_names):
            args = ["list", *args]
        return super().parse_args(ctx, args)


buckets_app = typer.Typer(
    cls=_ListByDefault, help="Buckets and their tiering policy. Without a subcommand: list."
)
jobs_app = typer.Typer(
    cls=_ListByDefault,
    help="Flush, compaction, eviction, pin and warm jobs. Without a subcommand: list.",
)

BucketName = Annotated[str, typer.Argument(metavar="NAME", help="The bucket.")]
JobId = Annotated[str, typer.Argument(metavar="ID", help="The job id.")]


@contextmanager
def _policy(**fields: object) -> Iterator[JSON]:
    """The policy fields of a bucket request: only those given on the command line."""
    policy = {name: value for name, value in fields.items() if value is not None}
    for name in ("part_size", "small_object_size"):
        if name in policy:
            policy[name] = _size(name, str(policy[name]))
    yield policy


def _size(name: str, text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        fail(f"--{name.replace('_', '-')}: {exc}", EXIT_USAGE)


POLICY = (
    option(
        "write_through",
        Annotated[
            bool | None,
            typer.Option(
                "--write-through/--write-back",
                help="Acknowledge writes once the capacity store has them, or once they are "
                "fsynced locally.",
            ),
        ],
    ),
    option(
        "compression",
        Annotated[
            bool | None,
            typer.Option("--compression/--no-compression", help="zstd per extent where it helps."),
        ],
    ),
    option(
        "part_size",
        Annotated[
            str | None,
            typer.Option(
                metavar="SIZE",
                help="Larger objects are split into extents of this size, at least 5M.",
            ),
        ],
    ),
    option(
        "small_object_size",
        Annotated[
            str | None,
            typer.Option(
                metavar="SIZE",
                help="Objects up to this size are packed into shared segments; "
                "at most the part size.",
            ),
        ],
    ),
    option(
        "pinned",
        Annotated[
            bool | None,
            typer.Option(
                "--pinned/--no-pinned", help="Keep the bucket's objects hot, never evicted."
            ),
        ],
    ),
)

policy_flags = with_options("policy", POLICY, _policy)


@buckets_app.command("list")
@admin
def list_buckets(session: Session) -> None:
    """List the buckets with their effective policy."""
    session.show(session.api.buckets(), render.buckets)


@buckets_app.command("create")
@admin
@policy_flags
def create_bucket(session: Session, policy: JSON, name: BucketName) -> None:
    """Create a bucket; policy flags left out take the gateway's defaults."""
    session.show(session.api.create_bucket(name, policy), render.bucket)


@buckets_app.command("show")
@admin
def show_bucket(session: Session, name: BucketName) -> None:
    """Show one bucket's effective policy."""
    session.show(session.api.bucket(name), render.bucket)


@buckets_app.command("set")
@admin
@policy_flags
def set_bucket(session: Session, policy: JSON, name: BucketName) -> None:
    """Change a bucket's policy; only the flags given change."""
    if not policy:
        fail("nothing to change: give at least one policy flag (see --help)", EXIT_USAGE)
    session.show(session.api.update_bucket(name, policy), render.bucket)


@buckets_app.command("delete")
@admin
def delete_bucket(session: Session, name: BucketName) -> None:
    """Delete an empty bucket."""
    session.api.delete_bucket(name)
    session.done(f"deleted bucket {name}")


@jobs_app.command("list")
@admin
def list_jobs(session: Session) -> None:
    """Running jobs and the last finished ones, newest first."""
    session.show(session.api.jobs(), render.jobs)


@jobs_app.command("show")
@admin
def show_job(session: Session, job_id: JobId) -> None:
    """One job: state, progress, errors and result."""
    session.show(session.api.job(job_id), render.job)


@jobs_app.command("cancel")
@admin
def cancel_job(session: Session, job_id: JobId) -> None:
    """Ask a running job to stop; the steps it finished stay done."""
    session.show(session.api.cancel_job(job_id), render.job)


@jobs_app.command("wait")
@admin
def wait_job(session: Session, job_id: JobId) -> None:
    """Follow a job with a progress bar until it ends; exit 1 unless it succeeded."""
    _finish(session, session.api.job(job_id))


def register(app: typer.Typer) -> None:
    """Add the admin API commands to the ``tierstore`` app."""
    for command in (status, stats, flush, compact, evict, pin, unpin, pins, where):
        app.command(rich_help_panel=PANEL)(command)
    app.add_typer(buckets_app, name="buckets", rich_help_panel=PANEL)
    app.add_typer(jobs_app, name="jobs", rich_help_panel=PANEL)

