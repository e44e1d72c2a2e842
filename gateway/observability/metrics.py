"""Metrics of the S3 data plane: Prometheus series and the ``/stats`` view.

One :class:`Metrics` per node (``gateway.node.Node``), with a registry of its own
(never the process-wide default: tests run several apps in one process). The app calls
:meth:`Metrics.observe` once per request, after the response went out; the
admin API calls :meth:`Metrics.render` for ``/metrics`` and
:meth:`Metrics.stats` for ``/stats``.

Per request the cost is one dictionary lookup (the sums of its
(operation, status, tier)) and a handful of integer additions; the
Prometheus families are built from those sums when scraped. The tier state (hot-tier bytes, capacity segments, flush
queue, jobs) is not tracked here: it is read at scrape time from the mapping
the admin API passes in, so nothing can drift from ``/tiers``.

``/stats`` derives everything from the same series ``/metrics`` exposes;
latency percentiles are estimated from the duration histogram's buckets the
way PromQL's ``histogram_quantile`` does (see :func:`quantile`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from gateway.s3.xml import iso8601

if TYPE_CHECKING:
    from tiering.reads.plan import ReadTally

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds. 0.2 ms (a small hot GET on loopback) to 30 s (a large object from
# a slow capacity store), about x1.6 a step: an estimate interpolated inside
# one bucket is off by less than the bucket's width, ~40 % at worst, and the
# 26 buckets keep a series small. Slower requests land in +Inf.
LATENCY_BUCKETS = (
    0.0002, 0.0004, 0.0007, 0.001, 0.0015, 0.0025, 0.004, 0.007,
    0.01, 0.015, 0.025, 0.04, 0.07, 0.1, 0.15, 0.25, 0.4, 0.7,
    1.0, 1.5, 2.5, 4.0, 7.0, 10.0, 15.0, 30.0,
)

# The tier a request was served from; "none" when it read no object body.
# "peer": the hot tier of the cluster node that keeps the object.
HOT, PEER, CAPACITY, NONE = "hot", "peer", "capacity", "none"
TIERS = (HOT, PEER, CAPACITY)

_REQUESTS = "tierstore_s3_requests"
_DURATION = "tierstore_s3_request_duration_seconds"
_RECEIVED = "tierstore_s3_received_bytes"
_SENT = "tierstore_s3_sent_bytes"
_READS = "tierstore_object_reads"
_SERVED = "tierstore_served_bytes"
_BATCHED = "tierstore_batch_objects"
_WORKER_READS = "tierstore_worker_reads"
_UNMATCHED = "tierstore_epoch_unmatched_reads"
_USERS = "tierstore_s3_user_requests"


def tier_of(tally: ReadTally | None) -> str:
    """The tier a request was served from: any byte fetched from the
    capacity store makes it a capacity read (the request waited on it),
    else any byte from another node's hot tier a peer read."""
    if tally is None:
        return NONE
    if tally.capacity:
        return CAPACITY
    if tally.peer:
        return PEER
    if tally.hot:
        return HOT
    return NONE


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Estimate the ``q`` quantile from cumulative histogram buckets.

    ``buckets`` are (upper bound, cumulative count) sorted by bound, the last
    one ``+Inf``. As PromQL's ``histogram_quantile``: find the first bucket
    whose count reaches ``q`` of the total and interpolate linearly between
    its lower and upper bound (the first bucket starts at 0); a rank in the
    ``+Inf`` bucket answers the highest finite bound. None when empty.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q} is not between 0 and 1")
    if not buckets or not buckets[-1][1]:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:  # q = 0 on an empty first bucket
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower  # counts not cumulative; never with our own histogram


@dataclass(slots=True)
class _Series:
    """What the requests of one (operation, status, tier) add up to."""

    count: int = 0
    received: int = 0
    sent: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))  # the last: +Inf


