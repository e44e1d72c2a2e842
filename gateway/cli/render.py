"""How the CLI shows admin API answers to a person: rich tables and a job progress bar.

Each renderer takes one API document (see docs/admin-api.md) and prints it on
stdout; ``--json`` bypasses them. They read fields with ``.get`` and show a
dash for what is missing, so a gateway one version older or newer than the
CLI still gets a readable answer instead of a traceback. The progress bar
goes to stderr, keeping stdout for the result.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table
from rich.text import Text

from gateway.config.sizes import NONE, size

PIPE_WIDTH = 200


# --------------------------------------------------------------------------
# Values


def percent(value: object) -> str:
    """A 0..1 fraction as a percentage; a dash for null (e.g. no reads yet)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return NONE
    return f"{value * 100:.1f}%"


def duration(seconds: object) -> str:
    """``75`` -> ``1:15``; ``4000`` -> ``1:06:40``."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return NONE
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02}:{secs:02}" if hours else f"{minutes}:{secs:02}"


def when(value: object) -> str:
    """An API time (ISO 8601 UTC) to the second, for tables."""
    if not isinstance(value, str):
        return NONE
    return value.replace("T", " ").split(".")[0].removesuffix("Z")


def number(value: object) -> str:
    return NONE if value is None else str(value)


def s3_url(bucket: object, prefix: object = "") -> str:
    return f"s3://{bucket}/{prefix or ''}"


def _elapsed(job: Mapping[str, Any]) -> float | None:
    try:
        start = datetime.fromisoformat(job["started"])
        end = datetime.fromisoformat(job["finished"])
    except (KeyError, TypeError, ValueError):
        return None
    return (end - start).total_seconds()


# --------------------------------------------------------------------------
# Building blocks


def print_json(document: object) -> None:
    """``--json``: the API's document, and nothing else on stdout."""
    print(json.dumps(document, indent=2))


def _out() -> Console:
    # Made per use: under test runners sys.stdout changes between commands. Piped
    # into a file or grep, tables take the width they need: no wrapped names.
    # No markup: what the API answers (keys, messages) may hold [brackets].
    return Console(
        highlight=False, markup=False, width=None if sys.stdout.isatty() else PIPE_WIDTH
    )


def _titled(title: str | None, table: Table) -> RenderableType:
    # A title line of its own: a table title wider than the table would wrap.
    return table if title is None else Group(Text(title, style="bold"), table)


def _pairs(title: str, rows: Iterable[tuple[str, str]]) -> RenderableType:
    """A two-column table of labelled values under a title; values are not rich markup."""
    table = Table(show_header=False)
    table.add_column(style="dim")
    table.add_column()
    for label, value in rows:
        table.add_row(Text(label.replace("_", " ")), Text(value))
    return _titled(title, table)


def _table(
    title: str | None,
    columns: Iterable[str],
    rows: Iterable[Iterable[str]],
    numeric: Iterable[str] = (),
) -> RenderableType:
    """A table with a header; the ``numeric`` columns are right-aligned."""
    table = Table()
    right = set(numeric)
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    for row in rows:
        table.add_row(*map(Text, row))  # not markup: keys and messages may hold [brackets]
    return _titled(title, table)


def _value(key: str, value: object) -> str:
    """A result or parameter value; counts of bytes read as sizes."""
    if "bytes" in key and isinstance(value, int) and not isinstance(value, bool):
        return size(value)
    if isinstance(value, dict | list):
        return json.dumps(value)
    return number(value)


# --------------------------------------------------------------------------
# status and stats


