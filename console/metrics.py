"""The Prometheus text exposition of the newest collection cycle.

Every stored sample of the newest cycle becomes a gauge named `skiplock_<metric>` with the
catalog's help text and labels; "not available" (None) is left out, as Prometheus expects of a
series it cannot measure. `skiplock_collection_age_seconds` is computed at scrape time, so a
dead scheduler shows as a growing age rather than as frozen values.

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
    """A prometheus-client collector over a fixed list of samples."""

    def __init__(self, samples: list[Sample], now: datetime):
        self.samples = samples
        self.now = now

    def collect(self) -> Iterable[Metric]:
        by_metric: dict[str, list[Sample]] = {}
        for s in self.samples:
            if s.metric in METRICS and s.value is not None:
                by_metric.setdefault(s.metric, []).append(s)
        for name in sorted(by_metric):
            meta = METRICS[name]
            family = GaugeMetricFamily(PREFIX + name, f"{meta.help} [{meta.unit}]", labels=list(meta.labels))
            for s in by_metric[name]:
                family.add_metric([str(s.labels.get(label, "")) for label in meta.labels], float(s.value))
            yield family
        age = GaugeMetricFamily(PREFIX + "collection_age_seconds", METRICS["collection_age_seconds"].help)
        if self.samples and self.samples[0].at is not None:
            age.add_metric([], max((self.now - self.samples[0].at).total_seconds(), 0.0))
        else:
            age.add_metric([], float("nan"))
        yield age


def render_samples(samples: list[Sample], now: datetime | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(samples, now or datetime.now(UTC)))
    return generate_latest(registry)


def render_metrics(conn: psycopg.Connection) -> tuple[bytes, str]:
    """(body, content type) of `/metrics`: the newest cycle's samples in the text format."""
    return render_samples(latest_cycle(conn)), CONTENT_TYPE_LATEST
