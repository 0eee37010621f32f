"""The Prometheus text exposition of the newest collection cycle.

Every stored sample of the newest cycle becomes a gauge named `skiplock_<metric>` with the
catalog's help text and labels; "not available" (None) is left out, as Prometheus expects of a
series it cannot measure. `skiplock_collection_age_seconds` is computed at scrape time, so a
dead scheduler shows as a growing age rather than as frozen values.

Several databases: each keeps its own samples, so the label `database` is added here, when
reading (`render_databases`): every series of every database carries it, and a database whose
samples could not be read has only `skiplock_collection_age_seconds{database=...}` = NaN.

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


class _Snapshot:
    """A prometheus-client collector over fixed lists of samples, one per database.

    `by_database` maps a database name to its samples (None: not read); the name None means
    one database and no `database` label (the domain's own `render_metrics`)."""

    def __init__(self, by_database: dict[str | None, list[Sample] | None], now: datetime):
        self.by_database = by_database
        self.now = now

    def collect(self) -> Iterable[Metric]:
        by_metric: dict[str, list[tuple[str | None, Sample]]] = {}
        for database, samples in self.by_database.items():
            for s in samples or []:
                if s.metric in METRICS and s.value is not None:
                    by_metric.setdefault(s.metric, []).append((database, s))
        lead = ["database"] if any(d is not None for d in self.by_database) else []
        for name in sorted(by_metric):
            meta = METRICS[name]
            family = GaugeMetricFamily(PREFIX + name, f"{meta.help} [{meta.unit}]", labels=lead + list(meta.labels))
            for database, s in by_metric[name]:
                values = [str(s.labels.get(label, "")) for label in meta.labels]
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


def render_samples(samples: list[Sample], now: datetime | None = None) -> bytes:
    return render_databases({None: samples}, now)


def render_databases(by_database: dict[str | None, list[Sample] | None], now: datetime | None = None) -> bytes:
    """The text format of several databases' newest samples, each series labelled `database`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(by_database, now or datetime.now(UTC)))
    return generate_latest(registry)


def render_metrics(conn: psycopg.Connection) -> tuple[bytes, str]:
    """(body, content type) of `/metrics`: the newest cycle's samples in the text format."""
    return render_samples(latest_cycle(conn)), CONTENT_TYPE_LATEST


CONTENT_TYPE = CONTENT_TYPE_LATEST
