"""Configuration: every setting declared as data, read from a TOML file and the environment.

Sources, lowest to highest precedence: the defaults below, the TOML file named by `--config`
or `SKIPLOCK_CONFIG`, then environment variables `SKIPLOCK_<SECTION>_<KEY>`. A value that does
not parse or is out of range stops start-up with a `ConfigError` naming the setting; an unknown
key in the file is refused too, because a typo silently ignored is a setting never applied.

Tables that are lists of records (`[[webhooks]]`, `[[alerts.rules]]`, `[[periodic]]`) are not settings: they
are kept as parsed in `Config.tables` for the module that owns them to validate. The names
allowed are declared once, in `RECORD_TABLES`; any other list of records (`[[bogus]]`) is
refused like an unknown key.

This module does not connect to anything and holds no global state; `load_config()` returns a
fresh `Config` each time.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from console.jsonbounds import MAX_DEPTH, TooDeep


class ConfigError(ValueError):
    """A setting has a bad value; the message names the setting and where it came from."""


@dataclass(frozen=True)
class Setting:
    section: str
    key: str
    type: type
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None  # returns a complaint, or None when fine
    secret: bool = False

    @property
    def env_var(self) -> str:
        return f"SKIPLOCK_{self.section}_{self.key}".upper()

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}"


def positive(value: Any) -> str | None:
    return None if value > 0 else "must be greater than 0"


def short_text(value: Any) -> str | None:
    return None if len(value) <= 200 else "must be at most 200 characters"


def non_negative(value: Any) -> str | None:
    return None if value >= 0 else "must be 0 or more"


def one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}"

    return check


def in_range(low: int, high: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else f"must be from {low} to {high}"

    return check


def positive_duration(value: timedelta) -> str | None:
    return None if value > timedelta(0) else "must be longer than 0"


_NATS_URL = re.compile(r"(nats|tls)://[^\s,/]+(:\d{1,5})?/?")


def nats_urls(value: str) -> str | None:
    """One or more NATS server addresses, comma-separated: nats://host:port or tls://host:port."""
    parts = [p.strip() for p in value.split(",")]
    if not all(parts) or not all(_NATS_URL.fullmatch(p) for p in parts):
        return "must be nats://host:port or tls://host:port addresses, comma-separated"
    return None


_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(raw: Any) -> timedelta:
    """A duration setting: '90s', '15m', '1h', '7d' (a bare number is seconds)."""
    if isinstance(raw, timedelta):
        return raw
    if isinstance(raw, bool):
        raise ValueError(raw)
    if isinstance(raw, int | float):
        seconds = float(raw)
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*", str(raw))
        if not match:
            raise ValueError(raw)
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    if seconds < 0:
        raise ValueError(raw)
    return timedelta(seconds=seconds)


