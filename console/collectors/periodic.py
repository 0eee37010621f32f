"""Periodic (cron) jobs: how long since each schedule last succeeded, against its interval.

Reads the small `skiplock.periodic` table (one row per live schedule; the scheduler's periodic
job keeps `last_success_at` current from the runs' outcomes). `periodic_late_ratio` is the age
of the last success (or of the schedule, before its first success) divided by the longest gap
between two of its slots: above 2 a run was missed or failed twice over, which the default
alert rule `periodic_late` pages on. A paused schedule reports 0, since nobody expects it to run.
"""

from __future__ import annotations

from collections.abc import Iterable

from console.collectors.base import Context
from console.samples import Sample


def collect(ctx: Context) -> Iterable[Sample]:
    out: list[Sample] = []
    for row in ctx.rows("periodic", "collector"):
        labels = {"name": row["name"]}
        age = float(row["success_age"])
        interval = float(row["interval_seconds"])
        success_age = age if row["last_success_at"] is not None else None
        out.append(Sample("periodic_last_success_age_seconds", labels, success_age))
        out.append(Sample("periodic_interval_seconds", labels, interval))
        out.append(Sample("periodic_late_ratio", labels, 0.0 if row["paused"] else age / interval))
        out.append(Sample("periodic_missed_total", labels, float(row["missed"])))
        out.append(Sample("periodic_paused", labels, 1.0 if row["paused"] else 0.0))
    return out
