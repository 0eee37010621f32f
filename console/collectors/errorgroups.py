"""Error groups that are new or regressed: "what changed" in the dead letters.

Each cycle reads the dead letters that failed for good since the previous cycle (with a minute
of overlap, so one committed late is not missed; the first cycle only starts the watch, so
an upgrade does not call every existing group new; at most `RECENT_CAP` of them, newest first,
through jobs_failed_idx), by fingerprint, and remembers every group in skiplock.error_groups
(migration 021): first and last seen, kinds, queues, an example. A group is

- **new** when the console never saw it before and no older dead letter has its fingerprint;
- **regressed** when it fails again after `Options.error_group_quiet` (`[scheduler]
  error_group_quiet`, 24 h by default) without a dead letter.

For `Options.error_group_new_for` (1 h) after that, and unless an operator ignored it, it is the
series `error_group_new{fingerprint, change}`: its dead letters since the change that are still
dead letters (an index-only count, capped at `COUNT_CAP`). The default rule new_error_group
fires on it; a group that keeps failing steadily is neither new nor regressed, so it never
fires again (its series ends after `error_group_new_for`, and the alert resolves).

The fingerprint label hides the values of `Options.secret_keys` (console.redaction), like every
alert link and webhook: fingerprints made since issue 26 hide the default keys already.

This collector decides nothing about severity (the rule does) and never alerts by itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from console.collectors.base import Context
from console.redaction import redact_text
from console.samples import Sample

OVERLAP = timedelta(seconds=60)  # a dead letter committed this long after its finished_at is still seen
RECENT_CAP = 5000                # dead letters read per cycle, newest first
GROUPS_CAP = 100                 # groups remembered per cycle
CHANGED_CAP = 50                 # new or regressed groups reported per cycle
COUNT_CAP = 100_000              # a group's dead letters counted per cycle


def label(fingerprint: str, secret_keys: frozenset[str]) -> str:
    """The series' fingerprint label: the fingerprint with the secret keys' values hidden."""
    return redact_text(fingerprint, secret_keys)


def classify(before_last: Any, first_at: Any, quiet: timedelta) -> str | None:
    """'new' (never seen before), 'regressed' (seen last more than `quiet` before this batch's
    first dead letter), or None (a group that keeps failing). `before_last`: the last time the
    group was seen before this cycle (None: never)."""
    if before_last is None:
        return "new"
    if before_last < first_at - quiet:
        return "regressed"
    return None


def observe(ctx: Context) -> list[dict[str, Any]]:
    """Remember the groups of the dead letters since the previous cycle; return what was saved."""
    opts = ctx.options
    if ctx.previous_at is None:
        return []  # the first cycle: what failed before the console watched is history, not news
    since = ctx.previous_at - OVERLAP
    batch = ctx.rows("error_groups", "recent_failures", {"since": since, "cap": RECENT_CAP, "groups": GROUPS_CAP})
    if not batch:
        return []
    known = {r["fingerprint"]: r for r in ctx.rows("error_groups", "remembered",
                                                  {"fingerprints": [b["fingerprint"] for b in batch]})}
    quiet = timedelta(seconds=opts.error_group_quiet)
    saved = []
    for b in batch:
        row = known.get(b["fingerprint"])
        if row is not None:
            first_seen, before_last = row["first_seen"], row["last_seen"]
        else:
            earlier = ctx.rows("error_groups", "earlier_dead_letters", {"fingerprint": b["fingerprint"],
                                                                        "before": b["first_at"]})[0]
            first_seen, before_last = earlier["first_seen"], earlier["last_seen"]
        change = classify(before_last, b["first_at"], quiet)
        record = {
            "fingerprint": b["fingerprint"], "first_seen": min(first_seen or b["first_at"], b["first_at"]),
            "last_seen": b["last_at"], "kinds": b["kinds"][:20], "queues": b["queues"][:20],
            "example": b["example"], "example_job": b["example_job"], "change": change,
            "change_at": b["first_at"] if change else None,
            "previous_seen": before_last if change == "regressed" else None,
        }
        ctx.rows("error_groups", "save", record)
        saved.append(record)
    return saved


def collect(ctx: Context) -> Iterable[Sample]:
    saved = observe(ctx)
    ctx.remember({})  # the cycle's time is the state: the next cycle reads from it
    changed = ctx.rows("error_groups", "changed", {"now": ctx.now, "new_for": ctx.options.error_group_new_for,
                                                   "count_cap": COUNT_CAP, "limit": CHANGED_CAP})
    ctx.detail("error_groups", {
        "seen": len(saved),
        "changed": [{"fingerprint": label(c["fingerprint"], ctx.options.secret_keys), "change": c["change"],
                     "change_at": c["change_at"].isoformat(), "dead_letters": c["dead_letters"]} for c in changed],
    })
    return [Sample("error_group_new", {"fingerprint": label(c["fingerprint"], ctx.options.secret_keys),
                                       "change": c["change"]}, float(c["dead_letters"]))
            for c in changed]