SETTINGS: tuple[Setting, ...] = (
    # [database]
    Setting("database", "dsn", str, "", "PostgreSQL connection string; `--dsn` and DATABASE_URL override it.", secret=True),
    Setting("database", "pool_size", int, 4, "Connections the web console and scheduler keep open.", positive),
    Setting("database", "statement_timeout_ms", int, 2000, "Time limit for every console and collector query.", positive),
    # [queue]
    Setting("queue", "max_attempts", int, 5, "Attempts a job gets when enqueue() does not say.", positive),
    Setting("queue", "backoff_base", float, 2.0, "Seconds before the first retry; doubles each attempt.", positive),
    Setting("queue", "backoff_cap", float, 3600.0, "Longest wait between two attempts, in seconds.", positive),
    Setting("queue", "error_history", int, 20, "Error entries kept on a job (oldest dropped first).", positive),
    # [worker]
    Setting("worker", "concurrency", int, 4, "Handler threads per worker process.", positive),
    Setting("worker", "async_concurrency", int, 100, "Most jobs of `async def` handlers one worker process awaits at once, on its event loop beside the handler threads (only when the tasks module registers async handlers).", positive),
    Setting("worker", "batch_size", int, 10, "Most jobs claimed in one statement.", positive),
    Setting("worker", "claim_max", int, 100, "Most jobs one claim takes while every job the worker claims is fast (under 1 ms) and each claim comes back full: the claim doubles from batch_size up to this, and goes back to batch_size after a short claim or a job that is not fast. Fewer, larger statements cut the server's work per job; at or under batch_size (0 too) every claim takes at most batch_size.", non_negative),
    Setting("worker", "lease", float, 60.0, "Seconds a claim is held before the reaper may rescue it; heartbeats extend it.", positive),
    Setting("worker", "poll_interval", float, 1.0, "Seconds between polls when no NOTIFY arrives.", positive),
    Setting("worker", "shutdown_grace", float, 30.0, "Seconds SIGTERM waits for in-flight jobs before releasing them.", non_negative),
    Setting("worker", "flush_interval", float, 5.0, "Seconds between writes of the worker's counters to its registry row.", positive),
    Setting("worker", "registry_grace", duration, timedelta(hours=1), "How long a worker's registry row is kept after it stopped or last sent a heartbeat (a killed worker never says it stopped), e.g. 1h; the scheduler's retention job deletes older rows in bounded batches.", positive_duration),
    Setting("worker", "log_records", int, 100, "Most log records kept per attempt of a job (the `logging` records its handler emits, shown on the job page); past it the first and the last records are kept and the ones between counted as dropped. 0 captures nothing.", non_negative),
    Setting("worker", "log_message_chars", int, 2000, "Characters kept of one captured log message (and of its traceback); the rest is cut, saying how much.", positive),
    Setting("worker", "log_attempt_chars", int, 20000, "Characters of captured log records kept per attempt, all records together; records past it are dropped and counted.", positive),
    Setting("worker", "release", str, "", "The application's release this worker runs (a git sha, a build tag), written to its registry row with Skiplock's version: the Workers page shows it and the incident timeline shows a change as a deploy. Set it in the deploy's environment ($SKIPLOCK_WORKER_RELEASE); empty: not reported.", short_text),
    Setting("worker", "claim_resume_ms", float, 15.0, "A full claim from the head of the queue that takes this many milliseconds or more, plus 1 % for every job it asked for (it walks entries vacuum could not remove: a horizon holder) makes the worker claim on after its last claim, from the head again every second or more; 0 always claims from the head (docs/queue.md, \"Horizon holders\").", non_negative),
    Setting("worker", "complete_into_archive", bool, False, "Move each job this worker completes into skiplock.jobs_archive in the completing statement, instead of leaving it in the hot table until the archiver moves it (maintenance.archive_after): the hot table then holds only pending, running and failed jobs, so a sustained high rate does not grow it. An idempotency key alone stops answering once its job completed (docs/queue.md, \"Completing into the archive\")."),
    Setting("worker", "vacuum_interval", float, 10.0, "Seconds between the workers' own VACUUMs of skiplock.jobs (one worker at a time, only while jobs are claimed); 0 leaves it to autovacuum.", non_negative),
    # [broker] (docs/exit-plan.md: queues served by NATS JetStream, the outbox relay)
    Setting("broker", "nats_url", str, "nats://127.0.0.1:4222", "The NATS server(s) the relay publishes to and `skiplock worker --backend nats` consumes from: nats:// or tls:// addresses, comma-separated for a cluster (it may carry credentials: shown masked).", nats_urls, secret=True),
    Setting("broker", "duplicate_window", duration, timedelta(minutes=2), "JetStream's de-duplication window of the streams the relay creates, e.g. 2m: a job published again within it (a relay killed between the broker's ack and marking the row sent) is stored once. Longer than the longest relay outage you expect to recover from.", positive_duration),
    Setting("broker", "replicas", int, 1, "Replicas of each stream the relay creates for a broker queue (its jobs and its dead letters), 1 to 5: 3 on a three-node JetStream cluster keeps every stored job through the loss of one node. A stream that already exists keeps its replica count (the relay and the worker log a warning when it differs).", in_range(1, 5)),
    Setting("broker", "relay_batch_size", int, 100, "Most outbox rows the relay reads, publishes and marks sent per round.", positive),
    Setting("broker", "relay_poll_interval", float, 1.0, "Seconds between the relay's looks at the outbox when no NOTIFY rings (and between a standby relay's tries to lead).", positive),
    Setting("broker", "publish_timeout", float, 5.0, "Seconds the relay waits for the broker's ack of one publish; a row not acknowledged stays unsent and is published again.", positive),
    Setting("broker", "outbox_keep", duration, timedelta(hours=1), "How long sent outbox rows are kept (an idempotency key holds while its row is kept), e.g. 1h; the relay deletes older ones in bounded batches.", positive_duration),
    # [scheduler]
    Setting("scheduler", "collect_interval", float, 15.0, "Seconds between collection cycles (queue and PostgreSQL health samples).", positive),
    Setting("scheduler", "reap_interval", float, 30.0, "Seconds between reaper runs (expired leases back to pending or failed).", positive),
    Setting("scheduler", "reap_batch_size", int, 1000, "Most jobs the reaper rescues in one transaction.", positive),
    Setting("scheduler", "archive_interval", float, 300.0, "Seconds between archiver runs (completed jobs out of the hot table).", positive),
    Setting("scheduler", "rate_window", duration, timedelta(minutes=15), "Window the rates and \"idle\" are computed over (dead letters per hour, retry rate, per-queue throughput for idle), e.g. 15m: never one collection interval, so one dead letter does not read as 360 per hour.", positive_duration),
    Setting("scheduler", "error_group_quiet", duration, timedelta(hours=24), "An error group that fails again after this long without a dead letter counts as regressed (the new_error_group alert fires for it), e.g. 24h.", positive_duration),
    Setting("scheduler", "error_group_new_for", duration, timedelta(hours=1), "How long a new or regressed error group is reported as such (the error_group_new series), e.g. 1h; its alert resolves after it.", positive_duration),
    Setting("scheduler", "retention_interval", float, 300.0, "Seconds between sample retention and rollup runs.", positive),
    Setting("scheduler", "election_interval", float, 5.0, "Seconds between leader elections: a standby takes over within this long after the leader dies.", positive),
    Setting("scheduler", "misfire_grace", float, 30.0, "Seconds a scheduler job may start late (e.g. after a pause) before that run is skipped; a periodic schedule's slot at most this old is enqueued late, not counted missed.", positive),
    Setting("scheduler", "retention_raw_hours", float, 48.0, "Hours raw samples are kept.", positive),
    Setting("scheduler", "retention_minute_days", float, 14.0, "Days per-minute rollups are kept.", positive),
    Setting("scheduler", "retention_hour_days", float, 400.0, "Days per-hour rollups (and collection run rows) are kept.", positive),
    Setting("scheduler", "retention_batch_size", int, 5000, "Most rows one retention statement deletes.", positive),
    Setting("scheduler", "lock_timeout_ms", int, 200, "lock_timeout of collector queries (size functions wait on locks).", positive),
    Setting("scheduler", "depth_exact_limit", int, 10000, "Pending/running entries counted exactly per cycle; a larger backlog is scaled to the planner's estimate.", positive),
    Setting("scheduler", "failed_queue_limit", int, 5000, "Newest dead letters read for the per-queue split (a heap fetch each); beyond it shares are scaled to the total.", positive),
    Setting("scheduler", "failed_total_limit", int, 50000, "Dead letters counted exactly per cycle; beyond it the total is the planner's estimate.", positive),
    Setting("scheduler", "group_series", int, 10, "Groups (tenants) of each fair queue that get their own group_* series per collection cycle, the longest-waiting first (starving groups first, then the oldest eligible job, the backlog, the dead letters); the others are folded into group=\"_other\" (counts summed, the age the oldest) and counted by group_series_folded.", positive),
    Setting("scheduler", "group_series_total", int, 200, "Groups with their own group_* series over all fair queues together per cycle (the queues whose worst group waits longest are served first); past it a queue's groups are all folded into group=\"_other\".", positive),
    Setting("scheduler", "probe_queues", int, 1, "Queues probed one by one with a rolled-back claim each cycle (plus one probe over all queues).", non_negative),
    Setting("scheduler", "periodic_interval", float, 5.0, "Longest wait between two passes of the periodic (cron) job, which settle finished runs and read pauses; a pass also wakes at each schedule's next slot, so slots start on time whatever this is.", positive),
    Setting("scheduler", "periodic_catch_up_limit", int, 100, "Most missed slots one periodic entry with catch_up = true enqueues after downtime (the newest are kept).", positive),
    Setting("scheduler", "periodic_keep_days", float, 30.0, "Days finished periodic runs (one row per slot) are kept.", positive),
    Setting("scheduler", "tasks", str, "", "Task module(s), comma-separated (e.g. myapp.tasks), whose @console.schedule periodic jobs the scheduler runs; empty = only [[periodic]] from the config file."),
    # [alerts] (rules and webhooks themselves are [[alerts.rules]] and [[webhooks]] tables)
    Setting("alerts", "evaluate", bool, True, "Evaluate alert rules after every collection cycle (the scheduler leader does).",),
    Setting("alerts", "series_window", float, 300.0, "Seconds a sample stays current for alert rules; older collections count as stale and hold every alert.", positive),
    Setting("alerts", "hysteresis", float, 0.1, "How far past the threshold (as a fraction of it) a firing alert must come back to resolve, when the rule gives no `clear` value.", non_negative),
    Setting("alerts", "repeat_interval", float, 14400.0, "Seconds between repeat notifications of an unacknowledged firing alert.", positive),
    Setting("alerts", "delivery_interval", float, 10.0, "Seconds between runs of the scheduler's webhook delivery job.", positive),
    Setting("alerts", "delivery_timeout", float, 10.0, "Time limit in seconds for one whole webhook delivery: connecting, sending and reading the answer together.", positive),
    Setting("alerts", "allow_private_destinations", bool, False, "Allow webhook destinations on loopback, link-local, private (RFC 1918, IPv6 ULA), CGNAT, multicast and cloud-metadata addresses; off, such a destination is refused when saved and when sent to (after resolving its name)."),
    Setting("alerts", "delivery_batch", int, 100, "Most notifications one delivery run attempts.", positive),
    Setting("alerts", "retry_base", float, 10.0, "Seconds before the first retry of a failed delivery; doubles each attempt.", positive),
    Setting("alerts", "retry_cap", float, 600.0, "Longest wait between two delivery attempts, in seconds.", positive),
    Setting("alerts", "give_up_after", float, 86400.0, "Seconds after which a notification that still fails is given up (marked gave_up in the delivery log).", positive),
    Setting("alerts", "console_url", str, "", "Public URL of the web console, for links in notifications (empty: no link)."),
    Setting("alerts", "runbook_base_url", str, "", "Base URL that relative runbook paths (docs/alerts.md#...) are joined to, on the console's pages and in notifications (empty: the console serves docs/ itself at /docs/)."),
    Setting("alerts", "events_retention", duration, timedelta(days=30), "How long alert history (skiplock.alert_events) is kept, e.g. 30d; older events of resolved alerts are deleted in bounded batches by the delivery job.", positive_duration),
    Setting("alerts", "keep_days", float, 30.0, "Days the delivery log and settled notifications are kept (pruned in batches by the delivery job).", positive),
    # [maintenance]
    Setting("maintenance", "archive_after", duration, timedelta(hours=1), "Completed jobs older than this leave the hot table (e.g. 1h, 7d)."),
    Setting("maintenance", "archive_mode", str, "archive", "What archival does with them: `archive` (move to skiplock.jobs_archive) or `delete`.", one_of("archive", "delete")),
    Setting("maintenance", "archive_retention", duration, timedelta(days=30), "Archived jobs older than this are removed (whole day partitions are dropped).", positive_duration),
    Setting("maintenance", "partitions_ahead", int, 7, "Days of archive partitions created ahead of time.", positive),
    Setting("maintenance", "batch_size", int, 1000, "Most rows one maintenance transaction touches (archive, retention, reap, replay, purge).", positive),
    Setting("maintenance", "rate", float, 0.0, "Most rows per second archival and retention move; 0 = no cap beyond the pause.", non_negative),
    Setting("maintenance", "pause_ms", float, 10.0, "Least pause between two maintenance batches, in milliseconds, so vacuum and workers keep up.", non_negative),
    Setting("maintenance", "bulk_rate", float, 0.0, "Most rows per second a replay or purge touches when the operator does not say; 0 = no cap.", non_negative),
    Setting("maintenance", "statement_timeout_ms", int, 10000, "Time limit for one maintenance batch statement.", positive),
    # [caps] what one signed-in user or token can make the console hold (docs/security.md, "Caps")
    Setting("caps", "bulk_running", int, 4, "Bulk replays and purges queued or running at once in one database, whoever started them; one more is refused (429, CLI exit 2).", positive),
    Setting("caps", "bulk_per_actor", int, 2, "Bulk replays and purges queued or running at once in one database for one operator (or token owner); one more is refused.", positive),
    Setting("caps", "sessions_per_user", int, 10, "Sign-ins one user holds at once; signing in once more ends that user's oldest session.", positive),
    Setting("caps", "tokens_per_user", int, 10, "Live (not revoked, not expired) API tokens of one user; creating one more is refused.", positive),
    Setting("caps", "silences", int, 100, "Active (not yet expired) silences in one database; one more is refused.", positive),
    Setting("caps", "alert_rules", int, 200, "Alert rules saved from the console (UI, API) in one database; one more is refused.", positive),
    Setting("caps", "destinations", int, 50, "Webhook destinations saved from the console (UI, API) in one database; one more is refused.", positive),
    Setting("caps", "enqueue_per_minute", int, 60, "Jobs one operator enqueues from the console (form, API, a periodic entry's run now) in one database within a minute; one more is refused.", positive),
    Setting("caps", "paused_queues", int, 500, "Queues paused at once in one database; pausing one more is refused.", positive),
    Setting("caps", "exports_per_user", int, 2, "CSV/JSON exports one user streams at once from one web process; one more is refused.", positive),
    Setting("caps", "tests_per_user", int, 1, "Webhook test sends one user runs at once from one web process; one more is refused.", positive),
    # [web]
    Setting("web", "production", bool, True, "Production mode (the default; `skiplock serve` turns it off): refuse to start without web.secret_key, Secure cookies, HSTS over HTTPS, /metrics needs web.metrics_token unless web.metrics_public."),
    Setting("web", "secret_key", str, "", "Signs session cookies; required in production (the development server generates one per process).", secret=True),
    Setting("web", "host", str, "127.0.0.1", "Address `skiplock serve` listens on."),
    Setting("web", "port", int, 8000, "Port `skiplock serve` listens on.", positive),
    Setting("web", "trusted_header", str, "", "Request header set by a trusted SSO proxy with the user name (e.g. X-Forwarded-User); empty = off. Only enable behind a proxy that strips it from clients."),
    Setting("web", "proxy_count", int, 0, "Reverse proxies in front of the console whose X-Forwarded-For/-Proto to trust (0 = none).", non_negative),
    Setting("web", "metrics_token", str, "", "Bearer token /metrics requires; empty = none (then production mode answers 401 unless metrics_public).", secret=True),
    Setting("web", "metrics_queue_series", int, 200, "Queues of each database that keep their own series in /metrics, the worst first (stuck leases, longest wait, dead letters, depth); the others are folded into queue=\"_other\" (counts summed, ages the maximum) and counted by skiplock_metrics_series_dropped.", positive),
    Setting("web", "metrics_group_series", int, 10, "Groups (tenants) of each fair queue that keep their own group_* series in /metrics, the longest-waiting first (as [scheduler] group_series ranks them); the others are folded into group=\"_other\" and counted by skiplock_metrics_groups_folded and skiplock_metrics_series_dropped.", positive),
    Setting("web", "metrics_public", bool, False, "Serve /metrics without a token even in production mode (only where the network already keeps strangers out)."),
    Setting("web", "login_window", int, 900, "Seconds of one address's sign-in window, and the quiet time after which a (user, address) pair starts over.", positive),
    Setting("web", "login_max_per_ip", int, 20, "Failed sign-in attempts from one address (an IPv6 /64) within login_window, across user names, before it is refused; right passwords do not count.", positive),
    Setting("web", "login_free_failures", int, 5, "Failed sign-ins of one (user name, address) before each further attempt waits 2, 4, 8 ... seconds.", positive),
    Setting("web", "login_backoff_cap", float, 300.0, "Longest wait, in seconds, between two sign-in attempts of one (user name, address).", positive),
    Setting("web", "session_idle", duration, timedelta(hours=12), "A sign-in ends after this long without a request (background polls do not count), e.g. 12h.", positive_duration),
    Setting("web", "session_max", duration, timedelta(days=7), "A sign-in ends this long after it began, however busy, e.g. 7d.", positive_duration),
    Setting("web", "redact_keys", str, "password,passwd,secret,token,api_key,apikey,authorization,card_number,ssn", "Payload keys (comma-separated, any depth, case-insensitive) shown as [redacted] to viewers, with their values in error text; error fingerprints, alert links and webhook bodies hide them (and the default keys) for everyone."),
    Setting("web", "redact_hook", str, "", "Optional `module:function` taking (payload, user) and returning the payload to show; runs after redact_keys."),
    Setting("web", "redact_text_hook", str, "", "Optional `module:function` taking (text, user) and returning the error text to show (last errors, error history, error groups, operation errors); runs after the values of redact_keys are masked in it for viewers."),
    Setting("web", "poll_fast", float, 5.0, "Seconds between live refreshes while the tab is visible.", positive),
    Setting("web", "poll_slow", float, 60.0, "No longer used: a hidden tab stops polling and refreshes at once when shown again (kept so older config files still load).", positive),
    Setting("web", "read_only", bool, False, "Read-only console: every action is hidden and every state change (POST/PUT/PATCH/DELETE, API included, sign-in and sign-out excepted) is refused with 403; a banner says so."),
    Setting("web", "list_limit", int, 100, "Rows a page shows of a list a producer can make as long as it likes (queues, active alerts, error groups), worst first; the rest are counted (\"N more\") and reached by search and paging. The overview shows the 20 worst.", positive),
    Setting("web", "page_size", int, 50, "Rows per page in the jobs browser and audit log.", positive),
    Setting("web", "scan_window", int, 50000, "Jobs the browser looks at per page when a filter has no index (queue, kind, payload, error group); 'search further' continues.", positive),
    Setting("web", "count_cap", int, 10000, "Counts above this are shown as 'N+' (a count never scans more than this).", positive),
    Setting("web", "export_limit", int, 100000, "Most rows one CSV/JSON export returns.", positive),
    Setting("web", "db_wait", float, 2.0, "Seconds a page waits for a database connection before saying the database is unreachable.", positive),
    Setting("web", "fleet_seconds", float, 10.0, "Seconds the fleet page (/databases, /api/v1/databases) reuses its read of every database in each web process: one read per this many seconds however many people look, each row saying how old it is (never older than twice this); 0 reads every database on every request.", non_negative),
    Setting("web", "stale_worker_after", float, 30.0, "Seconds without a heartbeat after which a worker is stale: no longer counted in workers_live (the workers_zero alert) nor as live on the Workers page; at least three worker.flush_interval.", positive),
    # [advisor] thresholds of `skiplock check` and the advisor page (docs/advisor.md explains each)
    Setting("advisor", "idle_in_transaction_warn", duration, timedelta(seconds=10), "How long a session touching the jobs tables may sit idle in a transaction before the advisor warns.", positive_duration),
    Setting("advisor", "idle_in_transaction_fail", duration, timedelta(minutes=1), "Time idle in a transaction on the jobs tables that the advisor calls a failure.", positive_duration),
    Setting("advisor", "transaction_age_warn", duration, timedelta(minutes=1), "Age of a transaction touching the jobs tables that the advisor warns about.", positive_duration),
    Setting("advisor", "transaction_age_fail", duration, timedelta(minutes=5), "Age of a transaction touching the jobs tables that the advisor calls a failure.", positive_duration),
    Setting("advisor", "xmin_horizon_warn", duration, timedelta(minutes=5), "How long the xmin horizon may stand still before the advisor warns that vacuum is blocked.", positive_duration),
    Setting("advisor", "xmin_horizon_fail", duration, timedelta(minutes=30), "Age of a blocked xmin horizon that the advisor calls a failure.", positive_duration),
    Setting("advisor", "lock_wait_fail", duration, timedelta(seconds=5), "How long a session may wait on a jobs-table row lock before the advisor calls it a failure.", positive_duration),
    Setting("advisor", "stuck_lease_grace", duration, timedelta(minutes=2), "How long past its lease a running job may stay before the advisor says the reaper is not rescuing it.", positive_duration),
    Setting("advisor", "max_attempts_warn", int, 25, "A job allowed more attempts than this has no real retry cap (warn).", positive),
    Setting("advisor", "max_attempts_fail", int, 100, "A job allowed more attempts than this is a failure of the retry policy.", positive),
    Setting("advisor", "hot_loop_gap", duration, timedelta(seconds=1), "Two attempts of a job closer than this count as a hot retry loop.", positive_duration),
    Setting("advisor", "dead_letter_age_warn", duration, timedelta(days=7), "Age of the oldest dead letter before the advisor calls the set a graveyard.", positive_duration),
    Setting("advisor", "archive_slack", duration, timedelta(minutes=15), "How long past maintenance.archive_after a completed job may stay in the hot table before the advisor counts it as late."),
    Setting("advisor", "completed_rows_warn", int, 10000, "Old completed rows in the hot table (estimated) before the advisor warns.", positive),
    Setting("advisor", "sample_pages", int, 1000, "Most pages of the jobs table the advisor samples to estimate old completed rows.", positive),
    Setting("advisor", "claim_min_calls", int, 100, "Claim calls needed before a buffers-per-claim figure counts.", positive),
    Setting("advisor", "claim_baseline_min", int, 5, "Measurements of buffers per claim (each of claims that claimed rows) the baseline needs before claim-buffers may fail.", positive),
)