def status(document: Mapping[str, Any]) -> None:
    """``tierstore status``: the ``tiers``, ``stats`` and ``jobs`` documents together."""
    tiers, stats = document.get("tiers", {}), document.get("stats", {})
    budget, used = tiers.get("hot_budget"), tiers.get("hot_used")
    share = used / budget if isinstance(used, int) and isinstance(budget, int) and budget else None
    hot = [
        ("budget", size(budget)),
        ("used", f"{size(used)} ({percent(share)})"),
        ("staged", size(tiers.get("hot_staged"))),
        ("cached", size(tiers.get("hot_cached"))),
        ("pinned", size(tiers.get("hot_pinned"))),
        ("watermarks", f"high {size(tiers.get('high_watermark'))}, "
                       f"low {size(tiers.get('low_watermark'))}"),
    ]
    capacity = [
        ("store", number(tiers.get("capacity"))),
        ("segments", number(tiers.get("segments"))),
        ("bytes", size(tiers.get("capacity_bytes"))),
        ("live ratio", percent(tiers.get("live_ratio"))),
        ("flush queue", number(tiers.get("flush_queue"))),
    ]
    if tiers.get("last_flush_error"):
        capacity.append(("last flush error", str(tiers["last_flush_error"])))
    hits = stats.get("hit_ratio", {})
    jobs = document.get("jobs", {}).get("jobs", [])
    traffic = [
        ("hit ratio", f"objects {percent(hits.get('objects'))}, "
                      f"bytes {percent(hits.get('bytes'))}"),
        ("jobs running", str(sum(1 for job in jobs if job.get("state") == "running"))),
        ("uptime", duration(stats.get("uptime_s"))),
    ]
    sections = [("hot tier", hot)]
    if isinstance(disk := tiers.get("disk"), Mapping):
        sections.append(("disk", _disk_rows(disk)))
    sections += [("capacity tier", capacity), ("gateway", traffic)]
    if isinstance(memory := stats.get("memory"), Mapping):
        sections.append(("memory", _memory_rows(memory)))
    if isinstance(cluster := tiers.get("cluster"), Mapping):
        sections.append(("cluster", _cluster_rows(cluster)))
        if isinstance(members := cluster.get("members"), list) and members:
            sections.append(("members", _member_rows(members)))
    console = _out()
    for title, rows in sections:
        console.print(_pairs(title, rows))