class Metrics:
    """Per-request metrics of one S3 data plane, in a registry of its own.

    A request adds to plain counters (:class:`_Series`), read into
    Prometheus families when scraped (:class:`_Requests`): no lock or
    label lookup per request. Only the event loop's thread calls
    :meth:`observe` and :meth:`worker_reads`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.started = time.time()
        self._started_monotonic = time.monotonic()
        self._series: dict[tuple[str, int, str], _Series] = {}
        self.served = dict.fromkeys(TIERS, 0)  # object body bytes by tier
        self.batched = 0  # objects sent in GetBatch tar streams
        self.worker_answers = {"lookup": 0, "kept": 0}
        self.by_user: dict[tuple[str, int], int] = {}  # (user, status) -> requests
        # Read at scrape time: the epochs count these on every GET (Node.start sets it).
        self.unmatched_reads: Callable[[], int] = lambda: 0
        self.registry.register(_Requests(self))

    # -- per request ----------------------------------------------------

    def observe(
        self,
        op: str,
        status: int,
        tier: str,
        seconds: float,
        received: int,
        sent: int,
        served_hot: int = 0,
        served_capacity: int = 0,
        batched: int = 0,
        user: str = "",
        served_peer: int = 0,
    ) -> None:
        """Record one finished request (``batched``: the objects a GetBatch sent;
        ``user``: who asked, gateway/auth/access.py, "" when nobody was recognised)."""
        if user:
            self.by_user[(user, status)] = self.by_user.get((user, status), 0) + 1
        series = self._series.get((op, status, tier))
        if series is None:
            series = self._series[(op, status, tier)] = _Series()
        series.count += 1
        series.seconds += seconds
        series.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        if received:
            series.received += received
        if sent:
            series.sent += sent
        if served_hot:
            self.served[HOT] += served_hot
        if served_capacity:
            self.served[CAPACITY] += served_capacity
        if served_peer:
            self.served[PEER] += served_peer
        if batched:
            self.batched += batched

    def worker_reads(self, looked_up: int, kept: int) -> None:
        """Hot GETs of read workers: ``looked_up`` the writer answered a
        lookup for, ``kept`` the workers answered from lookups they kept."""
        self.worker_answers["lookup"] += looked_up
        self.worker_answers["kept"] += kept

    def series(self) -> list[tuple[tuple[str, int, str], _Series]]:
        """Every (operation, status, tier) seen so far and its sums."""
        return list(self._series.items())

    # -- views ----------------------------------------------------------

    def render(
        self,
        tier_status: Mapping[str, object] | None = None,
        jobs_by_state: Mapping[str, int] | None = None,
        memory: Mapping[str, object] | None = None,
    ) -> bytes:
        """The Prometheus text exposition (serve it with CONTENT_TYPE): the
        request series plus gauges and counters read from ``tier_status``
        (the ``/tiers`` body), ``jobs_by_state`` and ``memory`` (the
        ``memory`` part of ``/stats``) at this moment."""
        extra: list[Metric] = [GaugeMetricFamily(
            "tierstore_start_time_seconds", "When this gateway started serving S3 (Unix time).",
            value=self.started)]
        if tier_status is not None:
            extra += _tier_families(tier_status)
        if jobs_by_state is not None:
            jobs = GaugeMetricFamily("tierstore_jobs", "Admin jobs by state.", labels=("state",))
            for state, count in sorted(jobs_by_state.items()):
                jobs.add_metric((state,), count)
            extra.append(jobs)
        if memory is not None:
            extra += _memory_families(memory)
        return generate_latest(_Scrape(self.registry, extra))

    def stats(self) -> dict[str, object]:
        """The ``/stats`` body of the admin API without its "capacity" part."""
        requests: dict[str, dict[str, int]] = {}
        buckets: dict[str, list[int]] = {}
        reads = dict.fromkeys(TIERS, 0)
        for (op, status, tier), series in self.series():
            row = requests.setdefault(op, {"count": 0, "errors": 0, "bytes_in": 0, "bytes_out": 0})
            row["count"] += series.count
            if status >= 400:
                row["errors"] += series.count
            row["bytes_in"] += series.received
            row["bytes_out"] += series.sent
            counts = buckets.setdefault(op, [0] * len(series.buckets))
            for i, n in enumerate(series.buckets):
                counts[i] += n
            if tier in reads:
                reads[tier] += series.count
        served = dict(self.served)
        out: dict[str, object] = {}
        for op in sorted(requests):
            cumulative = list(zip((*LATENCY_BUCKETS, math.inf), itertools.accumulate(buckets[op]), strict=True))
            out[op] = dict(requests[op], latency_ms={
                name: _ms(quantile(q, cumulative)) for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
            })
        return {
            "since": iso8601(int(self.started * 1000)),
            "uptime_s": round(time.monotonic() - self._started_monotonic, 3),
            "requests": out,
            # A hit: served from this node's hot tier or the cluster node's that keeps it.
            "hit_ratio": {
                "objects": _ratio(reads[HOT] + reads[PEER], sum(reads.values())),
                "bytes": _ratio(served[HOT] + served[PEER], sum(served.values())),
            },
            "served": {tier: {"objects": reads[tier], "bytes": served[tier]} for tier in TIERS},
            "worker_reads": dict(self.worker_answers),
        }


class _Requests:
    """The request series of a :class:`Metrics`, as Prometheus families, read
    from its plain counters at each scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        requests: dict[tuple[str, str], int] = {}
        durations: dict[tuple[str, str], tuple[list[int], float]] = {}
        received: dict[str, int] = {}
        sent: dict[str, int] = {}
        reads: dict[str, int] = {}
        for (op, status, tier), series in m.series():
            key = (op, str(status))
            requests[key] = requests.get(key, 0) + series.count
            counts, seconds = durations.get((op, tier), ([0] * len(series.buckets), 0.0))
            durations[(op, tier)] = ([a + b for a, b in zip(counts, series.buckets, strict=True)],
                                     seconds + series.seconds)
            received[op] = received.get(op, 0) + series.received
            sent[op] = sent.get(op, 0) + series.sent
            if tier in TIERS:
                reads[tier] = reads.get(tier, 0) + series.count
        family = CounterMetricFamily(_REQUESTS, "S3 requests by operation and HTTP status.",
                                     labels=("operation", "code"))
        for labels, value in requests.items():
            family.add_metric(labels, value)
        yield family
        histogram = HistogramMetricFamily(_DURATION, "S3 request time, from the request head to the last "
                                          "byte of the response, by operation and served tier.",
                                          labels=("operation", "tier"))
        bounds = [floatToGoString(b) for b in LATENCY_BUCKETS] + ["+Inf"]
        for labels, (counts, seconds) in durations.items():
            histogram.add_metric(labels, list(zip(bounds, itertools.accumulate(counts), strict=True)), seconds)
        yield histogram
        for name, doc, label, values in (
            (_RECEIVED, "Request body bytes received, by S3 operation.", "operation", received),
            (_SENT, "Response body bytes sent, by S3 operation.", "operation", sent),
            (_READS, ("Object GETs by the tier that served them (capacity when any byte came from the "
                      "capacity store; peer: from the cluster node that keeps the object)."), "tier", reads),
            (_SERVED, "Object body bytes served, by the tier they came from.", "tier", m.served),
            (_WORKER_READS, ("Hot GETs read workers answered, by where they found the object: a lookup of "
                             "the writer's, or one they kept."), "answer", m.worker_answers),
        ):
            family = CounterMetricFamily(name, doc, labels=(label,))
            for value_label, value in values.items():
                family.add_metric((value_label,), value)
            yield family
        yield CounterMetricFamily(_BATCHED, "Objects sent in GetBatch tar streams (docs/batch.md).", value=m.batched)
        users = CounterMetricFamily(_USERS, "S3 requests by who asked (a user's name, root or anonymous) and "
                                    "HTTP status; 403 is a refusal (docs/users-and-policies.md).",
                                    labels=("user", "code"))
        for (user, status), value in list(m.by_user.items()):
            users.add_metric((user, str(status)), value)
        yield users
        yield CounterMetricFamily(_UNMATCHED, "GETs of a bucket with an active epoch of keys the epoch does "
                                  "not name: its keys are not the keys read (docs/prefetch.md).",
                                  value=m.unmatched_reads())