_BY_KEY = {(s.section, s.key): s for s in SETTINGS}

# Settings that existed once: naming one stops start-up with what replaces it, never silently.
RETIRED: dict[tuple[str, str], str] = {
    ("web", "session_hours"): "was replaced by web.session_idle (default 12h: ends a sign-in after that long "
                              "without a request) and web.session_max (default 7d: ends it that long after it began)",
    ("web", "login_max_per_user"): "was removed: one user name is no longer locked for everyone; sign-in is throttled "
                                   "per (user name, address) by web.login_free_failures and web.login_backoff_cap, "
                                   "and per address by web.login_max_per_ip",
}


def _retired(section: str, key: str, where: str) -> ConfigError:
    return ConfigError(f"{section}.{key} ({where}) {RETIRED[(section, key)]}")


# Lists of records (`[[name]]` in the file) kept in Config.tables, each validated by its owner:
# name -> owner. A new one (e.g. `periodic`, `databases`, `external_queues`) is one line here.
RECORD_TABLES: dict[str, str] = {
    "databases": "console.databases (the databases one console watches)",
    "webhooks": "console.alerts.rules (webhook destinations)",
    "alerts.rules": "console.alerts.rules (alert rules)",
    "periodic": "console.queue.periodic (periodic jobs)",
    "external_queues": "console.config.external_queues (queues Skiplock did not create; console.external reads them)",
}


