"""The definitions the faces share where a signal is more than one stored sample: when a queue
is idle, and from which age a session "holds back vacuum".

Every signal has one definition. Most are a stored metric (console/catalog.py) computed by one
collector over a window that suits it: dead letters per hour and the retry rate over
`[scheduler] rate_window` (console/collectors/queue.py, workers.py), never over one collection
interval. The two below combine samples with the rules in force, and every page, API, the
overview's verdict and the alert rules read them from here, so a panel cannot say "idle" or "no
session is holding back vacuum" while an alert says otherwise (docs/alerts.md, "Signals").

This module reads nothing itself: callers pass what they have read (samples, rules).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from console.alerts.defaults import DEFAULT_RULES

DEFAULT_RATE_WINDOW = timedelta(minutes=15)
HORIZON_METRIC = "xmin_horizon_age_seconds"


def rate_window(config: Any) -> timedelta:
    """`[scheduler] rate_window` of a loaded config (the default without one)."""
    scheduler = getattr(config, "scheduler", None)
    return getattr(scheduler, "rate_window", None) or DEFAULT_RATE_WINDOW


# --- live workers ----------------------------------------------------------------------------

def live_worker_within(config: Any) -> float:
    """Seconds since its last heartbeat within which a worker counts as live: `[web]
    stale_worker_after`, and never less than three of the workers' flush intervals (a worker
    writes its row every `[worker] flush_interval`). The workers_live metric (and so the
    workers_zero alert) and the Workers page's live/stale split both use it: a worker is not
    "live" on the page and missing from the metric at the same time."""
    worker = getattr(config, "worker", None)
    web = getattr(config, "web", None)
    flush = float(getattr(worker, "flush_interval", 5.0))
    stale = float(getattr(web, "stale_worker_after", 30.0))
    return max(stale, 3 * flush)


# --- idle ---------------------------------------------------------------------------------

def queue_idle(depth: Mapping[str, Any], last_busy: datetime | None, *, now: datetime,
               window: timedelta) -> tuple[bool, datetime | None]:
    """(idle, idle since) for one queue.

    Idle means nothing is eligible, scheduled or running now AND nothing finished within the
    rate window: `last_busy` is the newest sample in which the queue had work or finished jobs
    (console.samples.queue_activity, which reads queue_depth and queue_throughput). A queue
    that finishes two fast jobs a second is rarely caught running by a 10 s sample; its
    finished-jobs counter is, so it is never called idle. `idle since` is `last_busy` (None:
    no work in the samples' memory)."""
    if depth.get("eligible") or depth.get("scheduled") or depth.get("running"):
        return False, None
    if last_busy is not None and now - last_busy < window:
        return False, None
    return True, last_busy


# --- the xmin horizon ------------------------------------------------------------------------

def _default_horizon_threshold() -> float:
    rule = next(r for r in DEFAULT_RULES if r.name == "vacuum_blocked")
    return float(rule.threshold)


def horizon_threshold(rules: Iterable[Any] | None) -> float:
    """Seconds from which a holder of the xmin horizon "holds back vacuum": the lowest
    threshold among the enabled `>`/`>=` rules on xmin_horizon_age_seconds (vacuum_blocked and
    any rule of your own, whatever holder kind it selects), else the shipped vacuum_blocked's.
    The Database page's holders panel, the advisor and the overview use it, so the page an
    alert's "look here" opens names the holder the alert is about."""
    found = [float(r.threshold) for r in (rules or ())
             if getattr(r, "enabled", True) and r.metric == HORIZON_METRIC and r.op in (">", ">=")]
    return min(found) if found else _default_horizon_threshold()


def holds_back_vacuum(age_s: float | None, threshold: float, *, vacuum_removed_nothing: bool = False,
                      oldest: bool = False) -> bool:
    """Whether a holder of this age is reported as holding back vacuum: past the threshold of
    the rules in force, or the oldest holder while the last vacuum of a jobs table removed
    nothing (then something holds the horizon, whatever its age)."""
    if age_s is None:
        return False
    return age_s > threshold or (vacuum_removed_nothing and oldest)