class _Scrape:
    """The registry's series plus the families read at this scrape.

    The client library's ``*_created`` samples (a creation time per series)
    are left out: they double the series count and Prometheus, which sees a
    counter reset by itself, has no use for them. (The library's switch for
    this is process-wide; this one is per registry.)"""

    def __init__(self, registry: CollectorRegistry, extra: Iterable[Metric]) -> None:
        self._registry = registry
        self._extra = extra

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():  # fresh objects on every collect
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric
        yield from self._extra


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _ratio(part: int, whole: int) -> float | None:
    return None if not whole else round(part / whole, 6)


# --------------------------------------------------------------------------
# Scrape-time families from the /tiers body


# (metric, help, key in the /tiers body); bytes unless the name says otherwise.
_GAUGES = (
    ("tierstore_hot_budget_bytes", "Byte budget of the hot tier.", "hot_budget"),
    ("tierstore_hot_used_bytes", "Bytes the hot tier holds or has promised (staged, cached, reserved).",
     "hot_used"),
    ("tierstore_capacity_segments", "Segments in the capacity store.", "segments"),
    ("tierstore_capacity_stored_bytes", "Bytes of the segments in the capacity store.", "capacity_bytes"),
    ("tierstore_capacity_live_bytes", "Bytes of the capacity store's segments still referenced by the "
     "namespace (the rest is for compaction).", "capacity_live"),
    ("tierstore_capacity_live_ratio", "Live fraction of the capacity store's segment data (1 when empty).",
     "live_ratio"),
    ("tierstore_flush_queue_items", "Staged writes waiting for the flusher.", "flush_queue"),
    ("tierstore_pending_records", "Tombstones and bucket events not yet written to a segment.",
     "pending_records"),
)
_COUNTERS = (
    ("tierstore_hot_evicted_bytes", "Bytes evicted from the hot tier.", "evicted"),
    ("tierstore_capacity_segments_written", "Segments the flusher and compactor wrote.", "segments_written"),
    ("tierstore_capacity_read_bytes", "Bytes read from the capacity store.", "capacity_bytes_read"),
    ("tierstore_capacity_written_bytes", "Bytes written to the capacity store.", "capacity_bytes_written"),
)
# (metric, help, label, {label value: key}); a labelled gauge or counter.
_HOT_STATES = {"staged": "hot_staged", "cached": "hot_cached", "pinned": "hot_pinned",
               "reserved": "hot_reserved"}
