"""The rules Skiplock ships enabled: the signals that say a PostgreSQL queue is in trouble.

Each has a runbook section in docs/alerts.md (anchor = the rule name): what it means, how to
confirm it, what to do. Override any of them by name in `[[alerts.rules]]` (or in the UI), for
example with a different threshold, or switch one off with `enabled = false`.

Thresholds are starting points for a typical queue, chosen to page on trouble a human must act
on rather than on load: tune them to your queue's service level.
"""

from __future__ import annotations

from console.alerts.model import parse_rule

RUNBOOK = "docs/alerts.md#{}"

_DEFAULTS = [
    # --- the queue -------------------------------------------------------------------------
    dict(name="queue_age", metric="queue_age_seconds", op=">", threshold=300, clear=60, for_="2m", severity="critical",
         summary="Oldest eligible job in queue {queue} has waited {value}s (over {threshold}s)"),
    dict(name="stuck_leases", metric="stuck_leases", op=">", threshold=0, for_="5m", severity="warning",
         summary="{value} running job(s) in queue {queue} hold an expired lease that the reaper has not rescued"),
    # Both are rates over [scheduler] rate_window (15 min by default), which already smooths
    # them: a `for` of 5 minutes on top, not the 10 a one-interval rate needed (and never met).
    dict(name="dead_letter_growth", metric="dead_letter_growth", op=">", threshold=50, for_="5m", severity="warning",
         summary="Queue {queue} gains {value} dead letters per hour"),
    # A failure mode nobody has seen (or not for [scheduler] error_group_quiet): worth a look
    # even at one dead letter. Raise the threshold to fire only above that many since it appeared;
    # ignore a group (dead-letters page, API, CLI) to never hear of it again.
    dict(name="new_error_group", metric="error_group_new", op=">", threshold=0, for_="0s", severity="warning",
         summary="{value} dead letter(s) of a {change} error group: {fingerprint}"),
    dict(name="retry_rate", metric="retry_rate", op=">", threshold=0.2, for_="5m", severity="warning",
         summary="{value} of finished attempts were retried (over {threshold})"),
    dict(name="claim_latency_p95", metric="claim_latency_seconds", labels={"quantile": "p95", "source": "workers"}, op=">",
         threshold=0.25, for_="10m", severity="warning",
         summary="Claim latency p95 reported by workers is {value}s (over {threshold}s)"),
    dict(name="workers_zero", metric="workers_live", op="<=", threshold=0, for_="2m", severity="critical",
         when={"metric": "queue_depth", "labels": {"state": "eligible"}, "op": ">", "threshold": 0},
         summary="No live workers while jobs are eligible"),
    dict(name="periodic_late", metric="periodic_late_ratio", op=">", threshold=2, clear=1, for_="0s", severity="warning",
         summary="Periodic job {name} has not succeeded for {value} of its intervals (over {threshold})"),
    # --- the jobs tables ---------------------------------------------------------------------
    dict(name="autovacuum_behind", metric="table_autovacuum_behind", op=">=", threshold=1, for_="15m",
         severity="warning", summary="Dead rows in {table} exceed its autovacuum threshold and no vacuum is running"),
    dict(name="vacuum_blocked", metric="xmin_horizon_age_seconds", labels={"holder": "any"}, op=">", threshold=600,
         clear=300, for_="5m", severity="warning",
         summary="The xmin horizon is {value}s old: vacuum cannot remove dead rows (the advisor names the holder)"),
    dict(name="jobs_lock_waits", metric="lock_waits", labels={"relation": "jobs"}, op=">", threshold=0,
         for_="2m", severity="warning", summary="{value} session(s) wait on a lock on {relation}"),
    dict(name="multixact_spike", metric="multixact_consumption_per_second", op=">", threshold=1000, for_="10m",
         severity="warning", summary="MultiXact IDs consumed at {value}/s (over {threshold}/s)"),
    dict(name="wraparound_age", metric="table_xid_age", op=">", threshold=1_000_000_000, for_="0s",
         severity="critical", summary="Transaction-ID age of {table} ({part}) is {value}: wraparound protection is near"),
    # --- the database ------------------------------------------------------------------------
    dict(name="replica_lag", metric="replica_lag_seconds", op=">", threshold=60, clear=30, for_="5m",
         severity="warning", summary="Standby {standby} replays {value}s behind"),
    dict(name="wal_rate", metric="wal_bytes_per_second", op=">", threshold=50 * 1024 * 1024, for_="15m",
         severity="warning", summary="WAL written at {value} bytes/s (over {threshold})"),
    # --- the console itself --------------------------------------------------------------------
    dict(name="collectors_stale", metric="collection_age_seconds", op=">", threshold=300, clear=120, for_="0s",
         severity="critical",
         summary="No collection cycle finished for {value}s: every other alert is blind until collectors run again"),
    dict(name="scheduler_restarts", metric="scheduler_restarts", op=">", threshold=0, for_="0s", severity="warning",
         summary="The scheduler restarted {value} times in 15 min: a scheduler process died without stopping"),
]


def _build():
    rules = []
    for spec in _DEFAULTS:
        spec = dict(spec)
        spec["for"] = spec.pop("for_")
        spec.setdefault("runbook", RUNBOOK.format(spec["name"]))
        rules.append(parse_rule(spec, source="default", where="(built-in default)"))
    return tuple(rules)


DEFAULT_RULES = _build()
DEFAULT_NAMES = tuple(r.name for r in DEFAULT_RULES)