def _disk_rows(disk: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The hot tier's filesystem against the free-space floor (docs/operations.md#a-full-disk)."""
    free, floor, total = disk.get("free"), disk.get("floor"), disk.get("size")
    below = isinstance(free, int) and isinstance(floor, int) and free < floor
    refusals = disk.get("refusals") if isinstance(disk.get("refusals"), Mapping) else {}
    rows = [
        ("free", f"{size(free)} of {size(total)}" + (", BELOW THE FLOOR" if below else "")),
        ("floor", size(floor)),
        ("index reserve", f"{size(disk.get('reserve'))} " + ("held" if disk.get("reserve_held") else "GIVEN TO THE INDEX")
         + ("" if disk.get("index_writable", True) else "; index READ-ONLY until there is room")),
        ("refused writes", ", ".join(f"{cause} {number(n)}" for cause, n in sorted(refusals.items())) or NONE),
        ("fills skipped", number(disk.get("fills_skipped"))),
    ]
    if disk.get("warning"):
        rows.append(("warning", str(disk["warning"])))
    return rows


def _memory_rows(memory: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The process's RSS against its memory budget, and its caches (docs/operations.md#memory)."""
    rss, limit = memory.get("rss"), memory.get("limit")
    share = f" ({percent(rss / limit)} of the budget)" if isinstance(rss, int) and isinstance(limit, int) else ""
    caches = memory.get("caches") if isinstance(memory.get("caches"), Mapping) else {}
    state = "REFUSING new S3 requests (503 SlowDown)" if memory.get("refusing") else "serving"
    return [
        ("RSS", f"{size(rss)}{share}, peak {size(memory.get('peak_rss'))}"),
        ("budget", size(limit) if limit else "none"),
        ("state", f"{state}; caches at {percent(memory.get('squeeze'))} of their bounds"),
        ("refused", number(memory.get("refused"))),
        ("caches", f"{size(sum(row.get('bytes', 0) for row in caches.values()))} of "
                   f"{size(sum(row.get('bound', 0) for row in caches.values()))}"),
    ]


def _member_rows(members: list[Any]) -> list[tuple[str, str]]:
    """The node registry: each node's endpoint, heartbeat age and state."""
    rows = []
    for member in members:
        if not isinstance(member, Mapping):
            continue
        age = member.get("heartbeat_age")
        state = "this node" if member.get("me") else "live" if member.get("live") else "not live"
        heard = f"heartbeat {age:.1f} s ago" if isinstance(age, (int, float)) else "no heartbeat"
        rows.append((str(member.get("node")), f"{member.get('endpoint')}, {state}, {heard}"))
    return rows


def _cluster_rows(cluster: Mapping[str, Any]) -> list[tuple[str, str]]:
    """One of several gateways: what it writes, who writes the rest, its lag."""
    node = cluster.get("node")
    writers = cluster.get("writers") if isinstance(cluster.get("writers"), Mapping) else {}
    others = [f"{bucket} ({writer})" for bucket, writer in sorted(writers.items()) if writer != node]
    lag = cluster.get("lag_seconds")
    return [
        ("node", number(node)),
        ("writes", ", ".join(cluster.get("writing") or []) or NONE),
        ("follows", ", ".join(others) or NONE),
        ("lag", f"{NONE if lag is None else f'{lag:.1f} s'}, {number(cluster.get('lag_segments'))} segments to apply"),
    ]


def stats(document: Mapping[str, Any]) -> None:
    """``tierstore stats``: one row per S3 operation."""
    requests: Mapping[str, Any] = document.get("requests", {})
    columns = (
        "operation", "count", "errors", "bytes in", "bytes out", "p50 ms", "p90 ms", "p99 ms"
    )
    rows = []
    for operation, op in sorted(requests.items()):
        latency = op.get("latency_ms", {})
        rows.append([
            operation, number(op.get("count")), number(op.get("errors")),
            size(op.get("bytes_in")), size(op.get("bytes_out")),
            *(_ms(latency.get(q)) for q in ("p50", "p90", "p99")),
        ])
    title = f"requests since {when(document.get('since'))}"
    console = _out()
    if rows:
        console.print(_table(title, columns, rows, numeric=columns[1:]))
    else:
        console.print(f"no requests since {when(document.get('since'))}")


def _ms(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else NONE


# --------------------------------------------------------------------------
# buckets, pins, objects


def _policy_cells(bucket: Mapping[str, Any]) -> list[str]:
    write = {True: "through", False: "back"}.get(bucket.get("write_through"), NONE)
    return [
        write,
        {True: "on", False: "off"}.get(bucket.get("compression"), NONE),
        size(bucket.get("part_size")),
        size(bucket.get("small_object_size")),
        {True: "yes", False: "no"}.get(bucket.get("pinned"), NONE),
    ]


def buckets(document: Mapping[str, Any]) -> None:
    """``tierstore buckets list``."""
    columns = ("bucket", "created", "write", "compression", "part size", "small objects", "pinned")
    rows = [
        [str(b.get("name")), when(b.get("created")), *_policy_cells(b)]
        for b in document.get("buckets", [])
    ]
    console = _out()
    if rows:
        console.print(_table(None, columns, rows, numeric=("part size", "small objects")))
    else:
        console.print("no buckets")


def bucket(document: Mapping[str, Any]) -> None:
    """``tierstore buckets show`` (and what create and set answer)."""
    labels = ("write", "compression", "part size", "small object size", "pinned")
    rows = [("created", when(document.get("created"))), ("region", number(document.get("region")))]
    rows += zip(labels, _policy_cells(document), strict=True)
    _out().print(_pairs(f"bucket {document.get('name')}", rows))


def pins(document: Mapping[str, Any]) -> None:
    """``tierstore pins``: one s3:// URL a line, easy to feed to other commands."""
    urls = [s3_url(p.get("bucket"), p.get("prefix")) for p in document.get("pins", [])]
    print("\n".join(urls) if urls else "nothing is pinned")


def where(document: Mapping[str, Any]) -> None:
    """``tierstore where``: the object, then one row per chunk."""
    rows = [
        ("size", size(document.get("size"))),
        ("etag", number(document.get("etag"))),
        ("last modified", when(document.get("last_modified"))),
        ("where", number(document.get("where"))),
        ("pinned", {True: "yes", False: "no"}.get(document.get("pinned"), NONE)),
    ]
    console = _out()
    console.print(_pairs(s3_url(document.get("bucket"), document.get("key")), rows))
    columns = ("#", "size", "state", "file", "segment", "offset", "stored", "codec")
    chunk_rows = [
        [str(i), size(c.get("size")), number(c.get("state")), number(c.get("file_id")),
         number(c.get("segment")), number(c.get("offset")), size(c.get("stored")),
         number(c.get("codec"))]
        for i, c in enumerate(document.get("chunks", []))
    ]
    if chunk_rows:
        console.print(_table("chunks", columns, chunk_rows, numeric=("size", "offset", "stored")))


# --------------------------------------------------------------------------
# mounts


def _freshness(value: object) -> str:
    """``immutable``, or how long a check of the source holds: ``60 s``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:g} s"
    return number(value)


def _mount_cells(document: Mapping[str, Any]) -> list[str]:
    """endpoint, region, access key, writes, freshness, serve stale, listing ttl."""
    ttl = document.get("listing_ttl")
    return [
        number(document.get("endpoint")),
        number(document.get("region")),
        number(document.get("access_key")),
        {True: "read-write", False: "read-only"}.get(document.get("read_write"), NONE),
        _freshness(document.get("freshness")),
        {True: "yes", False: "no"}.get(document.get("serve_stale"), NONE),
        (f"{ttl:g} s" if ttl else "off") if isinstance(ttl, (int, float)) else NONE,
    ]


def mounts(document: Mapping[str, Any]) -> None:
    """``tierstore mounts``: one row per mounted bucket."""
    columns = (
        "mount", "source", "endpoint", "region", "access key", "writes", "freshness",
        "serve stale", "listing ttl", "created",
    )
    rows = [
        [str(m.get("name")), number(m.get("source")), *_mount_cells(m), when(m.get("created"))]
        for m in document.get("mounts", [])
    ]
    console = _out()
    if rows:
        console.print(_table(None, columns, rows))
    else:
        console.print("no mounts")


def mount(document: Mapping[str, Any]) -> None:
    """What ``tierstore mount`` answers: the mount, its secret key masked by the API."""
    endpoint, region, access_key, writes, freshness, serve_stale, listing_ttl = _mount_cells(document)
    rows = [
        ("source", number(document.get("source"))),
        ("endpoint", endpoint),
        ("region", region),
        ("access key", access_key),
        ("secret key", number(document.get("secret_key"))),
        ("writes", writes),
        ("freshness", freshness),
        ("serve stale", serve_stale),
        ("listing ttl", listing_ttl),
        ("checks", "MD5 ETag too" if document.get("check_md5") else "source checksum or length"),
        ("created", when(document.get("created"))),
    ]
    _out().print(_pairs(f"mount {document.get('name')}", rows))


# --------------------------------------------------------------------------
# epochs


def _epoch_progress(epoch: Mapping[str, Any]) -> str:
    return f"{epoch.get('consumed')}/{epoch.get('objects')}"


def epochs(document: Mapping[str, Any]) -> None:
    """``tierstore epochs list``: newest first."""
    columns = ("epoch", "bucket", "state", "read", "readers", "hit ratio", "prefetched", "created")
    rows = [
        [str(e.get("id")), str(e.get("bucket")), str(e.get("state")), _epoch_progress(e),
         number(e.get("readers")), percent(e.get("hit_ratio")), size(e.get("prefetched_bytes")),
         when(e.get("created"))]
        for e in document.get("epochs", [])
    ]
    console = _out()
    if rows:
        console.print(_table(None, columns, rows, numeric=("readers", "hit ratio", "prefetched")))
        _epoch_warnings(console, document.get("epochs", []))
    else:
        console.print("no epochs")


def _epoch_warnings(console: Console, epochs: Iterable[Mapping[str, Any]]) -> None:
    """Below the table, a line per epoch whose status warns (an older gateway sends none)."""
    for e in epochs:
        if e.get("warning"):
            console.print(Text(f"warning: epoch {e.get('id')}: {e.get('warning')}", style="yellow"))


def _named_keys(count: object, keys: object) -> str:
    """``2 (img/1.jpg, img/9.jpg)``: a count and the first keys an epoch names."""
    if not count or not isinstance(keys, list) or not keys:
        return number(count)
    return f"{count} ({', '.join(str(k) for k in keys[:3])}{', ...' if count != len(keys[:3]) else ''})"


def epoch(document: Mapping[str, Any]) -> None:
    """``tierstore epochs start|show|end``: one epoch."""
    positions = document.get("positions") or []
    shown = ", ".join(str(p) for p in positions[:8]) + (", ..." if len(positions) > 8 else "")
    rows = [
        ("bucket", number(document.get("bucket"))),
        ("state", number(document.get("state"))),
        ("read", _epoch_progress(document)),
        ("readers", number(document.get("readers"))),
        ("positions", shown or NONE),
        ("hits", f"{document.get('hits')} ({percent(document.get('hit_ratio'))})"),
        ("late", number(document.get("late"))),
        ("misses", number(document.get("misses"))),
        ("other reads", (f"{number(document.get('unmatched_reads'))} of {number(document.get('bucket_reads'))} "
                         "reads of the bucket were of keys not in the order")),
        ("prefetched", f"{document.get('prefetched_objects')} objects, {size(document.get('prefetched_bytes'))}"),
        ("ahead", f"{document.get('ahead_objects')} objects hot, {document.get('in_flight_objects')} in flight"),
        ("lookahead", f"{document.get('lookahead_objects')} objects, {size(document.get('lookahead_bytes'))}"),
        ("missing keys", _named_keys(document.get("missing", document.get("missing_objects")),
                                     document.get("missing_keys"))),
        ("failed keys", _named_keys(document.get("failed"), document.get("failed_keys"))),
        ("created", when(document.get("created"))),
        ("started", when(document.get("started"))),
        ("finished", when(document.get("finished"))),
    ]
    console = _out()
    console.print(_pairs(f"epoch {document.get('id')}", rows))
    _epoch_warnings(console, [document])


# --------------------------------------------------------------------------
# jobs


def _progress_text(job: Mapping[str, Any]) -> str:
    """``12/40 items  1.2 MiB/8.0 MiB  3.4 MiB/s  ETA 0:12``, leaving out what is unknown."""
    progress = job.get("progress") or {}
    items = f"{progress.get('items_done', 0)}"
    if progress.get("items_total") is not None:
        items += f"/{progress['items_total']}"
    parts = [f"{items} items", size(progress.get("bytes_done", 0))]
    if progress.get("bytes_total") is not None:
        parts[-1] += f"/{size(progress['bytes_total'])}"
    if job.get("rate_bytes_per_s") is not None:
        parts.append(f"{size(job['rate_bytes_per_s'])}/s")
    if job.get("eta_s") is not None:
        parts.append(f"ETA {duration(job['eta_s'])}")
    return "  ".join(parts)


def _params(job: Mapping[str, Any]) -> str:
    params = job.get("params") or {}
    return " ".join(f"{k}={v}" for k, v in params.items()) or NONE


def jobs(document: Mapping[str, Any]) -> None:
    """``tierstore jobs list``: newest first, as the API orders them."""
    columns = ("job", "kind", "state", "done", "progress", "created", "params")
    rows = [
        [str(j.get("id")), str(j.get("kind")), str(j.get("state")),
         percent((j.get("progress") or {}).get("fraction")), _progress_text(j),
         when(j.get("created")), _params(j)]
        for j in document.get("jobs", [])
    ]
    console = _out()
    if rows:
        console.print(_table(None, columns, rows, numeric=("done",)))
    else:
        console.print("no jobs")


def job(document: Mapping[str, Any]) -> None:
    """``tierstore jobs show`` and ``jobs cancel``: everything about one job."""
    rows = [
        ("kind", number(document.get("kind"))),
        ("params", _params(document)),
        ("state", number(document.get("state"))),
        ("created", when(document.get("created"))),
        ("started", when(document.get("started"))),
        ("finished", when(document.get("finished"))),
        ("done", percent((document.get("progress") or {}).get("fraction"))),
        ("progress", _progress_text(document)),
    ]
    rows += [(k, _value(k, v)) for k, v in (document.get("result") or {}).items()]
    rows += [("error", e) for e in document.get("errors") or []]
    _out().print(_pairs(f"job {document.get('id')}", rows))


def job_started(document: Mapping[str, Any]) -> None:
    """``--no-wait``: only the id on stdout, for scripts; how to follow it on stderr."""
    job_id = document.get("id")
    print(job_id)
    print(
        f"started {document.get('kind')} job {job_id}: `tierstore jobs wait {job_id}` follows it, "
        f"`tierstore jobs cancel {job_id}` cancels it",
        file=sys.stderr,
    )


def job_finished(document: Mapping[str, Any]) -> None:
    """After waiting: how the job ended and its result."""
    took = _elapsed(document)
    title = f"{document.get('kind')} job {document.get('id')} {document.get('state')}"
    if took is not None:
        title += f" in {duration(took)}"
    rows = [(k, _value(k, v)) for k, v in (document.get("result") or {}).items()]
    rows += [("error", e) for e in document.get("errors") or []]
    console = _out()
    if rows:
        console.print(_pairs(title, rows))
    else:
        console.print(title)


class JobProgress:
    """A live progress bar on stderr, fed each ``GET /jobs/{id}`` answer.

    The bar follows the job's ``fraction`` and pulses while it is unknown;
    rate and ETA are the gateway's, which sees every step, not the CLI's
    estimate from the samples it polled.
    """

    def __init__(self, job: Mapping[str, Any]) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TextColumn("{task.fields[detail]}", markup=False),
            console=Console(stderr=True, highlight=False),
        )
        self._task = self._progress.add_task(f"{job.get('kind')} {job.get('id')}", detail="")
        self.update(job)

    def __enter__(self) -> JobProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def update(self, job: Mapping[str, Any]) -> None:
        fraction = (job.get("progress") or {}).get("fraction")
        self._progress.update(
            self._task,
            total=None if fraction is None else 1.0,
            completed=fraction or 0.0,
            detail=_progress_text(job),
        )