_WATERMARKS = {"high": "high_watermark", "low": "low_watermark"}
_LOOKUPS = {"hit": "cache_hits", "miss": "cache_misses"}


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _labelled(
    family: GaugeMetricFamily | CounterMetricFamily, status: Mapping[str, object], keys: Mapping[str, str]
) -> Iterator[Metric]:
    for label, key in keys.items():
        if (value := _number(status.get(key))) is not None:
            family.add_metric((label,), value)
    if family.samples:
        yield family


def _tier_families(status: Mapping[str, object]) -> Iterator[Metric]:
    """Families for the keys ``status`` has; missing keys are left out."""
    for name, doc, key in _GAUGES:
        if (value := _number(status.get(key))) is not None:
            yield GaugeMetricFamily(name, doc, value=value)
    for name, doc, key in _COUNTERS:
        if (value := _number(status.get(key))) is not None:
            yield CounterMetricFamily(name, doc, value=value)
    yield from _labelled(GaugeMetricFamily(
        "tierstore_hot_bytes", "Hot-tier bytes by state (pinned bytes count in cached too).",
        labels=("state",)), status, _HOT_STATES)
    yield from _labelled(GaugeMetricFamily(
        "tierstore_hot_watermark_bytes", "Eviction starts above the high watermark and stops at the low one.",
        labels=("level",)), status, _WATERMARKS)
    yield from _labelled(CounterMetricFamily(
        "tierstore_hot_cache_lookups", "Lookups of capacity extents in the hot tier, by result.",
        labels=("result",)), status, _LOOKUPS)
    if "last_flush_error" in status:
        yield GaugeMetricFamily("tierstore_flush_failing", "1 while the last flush attempt failed.",
                                value=1 if status["last_flush_error"] else 0)
    yield from _cluster_families(status.get("cluster"))
    yield from _disk_families(status.get("disk"))
    kinds = status.get("capacity_requests")
    if isinstance(kinds, Mapping):
        requests = CounterMetricFamily(
            "tierstore_capacity_requests", "Requests to the capacity store, by kind (one per logical "
            "request; retried attempts are counted in tierstore_capacity_retries_total).", labels=("kind",))
        for kind, count in sorted(kinds.items()):
            if (value := _number(count)) is None:
                continue
            if kind == "retries":
                yield CounterMetricFamily("tierstore_capacity_retries", "Retried capacity-store attempts.",
                                          value=value)
            else:
                requests.add_metric((str(kind),), value)
        if requests.samples:
            yield requests


