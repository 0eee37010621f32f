"""The Prometheus text exposition of the newest collection cycle.

Every stored sample of the newest cycle becomes a gauge named `skiplock_<metric>` with the
catalog's help text and labels; "not available" (None) is left out, as Prometheus expects of a
series it cannot measure. `skiplock_collection_age_seconds` is computed at scrape time, so a
dead scheduler shows as a growing age rather than as frozen values.

Several databases: each keeps its own samples, so the label `database` is added here, when
reading (`render_databases`): every series of every database carries it, and a database whose
samples could not be read has only `skiplock_collection_age_seconds{database=...}` = NaN.

**Cardinality.** A producer that writes to 5,000 queues would otherwise give Prometheus about
45,000 series per scrape (4.9 MB) and every series it ever named, forever. So per database, the
`queue_limit` worst queues (stuck leases, then the oldest waiting job, then dead letters, then
depth: the ones an on-call engineer needs by name) keep their own series, and every other queue
is folded into `queue="_other"`: counts summed, ages and latencies the maximum, the other labels
kept (`fold_queues`). The policy is itself exported: `skiplock_metrics_queue_series_limit`
(the limit), `skiplock_metrics_queues_folded` (how many queues are in `_other`) and
`skiplock_metrics_series_dropped{metric}` (how many of a metric's series went into it; 0 when
none). `queue="all"` (a figure over every queue) is never folded. A queue that becomes one of
the worst gets its own series back at the next scrape; alert rules on `_other` still fire (its
age is the worst of the folded queues).

**Backends.** The per-queue series of Skiplock's queues carry `backend`: `nats` for a queue
NATS JetStream serves (console/collectors/broker.py stores it), `postgres` for every other one
(added here: those samples are stored without it, as before the broker existed). A queue moving
between backends has a series of each while jobs are on both sides; the two are ranked and
folded as one queue.

A fair queue's groups (tenants, the `group_*` metrics) get the same treatment one level down:
the collector already keeps at most `[scheduler] group_series` groups a queue, and here the
`group_limit` worst of those (`web.metrics_group_series`; starving, then the longest wait, the
backlog, the dead letters) keep their own series and the others join `group="_other"`
(`skiplock_metrics_group_series_limit`, `skiplock_metrics_groups_folded`, and their series in
`skiplock_metrics_series_dropped`). A folded queue's groups all go into queue="_other",
group="_other".

This module only reads samples; it never runs a collector (a scrape must stay cheap however
often Prometheus comes) and does not authenticate (the web blueprint does).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import psycopg
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from console.catalog import METRICS
from console.samples import Sample, latest_cycle

PREFIX = "skiplock_"
OTHER = "_other"  # the queue label of the folded queues' series, and the group label of folded groups
DEFAULT_QUEUE_LIMIT = 200  # web.metrics_queue_series
DEFAULT_GROUP_LIMIT = 10  # web.metrics_group_series
KEEP_QUEUES = frozenset({"all"})  # figures over every queue, not a queue's own
# Per-queue metrics whose folded value is the worst one rather than the sum.
WORST_OF = frozenset({"queue_age_seconds", "stuck_lease_age_seconds", "claim_latency_seconds", "group_age_seconds"})
QUEUE_METRICS = frozenset(m.name for m in METRICS.values() if "queue" in m.labels)
GROUP_METRICS = frozenset(m.name for m in METRICS.values() if "group" in m.labels)
# A label's value where a sample does not carry it: a queue series without `backend` is a
# PostgreSQL queue's (Skiplock's own, and every [[external_queues]] source's), whose stored labels
# predate the broker and are kept as they were so their history and alert states go on.
LABEL_DEFAULTS = {"backend": "postgres"}


def _worst_queues(samples: list[Sample], limit: int) -> set[tuple[str | None, str]]:
    """The queues past the `limit` worst, as (external source, name): another library's queues
    are ranked and folded on their own."""
    figures: dict[tuple[str | None, str], list[float]] = {}
    for s in samples:
        queue = s.labels.get("queue")
        if s.metric not in QUEUE_METRICS or queue is None or queue in KEEP_QUEUES or s.value is None:
            continue
        key = (s.labels.get("external"), str(queue))
        row = figures.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        if s.metric == "stuck_leases":
            row[0] += s.value
        elif s.metric == "queue_age_seconds":
            row[1] = max(row[1], s.value)
        elif s.metric == "dead_letters":
            row[2] += s.value
        elif s.metric == "queue_depth" and s.labels.get("state") != "failed":
            row[3] += s.value
    by_source: dict[str | None, list[tuple[str | None, str]]] = {}
    for key in figures:
        by_source.setdefault(key[0], []).append(key)
    folded: set[tuple[str | None, str]] = set()
    for keys in by_source.values():
        if len(keys) > limit:
            keys.sort(key=lambda k: ([-v for v in figures[k]], k[1]))
            folded.update(keys[limit:])
    return folded


def _worst_groups(samples: list[Sample], limit: int) -> set[tuple[str, str]]:
    """The (queue, group) pairs past the `limit` worst groups of their queue, ranked as the
    groups collector ranks them (console/collectors/groups.py): starving, then the oldest
    eligible job, the backlog, the dead letters, the running jobs. The collector's own
    group="_other" is never folded again (the others are folded into it)."""
    figures: dict[tuple[str, str], list[float]] = {}
    for s in samples:
        queue, group = s.labels.get("queue"), s.labels.get("group")
        if s.metric not in GROUP_METRICS or queue is None or group is None or group == OTHER or s.value is None:
            continue
        row = figures.setdefault((str(queue), str(group)), [0.0, 0.0, 0.0, 0.0, 0.0])
        if s.metric == "group_starving":
            row[0] = max(row[0], s.value)
        elif s.metric == "group_age_seconds":
            row[1] = max(row[1], s.value)
        elif s.metric == "group_depth" and s.labels.get("state") == "eligible":
            row[2] += s.value
        elif s.metric == "group_dead_letters":
            row[3] += s.value
        elif s.metric == "group_depth" and s.labels.get("state") == "running":
            row[4] += s.value
    by_queue: dict[str, list[tuple[str, str]]] = {}
    for key in figures:
        by_queue.setdefault(key[0], []).append(key)
    folded: set[tuple[str, str]] = set()
    for keys in by_queue.values():
        if len(keys) > limit:
            keys.sort(key=lambda k: ([-v for v in figures[k]], k[1]))
            folded.update(keys[limit:])
    return folded


def fold_queues(samples: list[Sample], limit: int,
                group_limit: int | None = None) -> tuple[list[Sample], dict[str, int], int, int]:
    """(samples with every queue past the `limit` worst folded into queue="_other" and every
    group of a fair queue past its `group_limit` worst folded into group="_other", series
    folded per metric, queues folded, groups folded). A folded queue's group series go into
    queue="_other", group="_other": one series per metric, not one per tenant. A series is
    counted as folded when its labels changed, however many steps it took."""
    folded_queues = _worst_queues(samples, limit)
    folded_groups = set() if group_limit is None else _worst_groups(samples, group_limit)
    folded_groups = {key for key in folded_groups if (None, key[0]) not in folded_queues}
    dropped = {m: 0 for m in sorted(QUEUE_METRICS)}
    if not folded_queues and not folded_groups:
        return samples, dropped, 0, 0
    kept: list[Sample] = []
    merged: dict[tuple[str, tuple[tuple[str, str], ...]], Sample] = {}
    for s in samples:
        queue = s.labels.get("queue")
        if queue is None or s.metric not in QUEUE_METRICS:
            kept.append(s)
            continue
        labels = dict(s.labels)
        if (s.labels.get("external"), str(queue)) in folded_queues:
            labels["queue"] = OTHER
            if s.metric in GROUP_METRICS:
                labels["group"] = OTHER
        elif s.metric in GROUP_METRICS and (str(queue), str(s.labels.get("group"))) in folded_groups:
            labels["group"] = OTHER
        if labels == s.labels and labels.get("group") != OTHER:
            kept.append(s)
            continue
        # A series folded here, or the collector's own group="_other" that folded ones may join.
        if labels != s.labels:
            dropped[s.metric] += 1
        key = (s.metric, tuple(sorted(labels.items())))
        before = merged.get(key)
        if before is None or before.value is None:
            merged[key] = Sample(s.metric, labels, s.value, s.at)
        elif s.value is not None:
            value = max(before.value, s.value) if s.metric in WORST_OF else before.value + s.value
            merged[key] = Sample(s.metric, labels, value, before.at)
    return kept + list(merged.values()), dropped, len(folded_queues), len(folded_groups)


class _Snapshot:
    """A prometheus-client collector over fixed lists of samples, one per database.

    `by_database` maps a database name to its samples (None: not read); the name None means
    one database and no `database` label (the domain's own `render_metrics`)."""

    def __init__(self, by_database: dict[str | None, list[Sample] | None], now: datetime,
                 queue_limit: int = DEFAULT_QUEUE_LIMIT, group_limit: int = DEFAULT_GROUP_LIMIT):
        self.by_database = by_database
        self.now = now
        self.queue_limit = queue_limit
        self.group_limit = group_limit

    def collect(self) -> Iterable[Metric]:
        by_metric: dict[str, list[tuple[str | None, Sample]]] = {}
        policy: dict[str | None, tuple[dict[str, int], int, int]] = {}
        for database, samples in self.by_database.items():
            if samples is None:
                continue
            samples, dropped, queues, groups = fold_queues(samples, self.queue_limit, self.group_limit)
            policy[database] = dropped, queues, groups
            for s in samples:
                if s.metric in METRICS and s.value is not None:
                    by_metric.setdefault(s.metric, []).append((database, s))
        lead = ["database"] if any(d is not None for d in self.by_database) else []
        for name in sorted(by_metric):
            meta = METRICS[name]
            family = GaugeMetricFamily(PREFIX + name, f"{meta.help} [{meta.unit}]", labels=lead + list(meta.labels))
            for database, s in by_metric[name]:
                values = [str(s.labels.get(label, LABEL_DEFAULTS.get(label, ""))) for label in meta.labels]
                family.add_metric(([database] if lead else []) + values, float(s.value))
            yield family
        age = GaugeMetricFamily(PREFIX + "collection_age_seconds", METRICS["collection_age_seconds"].help, labels=lead)
        for database, samples in self.by_database.items():
            labels = [database] if lead else []
            if samples and samples[0].at is not None:
                age.add_metric(labels, max((self.now - samples[0].at).total_seconds(), 0.0))
            else:
                age.add_metric(labels, float("nan"))
        yield age
        # The cardinality policy (see the module docstring), so a dashboard can say what is folded.
        limit = GaugeMetricFamily(PREFIX + "metrics_queue_series_limit", "Queues of a database that keep their own "
                                  "series in /metrics (web.metrics_queue_series); the others are folded into "
                                  'queue="_other".', labels=lead)
        folded = GaugeMetricFamily(PREFIX + "metrics_queues_folded", 'Queues folded into queue="_other" in this '
                                   "scrape.", labels=lead)
        dropped = GaugeMetricFamily(PREFIX + "metrics_series_dropped", 'Series of a per-queue metric folded into '
                                    'queue="_other" (or, of a per-group metric, into group="_other") in this scrape '
                                    '(0: every queue and group has its own).',
                                    labels=lead + ["metric"])
        group_limit = GaugeMetricFamily(PREFIX + "metrics_group_series_limit", "Groups (tenants) of a fair queue that "
                                        "keep their own group_* series in /metrics (web.metrics_group_series); the "
                                        'others are folded into group="_other".', labels=lead)
        groups_folded = GaugeMetricFamily(PREFIX + "metrics_groups_folded", 'Groups of fair queues folded into '
                                          'group="_other" in this scrape (besides those the collector folded: '
                                          "skiplock_group_series_folded).", labels=lead)
        for database, (per_metric, queues, groups) in policy.items():
            labels = [database] if lead else []
            limit.add_metric(labels, float(self.queue_limit))
            folded.add_metric(labels, float(queues))
            group_limit.add_metric(labels, float(self.group_limit))
            groups_folded.add_metric(labels, float(groups))
            for metric, count in per_metric.items():
                dropped.add_metric(labels + [metric], float(count))
        yield limit
        yield folded
        yield dropped
        yield group_limit
        yield groups_folded


def render_samples(samples: list[Sample], now: datetime | None = None, *,
                   queue_limit: int = DEFAULT_QUEUE_LIMIT, group_limit: int = DEFAULT_GROUP_LIMIT) -> bytes:
    return render_databases({None: samples}, now, queue_limit=queue_limit, group_limit=group_limit)


def render_databases(by_database: dict[str | None, list[Sample] | None], now: datetime | None = None, *,
                     queue_limit: int = DEFAULT_QUEUE_LIMIT, group_limit: int = DEFAULT_GROUP_LIMIT) -> bytes:
    """The text format of several databases' newest samples, each series labelled `database`,
    with at most `queue_limit` queues' own series per database (the rest in queue="_other")
    and at most `group_limit` groups' own series per fair queue (the rest in group="_other")."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(by_database, now or datetime.now(UTC), queue_limit, group_limit))
    return generate_latest(registry)


def render_metrics(conn: psycopg.Connection) -> tuple[bytes, str]:
    """(body, content type) of `/metrics`: the newest cycle's samples in the text format."""
    return render_samples(latest_cycle(conn)), CONTENT_TYPE_LATEST


CONTENT_TYPE = CONTENT_TYPE_LATEST