def _coerce(setting: Setting, raw: Any, origin: str) -> Any:
    where = f"{setting.dotted} ({origin})"
    try:
        if setting.type is bool:
            if isinstance(raw, bool):
                value = raw
            elif isinstance(raw, str) and raw.lower() in {"1", "true", "yes", "on"}:
                value = True
            elif isinstance(raw, str) and raw.lower() in {"0", "false", "no", "off"}:
                value = False
            else:
                raise ValueError
        elif setting.type is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            value = int(raw)
        elif setting.type is float:
            if isinstance(raw, bool):
                raise ValueError
            value = float(raw)
        elif setting.type is str:
            if not isinstance(raw, str):
                raise ValueError
            value = raw
        else:
            value = setting.type(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {raw!r} is not a valid {setting.type.__name__}") from None
    if setting.check is not None:
        complaint = setting.check(value)
        if complaint:
            raise ConfigError(f"{where}: {raw!r} {complaint}")
    return value


class Config:
    """Validated settings: `config.worker.lease`, `config.get("worker", "lease")`."""

    def __init__(self, values: dict[tuple[str, str], Any], tables: dict[str, Any], path: Path | None):
        self._values = values
        self.tables = tables
        self.path = path
        sections: dict[str, dict[str, Any]] = {}
        for (section, key), value in values.items():
            sections.setdefault(section, {})[key] = value
        for section, keys in sections.items():
            setattr(self, section, SimpleNamespace(**keys))

    def get(self, section: str, key: str) -> Any:
        return self._values[(section, key)]

    def as_dict(self, *, redact: bool = True) -> dict[str, dict[str, Any]]:
        """Current settings by section, secrets masked: what the maintenance page shows."""
        out: dict[str, dict[str, Any]] = {}
        for setting in SETTINGS:
            value = self._values[(setting.section, setting.key)]
            if redact and setting.secret and value:
                value = "********"
            out.setdefault(setting.section, {})[setting.key] = value
        return out


# A TOML string (basic, literal, multi-line) or comment, skipped whole, or one bracket or brace.
_TOML_TOKENS = re.compile(r'''"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|'[^'\n]*'|#[^\n]*|[\[\]{}]''', re.S)


def _bounded_toml(text: str) -> dict[str, Any]:
    """tomllib.loads, after checking that arrays and inline tables nest at most
    console.jsonbounds.MAX_DEPTH levels: tomllib recurses per level, and a RecursionError
    would stop start-up with a traceback instead of a message. Table headers ([a], [[b]])
    open and close on their line, so they count for nothing."""
    depth = 0
    for match in _TOML_TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > MAX_DEPTH:
                raise TooDeep(f"arrays and inline tables nested deeper than {MAX_DEPTH} levels")
        elif token in ("]", "}"):
            depth -= 1
    return tomllib.loads(text)


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build a Config from defaults, the TOML file, the environment and explicit overrides.

    `overrides` maps "section.key" to a value (tests and the CLI use it) and wins over all.
    """
    env = os.environ if env is None else env
    path = path or env.get("SKIPLOCK_CONFIG") or None
    file_data: dict[str, Any] = {}
    config_path = Path(path) if path else None
    if config_path is not None:
        try:
            text = config_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"config file {config_path} does not exist") from None
        try:
            file_data = _bounded_toml(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_path} is not valid TOML: {exc}") from None
        except TooDeep as exc:
            raise ConfigError(f"config file {config_path}: {exc}") from None

    values = {(s.section, s.key): s.default for s in SETTINGS}
    tables: dict[str, Any] = {}
    known_sections = {s.section for s in SETTINGS}
    def keep_records(name: str, records: list) -> None:
        if name not in RECORD_TABLES:
            known = ", ".join(f"[[{n}]]" for n in RECORD_TABLES)
            raise ConfigError(f"config file {config_path}: unknown list of records [[{name}]] (known: {known})")
        tables[name] = records

    for section, content in file_data.items():
        if isinstance(content, list):
            keep_records(section, content)
            continue
        if section not in known_sections and not isinstance(content, dict):
            raise ConfigError(f"config file {config_path}: unknown setting {section!r}")
        if not isinstance(content, dict):
            raise ConfigError(f"config file {config_path}: [{section}] must be a table")
        for key, raw in content.items():
            if isinstance(raw, list) and (section, key) not in _BY_KEY:
                keep_records(f"{section}.{key}", raw)  # e.g. [[alerts.rules]]
                continue
            setting = _BY_KEY.get((section, key))
            if (section, key) in RETIRED:
                raise _retired(section, key, f"in {config_path}")
            if setting is None:
                raise ConfigError(f"config file {config_path}: unknown setting {section}.{key}")
            values[(section, key)] = _coerce(setting, raw, f"in {config_path}")

    for section, key in RETIRED:
        env_var = f"SKIPLOCK_{section}_{key}".upper()
        if env_var in env:
            raise _retired(section, key, f"from ${env_var}")
    for setting in SETTINGS:
        if setting.env_var in env:
            values[(setting.section, setting.key)] = _coerce(
                setting, env[setting.env_var], f"from ${setting.env_var}"
            )

    for dotted, raw in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        setting = _BY_KEY.get((section, key))
        if (section, key) in RETIRED:
            raise _retired(section, key, "override")
        if setting is None:
            raise ConfigError(f"unknown setting {dotted}")
        values[(section, key)] = _coerce(setting, raw, "override")

    return Config(values, tables, config_path)


# --- [[external_queues]] ------------------------------------------------------------------------
# Queues of other systems the collectors watch (docs/external-queues.md). Parsed and checked
# here without a database; `console.external.validate` then checks each entry against the real
# tables at start-up (table and columns exist, every predicate parses and is boolean).
#
# The predicates of a `table` entry (pending, running, failed, completed) are SQL fragments written by
# the operator. They come from the config file only, never from the web or the API, and they are
# the one piece of SQL the console composes from text it did not write: identifiers still go
# through psycopg.sql, values are bound, and every query over them runs in a READ ONLY
# transaction under statement_timeout.

EXTERNAL_SYSTEMS: dict[str, str] = {
    "table": "a hand-rolled table-as-queue, described by predicates",
    "pgqueuer": "PGQueuer (its pgqueuer table; queues are entrypoints)",
    "procrastinate": "Procrastinate (procrastinate_jobs; queues are queue_name)",
    "graphile-worker": "graphile-worker (graphile_worker._private_jobs; queues are task identifiers)",
    "pg-boss": "pg-boss (pgboss.job; queues are job names)",
    "bullmq": "BullMQ 6 on PostgreSQL (bullmq.job; queues are BullMQ queue names)",
    "pgmq": "pgmq (one entry per pgmq queue: its table pgmq.q_<queue>)",
}
NOT_YET_SYSTEMS: tuple[str, ...] = ()
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_COMMON_KEYS = {"name", "system", "dsn", "schema", "stuck_after", "database", "actions"}
_TABLE_KEYS = {"table", "queue_column", "pending", "running", "failed", "completed", "enqueued_at", "lease_until",
               "failed_at", "claim_query_like"}
# Systems whose jobs the console can act on through the library's own functions and statements
# (console.external.actions); a declared table has no state machine Skiplock knows.
ACTION_SYSTEMS = ("pgqueuer", "procrastinate", "graphile-worker", "pg-boss", "bullmq", "pgmq")
_LIBRARY_KEYS = {"table", "claim_query_like"}
_PGMQ_KEYS = {"queue", "claim_query_like"}  # pgmq keeps each queue in a table of its own
_PGMQ_QUEUE = re.compile(r"[A-Za-z0-9_]{1,47}")  # its validate_queue_name: 47 characters at most


@dataclass(frozen=True)
class ExternalQueue:
    """One `[[external_queues]]` entry, as declared (nothing here has touched a database)."""

    name: str
    system: str
    dsn: str = ""
    schema: str = ""
    table: str = ""  # "schema.table" or "table"; the library's default table when empty
    queue_column: str = ""
    pending: str = ""
    running: str = ""
    failed: str = ""
    completed: str = ""  # finished rows that stay in the table (the advisor's ext-completed-rows)
    enqueued_at: str = ""
    lease_until: str = ""
    failed_at: str = ""  # timestamp column: when a failed row failed (its dead-letter growth)
    queue: str = ""  # pgmq: the queue's name (its table is pgmq.q_<queue>)
    claim_query_like: str = ""
    stuck_after: timedelta = timedelta(minutes=5)
    # The [[databases]] entry whose scheduler collects this source and whose pages show it
    # ("" = the first). Its samples live in that database, like the database's own.
    database: str = ""
    # Opt-in to operator actions (replay, purge, cancel, pause) on this source, written into the
    # library's tables through its own functions; off by default: every read is READ ONLY and
    # no face offers an action (console.external.actions refuses before connecting).
    actions: bool = False

    @property
    def where(self) -> str:
        return f"[[external_queues]] {self.name!r}"

    def belongs_to(self, database: str, first: str) -> bool:
        """Whether the console of `database` watches this source (`first`: the first database's name)."""
        return (self.database or first) == database

    def qualified(self, default_table: str) -> tuple[str, str]:
        """(schema, table) of the queue table."""
        table = self.table or default_table
        if "." in table:
            schema, _, name = table.partition(".")
            return schema, name
        return self.schema or "public", table


def _ident(where: str, key: str, value: Any, *, dotted: bool = False) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key} must be a non-empty string")
    parts = value.split(".") if dotted else [value]
    if len(parts) > 2 or not all(_IDENT.fullmatch(p) for p in parts):
        shape = "schema.table or table" if dotted else "a plain column name"
        raise ConfigError(f"{where}: {key} = {value!r} is not {shape} (letters, digits, _; no quoting)")
    return value


def _predicate(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: {key} must be a non-empty SQL predicate, e.g. \"status = 'new'\"")
    # One boolean expression: no statement separator, no comment that could swallow the
    # parenthesis the console wraps it in. The database checks the rest at start-up.
    for bad, what in ((";", "a semicolon"), ("--", "a comment"), ("/*", "a comment")):
        if bad in value:
            raise ConfigError(f"{where}: {key} contains {what}; it must be one SQL boolean expression")
    return value.strip()


def parse_external_queue(index: int, raw: Any) -> ExternalQueue:
    where = f"[[external_queues]] #{index + 1}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: name must be 1-63 letters, digits, '_', '.' or '-' (got {name!r})")
    where = f"[[external_queues]] {name!r}"
    system = raw.get("system")
    if system in NOT_YET_SYSTEMS:
        raise ConfigError(f"{where}: system {system!r} is not supported yet (supported: {', '.join(EXTERNAL_SYSTEMS)})")
    if system not in EXTERNAL_SYSTEMS:
        raise ConfigError(f"{where}: unknown system {system!r} (supported: {', '.join(EXTERNAL_SYSTEMS)})")
    allowed = _COMMON_KEYS | (_TABLE_KEYS if system == "table" else _PGMQ_KEYS if system == "pgmq" else _LIBRARY_KEYS)
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} for system {system!r} (allowed: {', '.join(sorted(allowed))})")
    values: dict[str, Any] = {"name": name, "system": system}
    for key in ("dsn", "claim_query_like", "database"):
        if key in raw:
            if not isinstance(raw[key], str):
                raise ConfigError(f"{where}: {key} must be a string")
            values[key] = raw[key]
    if "schema" in raw:
        values["schema"] = _ident(where, "schema", raw["schema"])
    if "table" in raw:
        values["table"] = _ident(where, "table", raw["table"], dotted=True)
    if "actions" in raw:
        if not isinstance(raw["actions"], bool):
            raise ConfigError(f"{where}: actions must be true or false (got {raw['actions']!r})")
        if raw["actions"] and system not in ACTION_SYSTEMS:
            raise ConfigError(f"{where}: actions = true, but system {system!r} offers no actions (Skiplock does not "
                              f"know a declared table's state machine; actions exist for {', '.join(ACTION_SYSTEMS)})")
        values["actions"] = raw["actions"]
    if "stuck_after" in raw:
        try:
            values["stuck_after"] = duration(raw["stuck_after"])
        except ValueError:
            raise ConfigError(f"{where}: stuck_after = {raw['stuck_after']!r} is not a duration (e.g. 90s, 5m)") from None
    if system == "pgmq":
        queue = raw.get("queue")
        if not isinstance(queue, str) or not _PGMQ_QUEUE.fullmatch(queue):
            raise ConfigError(f"{where}: queue is required for system 'pgmq': the pgmq queue's name, 1-47 letters, digits "
                              f"or _ (got {queue!r}); one entry per pgmq queue")
        values["queue"] = queue
        if raw.get("schema", "pgmq") != "pgmq":
            raise ConfigError(f"{where}: pgmq keeps every queue in the schema pgmq (its functions name it), not {raw['schema']!r}")
    if system == "table":
        if "table" not in raw:
            raise ConfigError(f"{where}: table is required for system 'table' (e.g. table = \"public.app_jobs\")")
        if "pending" not in raw:
            raise ConfigError(f"{where}: pending is required for system 'table' (the predicate of waiting rows)")
        for key in ("queue_column", "enqueued_at", "lease_until", "failed_at"):
            if key in raw:
                values[key] = _ident(where, key, raw[key])
        for key in ("pending", "running", "failed", "completed"):
            if key in raw:
                values[key] = _predicate(where, key, raw[key])
    return ExternalQueue(**values)


def external_queues(config: Config) -> list[ExternalQueue]:
    """The `[[external_queues]]` entries, checked: a bad one raises ConfigError naming it."""
    raw_list = config.tables.get("external_queues", [])
    if not isinstance(raw_list, list):
        raise ConfigError("[[external_queues]] must be an array of tables")
    entries = [parse_external_queue(i, raw) for i, raw in enumerate(raw_list)]
    seen: set[str] = set()
    names = database_names(config)
    for e in entries:
        if e.name in seen or e.name == "skiplock":
            raise ConfigError(f"{e.where}: the name is used twice (or is 'skiplock', Skiplock's own source)")
        seen.add(e.name)
        if e.database and e.database not in names:
            raise ConfigError(f"{e.where}: database = {e.database!r} is not one of the configured databases "
                              f"({', '.join(names)})")
    return entries


def database_names(config: Config) -> list[str]:
    """The names of the configured databases as written in the file (["default"] without
    [[databases]]); console.databases validates the entries themselves."""
    records = config.tables.get("databases") or []
    names = [r.get("name") for r in records if isinstance(r, dict) and isinstance(r.get("name"), str)]
    return names or ["default"]
