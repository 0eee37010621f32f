"""The canonical metric names: the same in samples, the UI, the JSON API, alert rules and
`/metrics` (which prefixes them with `skiplock_`).

Each entry says what the number is, its unit and its labels. A name not listed here cannot be
stored, charted or alerted on, so a typo in an alert rule is refused at load time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    help: str
    unit: str
    labels: tuple[str, ...] = ()
    kind: str = "gauge"  # every stored sample is a gauge; rates are computed by the collector


_METRICS = [
    # --- the queue --------------------------------------------------------------------
    Metric("queue_depth", "Jobs in the queue by state (eligible, scheduled, running, failed).", "jobs", ("queue", "state", "system", "external", "backend")),
    Metric("queue_age_seconds", "Age of the oldest eligible pending job (how long the head has waited).", "seconds", ("queue", "system", "external", "backend")),
    Metric("claim_latency_seconds", "Claim round-trip time: from workers' counters, pg_stat_statements, or a rolled-back probe claim (an external source: the mean of its claim statements in pg_stat_statements, system and external set).", "seconds", ("queue", "source", "quantile", "system", "external")),
    Metric("claim_buffers_per_call", "Shared buffers (hit + read) per claim call since the last sample (pg_stat_statements deltas); climbs with dead index entries.", "buffers", ("statement",)),
    Metric("claim_rows_per_call", "Rows returned per claim call since the last sample (pg_stat_statements deltas); flat while buffers per call climb = dead entries.", "rows", ("statement",)),
    Metric("claim_without_skip_locked_calls", "Calls (since pg_stat_statements was reset) of claim-like statements that wait on row locks: SELECT ... FOR [NO KEY] UPDATE ... LIMIT without SKIP LOCKED or NOWAIT, outside Skiplock's own tables; label statement = the queryid, or all.", "calls", ("statement",)),
    Metric("pickup_delay_seconds", "Time from a job becoming due to a worker claiming it.", "seconds", ("quantile",)),
    Metric("throughput", "Jobs finished per second by outcome (completed, failed, retried), from worker counters (an external source: per queue, from its library's completion log, system and external set).", "jobs/s", ("outcome", "queue", "system", "external")),
    Metric("queue_throughput", "Jobs of the queue finished per second by outcome (completed, failed, retried) since the last sample, from the workers' per-queue counters; a queue with any in the rate window is busy, not idle.", "jobs/s", ("queue", "outcome", "system")),
    Metric("failure_ratio", "Share of finished jobs that failed for good (went to the dead letters), over [scheduler] rate_window (default 15 min).", "ratio"),
    Metric("retry_rate", "Share of finished attempts that were retried, over [scheduler] rate_window (default 15 min).", "ratio"),
    Metric("stuck_leases", "Running jobs whose lease has expired and that the reaper has not yet rescued.", "jobs", ("queue", "system", "external", "backend")),
    Metric("stuck_lease_age_seconds", "How long ago the oldest stuck lease expired (0 when none).", "seconds", ("queue", "system", "external", "backend")),
    Metric("dead_letters", "Jobs in the failed state (the dead-letter set).", "jobs", ("queue", "system", "external", "backend")),
    Metric("dead_letter_growth", "Dead letters added per hour over [scheduler] rate_window (default 15 min): jobs that became failed within the window and still are.", "jobs/h", ("queue", "system", "external", "backend")),
    Metric("queue_redeliveries", "Jobs of a broker queue (backend=\"nats\") delivered more than once and not acknowledged yet: JetStream's num_redelivered of the queue's consumer (retries waiting out their delay, and jobs whose worker died or outlived the ack wait).", "jobs", ("queue", "system", "external", "backend")),
    Metric("error_group_new", "Dead letters of an error group that is new (change=new: its fingerprint was never seen before) or regressed (change=regressed: back after [scheduler] error_group_quiet without a dead letter), counted since that change and still dead letters; reported for [scheduler] error_group_new_for after it, never for an ignored group. fingerprint: the group's fingerprint, secret keys' values hidden.", "jobs", ("fingerprint", "change")),
    # --- a fair queue's groups (tenants; console/collectors/groups.py) -------------------------
    # Per (queue, group): the [scheduler] group_series groups of each fair queue that waited
    # longest (starving first), the rest folded into group="_other" (group_series_folded counts
    # them); the NULL group (jobs enqueued without a group) is group="_none".
    Metric("group_depth", "Jobs of a fair queue's group by state: eligible (pending and due, counted up to 10,000 a group) and running.", "jobs", ("queue", "group", "state")),
    Metric("group_age_seconds", "Age of the group's oldest eligible pending job (0 when none waits); for group=\"_other\" the oldest of the folded groups.", "seconds", ("queue", "group")),
    Metric("group_dead_letters", "Jobs of the group that went to the dead letters within [scheduler] rate_window (default 15 min), of the newest [scheduler] failed_queue_limit dead letters: what the queue page's Groups panel shows.", "jobs", ("queue", "group")),
    Metric("group_starving", "1 when the group is starving: its oldest eligible job has waited over 5 times the median waiting group's wait and at least 60 s, with none of its jobs running (the Groups panel's flag); for group=\"_other\" the number of folded groups that starve.", "groups", ("queue", "group")),
    Metric("queue_groups", "Groups of a fair queue with jobs waiting, running or gone to the dead letters within [scheduler] rate_window (a lower bound past 1,000 groups waiting).", "groups", ("queue",)),
    Metric("group_series_folded", "Groups of the queue the groups collector folded into group=\"_other\" this cycle ([scheduler] group_series and group_series_total; 0: every group has its own series).", "groups", ("queue",)),
    Metric("workers_live", "Worker processes seen within three flush intervals.", "workers"),
    Metric("workers_in_flight", "Jobs being worked right now, from worker registry rows.", "jobs"),
    Metric("queue_depth_estimated", "1 when the pending backlog exceeded the exact-count cap and pending depths were scaled to the planner's estimate (per external source: system and external set).", "bool", ("system", "external")),
    Metric("external_source_errors", "1 when an [[external_queues]] source could not be read in the last cycle (missing table, unknown schema, timeout); the error is on its panel.", "bool", ("system", "external")),
    Metric("completed_rows_estimate", "Completed rows still in the hot table (the archiver's backlog), from planner statistics.", "rows"),
    Metric("periodic_last_success_age_seconds", "Seconds since the periodic job's newest run that completed (absent before its first success).", "seconds", ("name",)),
    Metric("periodic_interval_seconds", "Longest gap between two slots of the periodic schedule.", "seconds", ("name",)),
    Metric("periodic_late_ratio", "Age of the periodic job's last success (or of the schedule, before one) over its interval; 0 while paused.", "ratio", ("name",)),
    Metric("periodic_missed_total", "Slots of the periodic schedule skipped: while paused, or after downtime with catch_up = false.", "slots", ("name",)),
    Metric("periodic_paused", "1 while the periodic schedule is paused.", "bool", ("name",)),
    # --- the jobs tables ----------------------------------------------------------------
    Metric("table_live_tuples", "Live rows (statistics).", "rows", ("table", "system")),
    Metric("table_dead_tuples", "Dead rows waiting for vacuum (statistics).", "rows", ("table", "system")),
    Metric("table_dead_ratio", "Dead rows / (live + dead).", "ratio", ("table", "system")),
    Metric("table_size_bytes", "On-disk size by part (heap, indexes, toast).", "bytes", ("table", "part", "system")),
    Metric("table_autovacuum_threshold", "Dead rows at which autovacuum starts, from the table's reloptions and the server settings.", "rows", ("table", "system")),
    Metric("table_autovacuum_behind", "1 when dead rows exceed the autovacuum threshold and no vacuum is running.", "bool", ("table", "system")),
    Metric("table_last_autovacuum_age_seconds", "Seconds since the last (auto)vacuum finished on the table.", "seconds", ("table", "system")),
    Metric("table_last_autoanalyze_age_seconds", "Seconds since the last (auto)analyze finished on the table.", "seconds", ("table", "system")),
    Metric("table_vacuum_count", "Vacuum and autovacuum runs so far.", "runs", ("table", "kind", "system")),
    Metric("vacuum_in_progress", "1 while a vacuum runs on the table.", "bool", ("table", "system")),
    Metric("vacuum_heap_scanned_ratio", "Share of the heap the running vacuum has scanned.", "ratio", ("table", "system")),
    Metric("vacuum_index_passes", "Index vacuum passes of the running vacuum.", "passes", ("table", "system")),
    Metric("vacuum_removed_nothing", "1 when the last vacuum ran but dead rows did not fall: a horizon is blocking it.", "bool", ("table", "system")),
    Metric("table_xid_age", "Transaction-ID age of the table (and its TOAST) against wraparound.", "xids", ("table", "part", "system")),
    Metric("table_mxid_age", "MultiXact-ID age of the table against wraparound.", "mxids", ("table", "system")),
    # --- the database ---------------------------------------------------------------------
    Metric("xmin_horizon_age_seconds", "Age of the oldest holder of the xmin horizon by kind (transaction, idle_in_transaction, replication_slot, prepared_transaction, standby; 'any' = the oldest of all). Who it is: the cycle's details.", "seconds", ("holder",)),
    Metric("xmin_horizon_age_xids", "Transactions between the horizon and now.", "xids", ("holder",)),
    Metric("idle_in_transaction_sessions", "Sessions idle inside an open transaction, server-wide (excluding the console).", "sessions"),
    Metric("lock_waits", "Sessions waiting on a heavyweight lock, by relation (jobs tables singled out; 'other' = no relation, 'all' = total).", "sessions", ("relation",)),
    Metric("lock_wait_max_seconds", "Longest current heavyweight-lock wait.", "seconds"),
    Metric("lwlock_waits", "Sessions waiting on an LWLock, by wait event (MultiXact/SLRU singled out).", "sessions", ("event",)),
    Metric("slru_blocks_read_per_second", "SLRU blocks read per second, by SLRU (pg_stat_slru deltas).", "blocks/s", ("slru",)),
    Metric("slru_blocks_hit_per_second", "SLRU blocks found in the SLRU cache per second, by SLRU (pg_stat_slru deltas).", "blocks/s", ("slru",)),
    Metric("slru_blocks_zeroed_per_second", "SLRU pages created per second, by SLRU (pg_stat_slru deltas).", "blocks/s", ("slru",)),
    Metric("multixact_consumption_per_second", "MultiXact IDs consumed per second.", "mxids/s"),
    Metric("multixact_members_per_second", "MultiXact members created per second, estimated from new member SLRU pages (about 1636 per page).", "members/s"),
    Metric("xid_consumption_per_second", "Transaction IDs consumed per second.", "xids/s"),
    Metric("database_xid_age", "Transaction-ID age of this database (age(datfrozenxid)) against wraparound.", "xids"),
    Metric("database_mxid_age", "MultiXact-ID age of this database (mxid_age(datminmxid)).", "mxids"),
    Metric("wal_bytes_per_second", "WAL written per second.", "bytes/s"),
    Metric("replica_lag_seconds", "Replay lag of each standby as the primary measures it (pg_stat_replication.replay_lag; grows while replay is paused or stuck, 0 once caught up). standby = its application_name, client = its address; on a standby itself one series standby=self, client=local: time since the last replayed transaction while WAL waits to be replayed.", "seconds", ("standby", "client")),
    Metric("replica_lag_bytes", "Bytes of WAL each standby has not replayed yet (the primary's current position minus the standby's replay position).", "bytes", ("standby", "client")),
    Metric("server_timeline", "The primary's WAL timeline: a promotion (failover) starts a new one; the collector's details say when it changed.", "timeline"),
    Metric("connections", "Client backends by state, server-wide, excluding the console's own ('all' = total).", "connections", ("state",)),
    Metric("max_connections", "The server's max_connections.", "connections"),
    Metric("notify_queue_usage", "Fraction of the NOTIFY queue in use.", "ratio"),
    # --- the console itself ---------------------------------------------------------------
    Metric("collector_duration_seconds", "Time each collector took in the last cycle.", "seconds", ("collector",)),
    Metric("collection_duration_seconds", "Time the whole collection cycle took.", "seconds"),
    Metric("collector_errors", "1 when the collector failed or timed out in the last cycle.", "bool", ("collector",)),
    Metric("scheduler_restarts", "Scheduler processes that started in the last 15 minutes in place of one on the same host that died without stopping (a crash, SIGKILL, the OOM killer); a second standby or a clean restart is not one.", "restarts"),
    Metric("collection_age_seconds", "Seconds since the newest stored collection cycle (computed when /metrics is scraped; grows when the scheduler is down).", "seconds"),
]

METRICS: dict[str, Metric] = {m.name: m for m in _METRICS}


class UnknownMetric(ValueError):
    pass


def check_metric(name: str) -> Metric:
    try:
        return METRICS[name]
    except KeyError:
        raise UnknownMetric(f"unknown metric {name!r}; known metrics: {', '.join(sorted(METRICS))}") from None
