"""A fair queue's groups (tenants) as samples: backlog, running jobs, wait, dead letters, starvation.

For every fair queue (group_concurrency set; docs/queue.md, "Fair queues") this reads what the
queue page's Groups panel reads, through the same bounded walk (`limits.group_rows`, sql/limits.sql
`fair_groups`: one index probe per group with pending jobs, at most 1,000 groups a queue,
eligible jobs counted up to 10,000 a group, running jobs through the lease index, the dead
letters of the window among the newest `failed_queue_limit`), so a 100,000-job tenant costs a
cycle what it costs the panel, and the samples say what the panel says. One statement reads
QUEUES_PER_READ fair queues (the dead-letter walk is once per statement).

Cardinality: a queue may have thousands of tenants, and every (queue, group) pair named here
is a series stored every cycle, evaluated by the alert rules and offered to /metrics. So each
queue names at most `group_series` groups (`[scheduler] group_series`, 10), and all the fair
queues together at most `group_series_total` (200), the queues whose worst group waits longest
served first. Which groups: the starving ones first, then the oldest eligible job, the backlog,
the dead letters (the ones an on-call engineer must see by name; a hog with a big backlog has an
old head too). Every other group is folded into `group="_other"` (counts summed, the age the
oldest, `group_starving` the number of folded groups that starve) and counted by
`group_series_folded`, so nothing is dropped without a figure saying so. The NULL group (jobs
enqueued without a group) is `group="_none"`.

Only fair queues: a group key on an ordinary queue has no index to walk it by, and nothing there
is shared out by group.

A group named last cycle that holds nothing now (drained, or `_other` once nothing is folded) is
reported once more with zeros, so the newest sample says it emptied instead of keeping its last
backlog for the ten minutes a sample stays current; the pairs named last cycle are remembered.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from console.collectors.base import Context
from console.queue import limits
from console.samples import Sample

OTHER = "_other"  # the group label of the folded groups' series
NONE = "_none"  # the group label of the jobs enqueued without a group
QUEUES_PER_READ = 50  # fair queues read by one statement


def rank(group: dict[str, Any]) -> tuple:
    """The order groups get their own series in: starving, then waiting longest, then backlog,
    then dead letters, then running; the name last, so equal groups keep their place."""
    return (not group["starving"], -(group["age_seconds"] or 0.0), -group["eligible"], -group["failed"],
            -group["running"], group["group"] or "")


def _series(queue: str, label: str, eligible: float, running: float, age: float, dead: float,
            starving: float) -> list[Sample]:
    g = {"queue": queue, "group": label}
    return [
        Sample("group_depth", {**g, "state": "eligible"}, eligible),
        Sample("group_depth", {**g, "state": "running"}, running),
        Sample("group_age_seconds", g, age),
        Sample("group_dead_letters", g, dead),
        Sample("group_starving", g, starving),
    ]


def fold(by_queue: dict[str, list[dict[str, Any]]], per_queue: int, total: int) -> list[Sample]:
    """The samples of every fair queue's groups (`by_queue`: queue -> `limits.group_rows`'
    groups) within the limits: at most `per_queue` named groups a queue and `total` over all,
    the rest in group="_other"."""
    ordered = {name: sorted(groups, key=rank) for name, groups in by_queue.items()}
    # The total goes first to the queues whose worst group is worst (then by name).
    queues = sorted(ordered, key=lambda name: (rank(ordered[name][0]) if ordered[name] else (True,), name))
    left = total
    out: list[Sample] = []
    for name in queues:
        groups = ordered[name]
        keep = max(0, min(per_queue, left, len(groups)))
        left -= keep
        named, folded = groups[:keep], groups[keep:]
        for g in named:
            out += _series(name, g["group"] if g["group"] is not None else NONE, g["eligible"], g["running"],
                           g["age_seconds"] or 0.0, g["failed"], 1.0 if g["starving"] else 0.0)
        if folded:
            out += _series(name, OTHER, sum(g["eligible"] for g in folded), sum(g["running"] for g in folded),
                           max(g["age_seconds"] or 0.0 for g in folded), sum(g["failed"] for g in folded),
                           sum(1.0 for g in folded if g["starving"]))
        out.append(Sample("queue_groups", {"queue": name}, len(groups)))
        out.append(Sample("group_series_folded", {"queue": name}, len(folded)))
    return out


def collect(ctx: Context) -> Iterable[Sample]:
    opts = ctx.options
    names = limits.fair_queues(ctx.conn)
    by_queue: dict[str, list[dict[str, Any]]] = {}
    # A statement reads QUEUES_PER_READ queues: the dead-letter walk is once per statement, not
    # once per queue, and each statement stays well inside the collector's statement timeout.
    for start in range(0, len(names), QUEUES_PER_READ):
        found = limits.group_rows(ctx.conn, names[start:start + QUEUES_PER_READ], window=opts.rate_window,
                                  failed_cap=opts.failed_queue_limit)
        by_queue.update({name: shaped["groups"] for name, shaped in found.items()})
    out = fold(by_queue, opts.group_series, opts.group_series_total)
    named = {(s.labels["queue"], s.labels["group"]) for s in out if "group" in s.labels}
    for queue, group in ctx.previous.get("busy", []):
        if (queue, group) not in named:
            out += _series(queue, group, 0.0, 0.0, 0.0, 0.0, 0.0)
    ctx.remember({"busy": sorted({(s.labels["queue"], s.labels["group"]) for s in out
                                  if "group" in s.labels and s.value})})
    return out