def _disk_families(disk: object) -> Iterator[Metric]:
    """The hot tier's filesystem against the free-space floor, and what a
    full disk cost (tiering/maintenance/space.py, docs/operations.md)."""
    if not isinstance(disk, Mapping):
        return
    for name, doc, key in (
        ("tierstore_disk_size_bytes", "Size of the hot tier's filesystem.", "size"),
        ("tierstore_disk_free_bytes", "Free bytes of the hot tier's filesystem.", "free"),
        ("tierstore_disk_floor_bytes", "Free bytes the hot tier leaves: below them it evicts, and refuses "
         "writes that would go below.", "floor"),
    ):
        if (value := _number(disk.get(key))) is not None:
            yield GaugeMetricFamily(name, doc, value=value)
    reserve = (_number(disk.get("reserve")) or 0) if disk.get("reserve_held") else 0
    yield GaugeMetricFamily("tierstore_index_reserve_bytes", "Bytes the index's reserve holds for it now "
                            "(0 once given to the index on a full disk, until made again).", value=reserve)
    yield GaugeMetricFamily("tierstore_index_writable", "0 while the index is open read-only: the disk had "
                            "no room to open it for writes.", value=1 if disk.get("index_writable", True) else 0)
    yield GaugeMetricFamily("tierstore_hot_budget_exceeds_disk", "1 when the hot tier's budget is more than its "
                            "filesystem can hold above the floor.", value=1 if disk.get("warning") else 0)
    refusals = disk.get("refusals")
    if isinstance(refusals, Mapping):
        family = CounterMetricFamily("tierstore_write_refusals", "Writes refused for lack of room, by cause: "
                                     "budget, floor, disk (the filesystem refused a write), index.",
                                     labels=("cause",))
        for cause, count in sorted(refusals.items()):
            if (value := _number(count)) is not None:
                family.add_metric((str(cause),), value)
        yield family
    if (value := _number(disk.get("fills_skipped"))) is not None:
        yield CounterMetricFamily("tierstore_hot_fills_skipped", "Cache fills left out because the disk had "
                                  "no room above the floor (their reads were answered).", value=value)


def _cluster_families(cluster: object) -> Iterator[Metric]:
    """One of several gateways: the leases it holds and how far it trails the writers."""
    if not isinstance(cluster, Mapping):
        return
    writing = cluster.get("writing")
    yield GaugeMetricFamily("tierstore_cluster_leases_held", "Buckets whose write lease this gateway holds.",
                            value=len(writing) if isinstance(writing, list) else 0)
    yield GaugeMetricFamily("tierstore_cluster_terms", "Write terms claimed in the capacity store so far.",
                            value=_number(cluster.get("terms")) or 0)
    lag = _number(cluster.get("lag_seconds"))
    if lag is not None:
        yield GaugeMetricFamily("tierstore_replica_lag_seconds", "Seconds since this gateway last had "
                                "applied every segment other writers had in the capacity store.", value=lag)
    yield GaugeMetricFamily("tierstore_replica_lag_segments", "Segments listed but not yet applied.",
                            value=_number(cluster.get("lag_segments")) or 0)
    members = cluster.get("members")
    if isinstance(members, list):
        yield GaugeMetricFamily("tierstore_cluster_members_live", "Live nodes in the node registry, this one "
                                "included.", value=sum(1 for m in members if isinstance(m, Mapping) and m.get("live")))


def _memory_families(memory: Mapping[str, object]) -> Iterator[Metric]:
    """The process's memory against its budget, and each cache's bytes,
    entries and bound (gateway/serving/memory.py, tiering/memo.py)."""
    for name, doc, key in (
        ("tierstore_memory_rss_bytes", "Resident memory of the gateway process.", "rss"),
        ("tierstore_memory_anon_bytes", "Anonymous (heap) share of the resident memory.", "rss_anon"),
        ("tierstore_memory_limit_bytes", "The memory budget (absent: none).", "limit"),
        ("tierstore_memory_squeeze", "Fraction of their configured bounds the caches may hold now "
         "(below 1 while the process is near its budget).", "squeeze"),
    ):
        if (value := _number(memory.get(key))) is not None:
            yield GaugeMetricFamily(name, doc, value=value)
    yield GaugeMetricFamily("tierstore_memory_refusing", "1 while new S3 requests are refused (503 SlowDown) "
                            "for memory.", value=1 if memory.get("refusing") else 0)
    yield CounterMetricFamily("tierstore_memory_refused_requests", "S3 requests refused with 503 SlowDown "
                              "because the process was at its memory budget.",
                              value=_number(memory.get("refused")) or 0)
    yield CounterMetricFamily("tierstore_memory_sheds", "Samples at the budget's high-water mark that halved "
                              "the caches' bounds.", value=_number(memory.get("sheds")) or 0)
    yield from _buffer_families(memory.get("buffers"))
    caches = memory.get("caches")
    if not isinstance(caches, Mapping):
        return
    for name, doc, key in (
        ("tierstore_cache_bytes", "Estimated bytes each cache holds.", "bytes"),
        ("tierstore_cache_entries", "Entries each cache holds.", "entries"),
        ("tierstore_cache_bound_bytes", "The bound in force of each cache, in bytes.", "bound"),
    ):
        family = GaugeMetricFamily(name, doc, labels=("cache",))
        for cache, row in sorted(caches.items()):
            if isinstance(row, Mapping) and (value := _number(row.get(key))) is not None:
                family.add_metric((str(cache),), value)
        yield family


def _buffer_families(buffers: object) -> Iterator[Metric]:
    """The bytes requests' buffers hold against their share of the budget
    (tiering/admission.py)."""
    if not isinstance(buffers, Mapping):
        return
    for name, doc, key in (
        ("tierstore_memory_buffers_bytes", "Bytes reserved now by the buffers of requests and flushes.", "held"),
        ("tierstore_memory_buffers_limit_bytes", "The share of the memory budget those buffers may reserve "
         "(absent: no budget).", "limit"),
    ):
        if (value := _number(buffers.get(key))) is not None:
            yield GaugeMetricFamily(name, doc, value=value)
    yield CounterMetricFamily("tierstore_memory_buffers_refused", "Reservations of buffer bytes not granted "
                              "(the request answered 503 SlowDown).", value=_number(buffers.get("refused")) or 0)
