"""The scheduler process: collectors, reaper, archiver and sample retention on intervals, run by
exactly one leader per database.

Several `skiplock scheduler` processes may run against one database. Each holds a dedicated
connection and, every `election_interval` seconds, tries `pg_try_advisory_lock(ELECTION_KEY)`
on it. The one that gets the lock is the leader for as long as that session lives; the others
are standbys that keep trying. When the leader dies (even by SIGKILL) PostgreSQL ends its
session and releases the lock, so a standby wins the next election tick: it takes over within
one election interval. A leader checks its election connection on every tick and steps down
at once if the connection is gone (its lock went with it). Only the leader runs jobs; a
standby's job runs return at once without touching the database.

Jobs (APScheduler 3 `BlockingScheduler`, UTC, `max_instances=1` so runs never overlap,
`coalesce=True` so a backlog of missed runs becomes one, and `misfire_grace_time` from the
config so a run more than that late is skipped):
- collect: one collection cycle (`console.collectors.collect`), then the alert evaluation
  (`console.alerts.scheduling.AlertJobs.after_collection`, called directly), then any hook
  registered with `after_collection` (none is shipped; the list is an extension point), then
  the overview's model of the cycle, built once here and stored for every web process
  (`console.web.cycle_store.refresh`, recorded as job `cycle_models`);
- reap: expired leases back to pending/failed through `console.maintenance.reap` (bounded
  batches), the same function as `skiplock reap` and "reap now", so each run is a
  maintenance-run row with actor "scheduler";
- archive: completed jobs out of the hot table and archive retention (`console.maintenance`);
- bulk_resume: bulk replays/purges whose runner died are resumed (`console.maintenance.bulk`);
- claim_indexes: the limited path's indexes built while a queue or kind is limited, dropped
  when none is (`console.queue.limits.keep_claim_indexes`);
- retention: sample rollups and deletion (`console.collectors.retention`);
- advisor: the advisor's checks run and stored for its page (`console.advisor.report.refresh`),
  once per collection cycle: the page and its API only read the stored run;
- alerts_deliver: the webhook outbox and the dead man's switch (`console.alerts.scheduling`);
- periodic: declare the periodic (cron) schedules, enqueue their due slots exactly once, record
  finished runs' outcomes and prune old runs (`console.queue.periodic`). It wakes at each schedule's
  next slot and at least every `periodic_interval` seconds (`PeriodicTrigger`). The schedules
  are read and validated when the process starts (`[[periodic]]` and the `[scheduler] tasks`
  modules' `@console.schedule`s): a bad one stops start-up with a message naming it.

Every run's start, duration and error are written to `skiplock.scheduler_jobs`, and every node
says it is alive in `skiplock.scheduler_nodes`; `status(conn)` reads both for the web console.

Several databases (`[[databases]]`): `Fleet` runs one `Scheduler` per database inside one
APScheduler, each with its own election connection, lock, job connections and health rows
(advisory locks are per database, so the same key never collides across databases). Two fleet
processes over the same list split the databases between them by whoever wins each lock, and
either takes over the other's databases within one election interval when it dies. A database
that is down, or whose schema is missing, is a standby that keeps trying: the others run on.
Periodic (cron) schedules run in every database: each database's leader declares them in its
own `skiplock.periodic` and enqueues each slot once into its own queue.

It does not start inside the web app (tests and gunicorn workers must never run jobs) and does
not measure anything itself.
"""

from __future__ import annotations

import importlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.interval import IntervalTrigger
from psycopg.rows import dict_row

from console import collectors
from console.collectors import CollectionReport, Options, collector_connection
from console.collectors import retention as sample_retention
from console.collectors.restarts import RESTART_WINDOW_S
from console.db import DatabaseError, connect, error_text, require_schema
from console.queue import periodic
from console.sqlfiles import query

log = logging.getLogger("skiplock.scheduler")

ELECTION_KEY = 0x5C1B_5C4E  # advisory lock key of the scheduler leader (per database)
LEADER_APP = "skiplock-scheduler-leader"
JOB_APP = "skiplock-scheduler"

# --- the after-collection hook list -------------------------------------------------------

Hook = Callable[[psycopg.Connection, CollectionReport], Any]
AFTER_COLLECTION: list[Hook] = []
# Modules imported when a scheduler starts, so their @after_collection hooks register (none
# ships: the alert evaluation is called directly by `_collect`).
HOOK_MODULES: tuple[str, ...] = ()


def after_collection(hook: Hook) -> Hook:
    """Register `hook(conn, report)` to run after every stored collection cycle, on the leader.

    `conn` is an autocommit connection of the scheduler (not the collector's); `report` is the
    cycle just stored (`report.samples`, `report.errors`, `report.details`). A hook that raises
    is recorded as job `after_collection:<name>` and the next hook still runs.
    """
    if hook not in AFTER_COLLECTION:
        AFTER_COLLECTION.append(hook)
    return hook


def _hook_name(hook: Hook) -> str:
    return f"after_collection:{getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', repr(hook))}"


# --- reading the scheduler's health (the web console uses this) ---------------------------

def status(conn: psycopg.Connection) -> dict[str, Any]:
    """{"leader": node or None, "nodes": [...], "jobs": [...], "restarts": [...]}: every
    scheduler process seen in the last hour with its liveness, every job's last run, duration,
    error and totals, and the restarts of the last 15 minutes (a process that replaced one that
    died without stopping; `console.collectors.restarts` counts the same rows)."""
    with conn.cursor(row_factory=dict_row) as cur:
        nodes = cur.execute(query("scheduler", "nodes"), {}).fetchall()
        jobs = cur.execute(query("scheduler", "jobs"), {}).fetchall()
        restarts = cur.execute(query("scheduler", "restarts"), {"window_seconds": RESTART_WINDOW_S}).fetchall()
    leader = next((n for n in nodes if n["is_leader"] and n["alive"]), None)
    return {"leader": leader, "nodes": nodes, "jobs": jobs, "restarts": restarts}


# --- the process ---------------------------------------------------------------------------

@dataclass(frozen=True)
class JobSpec:
    name: str
    interval: float
    run: Callable[[psycopg.Connection], Any]
    app: str = JOB_APP


def _stop_on_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call `stop` (a scheduler or a fleet ends its runs and disconnects)."""
    def on_signal(signum, _frame):
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _alive(conn: psycopg.Connection) -> bool:
    """One empty round trip on a cached connection before a job uses it. A connection whose
    server went away (a restart, a failover, an idle timeout) only learns so on its next
    statement, which would fail that job's run once per connection after every restart; the
    check costs one loopback round trip per run (runs are seconds apart). Only the thread that
    owns `conn` may call it: from another thread, a statement in progress would read as "not
    idle" and the caller would close the connection under it."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False  # a job that failed mid-transaction left it unusable
    try:
        conn.execute("")
        return True
    except psycopg.Error:
        return False


class Scheduler:
    """One scheduler process. `run()` blocks until `stop()` (or SIGTERM/SIGINT)."""

    def __init__(self, dsn: str, config: Any, *, node_id: str | None = None, database: str = "default",
                 home: bool = True):
        self.dsn = dsn
        self.config = config
        self.database = database
        self._schema_ok = False
        self._down_reason: str | None = None  # why the last election failed (logged once per outage)
        s = config.scheduler
        self.election_interval = s.election_interval
        self.node_id = node_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.options = Options.from_config(config, database=database)
        self.retention_settings = sample_retention.RetentionSettings.from_config(config)
        self.is_leader = False
        self.leader_since: datetime | None = None
        self._lock_conn: psycopg.Connection | None = None
        # Each job's connections, used only by that job's run (see "running jobs" below).
        self._conns: dict[str, psycopg.Connection] = {}
        self._conns_lock = threading.Lock()  # guards the dict itself, never held across I/O
        self._stop = threading.Event()
        for module in HOOK_MODULES:
            importlib.import_module(module)
        self.jobs = [
            JobSpec("collect", s.collect_interval, self._collect, app="skiplock-collector"),
            JobSpec("reap", s.reap_interval, self._reap),
            JobSpec("archive", s.archive_interval, self._archive),
            JobSpec("bulk_resume", max(s.reap_interval, 30.0), self._bulk_resume),
            JobSpec("claim_indexes", max(s.reap_interval, 30.0), self._claim_indexes),
            JobSpec("retention", s.retention_interval, self._retention),
            # The advisor's stored run, which its page shows (a page never writes it: issue 26).
            JobSpec("advisor", s.collect_interval, self._advisor, app="skiplock-scheduler-advisor"),
        ]
        # Alerts: evaluated after every collection (with this process's config), delivered on an interval.
        from console.alerts.scheduling import AlertJobs

        self.alerts = AlertJobs(config, database=database, home=home)
        self.jobs.append(JobSpec("alerts_deliver", self.alerts.interval, self.alerts.deliver))
        self.periodic_entries = periodic.load_entries(config)
        # The database's clock minus this host's (seconds), measured by each periodic pass: the
        # database decides which slots are due, so the pass wakes by its clock.
        self._clock_offset = 0.0
        self.jobs.append(JobSpec("periodic", s.periodic_interval, self._periodic))
        self._by_name = {j.name: j for j in self.jobs}
        self._running = {j.name: threading.Lock() for j in self.jobs}  # one run of a job at a time
        self._aps: BlockingScheduler | None = None
        self._executor: ThreadPoolExecutor | None = None

    # --- leader election -----------------------------------------------------------------

    def elect(self) -> bool:
        """One election tick: keep or take the lock, say we are alive; returns is_leader."""
        try:
            if self._lock_conn is None or self._lock_conn.closed or self._lock_conn.broken:
                self._step_down("no election connection")
                self._lock_conn = connect(self.dsn, application_name=LEADER_APP,
                                          connect_timeout=max(1, int(round(self.election_interval))))
            if not self._schema_ok:  # a database met down at start-up is checked when it answers
                require_schema(self._lock_conn)
                self._schema_ok = True
            if self._down_reason is not None:
                log.info("database %s answers again", self.database)
                self._down_reason = None
            with self._lock_conn.cursor() as cur:
                if self.is_leader:
                    cur.execute(query("scheduler", "still_alive"), {})  # the lock lives with the session
                else:
                    got = cur.execute(query("scheduler", "try_lock"), {"key": ELECTION_KEY}).fetchone()[0]
                    if got:
                        self.is_leader = True
                        self.leader_since = datetime.now(UTC)
                        log.info("scheduler %s is now the leader of database %s", self.node_id, self.database)
                cur.execute(query("scheduler", "node_seen"), {
                    "id": self.node_id, "host": socket.gethostname(), "pid": os.getpid(),
                    "is_leader": self.is_leader, "leader_since": self.leader_since,
                })
        except (psycopg.Error, DatabaseError) as exc:
            reason = str(exc) if isinstance(exc, DatabaseError) else type(exc).__name__
            # Said once per outage, not on every tick of a database that stays down.
            (log.debug if reason == self._down_reason else log.warning)(
                "database %s: election connection lost (%s); standing by", self.database, reason)
            self._down_reason = reason
            self._step_down("election connection lost")
            if self._lock_conn is not None:
                self._lock_conn.close()
            self._lock_conn = None
        return self.is_leader

    def _step_down(self, why: str) -> None:
        if self.is_leader:
            log.warning("scheduler %s stops leading database %s: %s", self.node_id, self.database, why)
        self.is_leader = False
        self.leader_since = None

    # --- running jobs ------------------------------------------------------------------
    #
    # Who uses which connection. A psycopg connection must never be used by two threads at
    # once: libpq is not thread-safe per connection, and closing one while another thread is
    # inside a statement on it frees memory that thread still reads (the scheduler died with
    # SIGSEGV in psycopg that way while every job recorded its health on one shared
    # connection). So each job owns its connections (`_conns[job]`, and `_conns["hooks"]` for
    # the collect job's hooks), runs of one job never overlap (`_running[job]`, whoever calls
    # run_job), and a run records its health on its own job's connection. Only the owning
    # run checks, closes or replaces a connection; `close()` runs once every run has ended.

    def _conn(self, name: str, app: str = JOB_APP) -> psycopg.Connection:
        """Job `name`'s connection, checked (`_alive`) and replaced if the server dropped it.
        Called only from that job's run (see above)."""
        conn = self._conns.get(name)
        if conn is not None and not (conn.closed or conn.broken) and not _alive(conn):
            conn.close()  # e.g. PostgreSQL restarted since the last run: reconnect, don't fail the run
        if conn is None or conn.closed or conn.broken:
            if name == "collect":
                conn = collector_connection(self.dsn, self.options)
            else:
                conn = connect(self.dsn, application_name=app)
            with self._conns_lock:
                self._conns[name] = conn
        return conn

    def _drop_if_unusable(self, name: str) -> None:
        """After a failure: a broken connection, or one left inside a transaction, is closed
        (by its owner) so that the next use reconnects."""
        conn = self._conns.get(name)
        if conn is not None and not conn.closed and (
                conn.broken or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE):
            conn.close()

    def run_job(self, name: str) -> bool:
        """Run one job now if this process leads; record its health. Returns True if it ran
        without error (False for a standby, a failure, or while a run of it is in progress)."""
        if not self.is_leader or self._stop.is_set():
            return False
        spec = self._by_name[name]
        running = self._running[name]
        if not running.acquire(blocking=False):
            log.info("database %s: job %s is still running; this run is skipped", self.database, name)
            return False
        try:
            return self._timed(name, spec.interval, lambda: spec.run(self._conn(name, spec.app)), name, spec.app)
        finally:
            running.release()

    def _timed(self, name: str, interval: float | None, work: Callable[[], Any], owner: str,
               app: str = JOB_APP) -> bool:
        """Run `work`, then record its health on the connection `owner` (the running job's)."""
        started_at = datetime.now(UTC)
        t0 = time.perf_counter()
        error = None
        try:
            work()
        except Exception as exc:  # a job's failure is recorded, never the scheduler's death
            error = error_text(exc)[:1000]
            log.warning("database %s: job %s failed: %s", self.database, name, error)
            self._drop_if_unusable(owner)
        duration_ms = (time.perf_counter() - t0) * 1000.0
        self._record(name, interval, started_at, duration_ms, error, owner, app)
        return error is None

    def _record(self, name: str, interval: float | None, started_at: datetime, duration_ms: float,
                error: str | None, owner: str, app: str = JOB_APP) -> bool:
        """Write the run's health row on `owner`'s connection. A connection lost on the way
        (the server restarted or ended the session between the check and the write) is
        replaced and the write tried once more, so a run is not left out of the record for a
        reconnect; a database that stays away is logged, with psycopg's message."""
        params = {"job": name, "leader": self.node_id, "interval": interval, "started_at": started_at,
                  "duration_ms": duration_ms, "error": error}
        for attempt in (1, 2):
            try:
                self._conn(owner, app).execute(query("scheduler", "job_ran"), params)
                return True
            except (psycopg.Error, DatabaseError) as exc:
                lost = isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
                self._drop_if_unusable(owner)
                if attempt == 1 and lost:
                    continue
                # The message too: a class name alone ("OperationalError", 84 times) said nothing.
                log.warning("database %s: could not record the health of job %s: %s", self.database, name,
                            error_text(exc))
                return False
        return False

    # --- the jobs ----------------------------------------------------------------------

    def _collect(self, conn: psycopg.Connection) -> None:
        report = collectors.collect(conn, self.options, leader=self.node_id)
        if report.errors:
            log.info("collection %s: collector errors %s", report.run_id, report.errors)
        # The hooks run on the collect job's second connection ("hooks", owned by this run),
        # checked before each hook so that one hook's lost connection does not fail the next.
        for hook in [*AFTER_COLLECTION, self.alerts.after_collection]:
            self._timed(_hook_name(hook), None, lambda hook=hook: hook(self._conn("hooks"), report), "hooks")
        # Last, once the cycle is evaluated: the overview's model of this cycle, built here once
        # for every web process (console/web/cycle_store.py), on the same hooks connection.
        self._timed("cycle_models", None, self._store_models, "hooks")

    def _store_models(self) -> None:
        from console.web import cycle_store, overview

        # name -> (build, keep) of each model the leader stores (overview.STORED)
        took = cycle_store.refresh(self._conn("hooks"), self.config, self.database, overview.STORED)
        log.debug("database %s: stored models %s", self.database, took)

    def _reap(self, conn: psycopg.Connection) -> None:
        from console import maintenance

        c = self.config
        result = maintenance.reap(conn, actor="scheduler", batch_size=c.scheduler.reap_batch_size, max_batches=10,
                                  backoff_base=c.queue.backoff_base, backoff_cap=c.queue.backoff_cap,
                                  history=c.queue.error_history)
        if result.rows:
            log.info("reaper rescued %d job(s) to pending, %d to failed", result.detail["pending"], result.detail["failed"])

    def _archive(self, conn: psycopg.Connection) -> None:
        from console import maintenance
        from console.maintenance.settings import MaintenanceSettings

        settings = MaintenanceSettings.from_config(self.config)
        maintenance.archive_completed(conn, **settings.archive_kwargs(), max_batches=100, stop=self._stop)
        maintenance.apply_retention(conn, **settings.retention_kwargs(), actor="scheduler")

    def _bulk_resume(self, conn: psycopg.Connection) -> None:
        from console.maintenance import bulk

        bulk.resume_abandoned(self.dsn, stop=self._stop, history=self.config.queue.error_history)

    def _claim_indexes(self, conn: psycopg.Connection) -> None:
        from console.queue import limits

        for name, what in limits.keep_claim_indexes(conn).items():
            log.info("limited path: index %s %s (database %s)", name, what, self.database)

    def _advisor(self, conn: psycopg.Connection) -> None:
        from console.advisor import report

        report.refresh(conn, self.config)

    def _retention(self, conn: psycopg.Connection) -> None:
        sample_retention.run(conn, self.retention_settings)

    def _periodic(self, conn: psycopg.Connection) -> None:
        s = self.config.scheduler
        asked = time.time()
        db_now = conn.execute(query("periodic", "db_now"), {}).fetchone()[0]
        self._clock_offset = db_now.timestamp() - (asked + time.time()) / 2
        periodic.sync(conn, self.periodic_entries)
        report = periodic.enqueue_due(conn, self.periodic_entries, catch_up_limit=s.periodic_catch_up_limit,
                                      max_attempts=self.config.queue.max_attempts,
                                      grace=timedelta(seconds=s.misfire_grace))
        for name, ids in report.enqueued.items():
            log.info("periodic %s: enqueued job(s) %s", name, ids)
        for name, count in report.missed.items():
            log.info("periodic %s: %d slot(s) missed (paused, or the scheduler was down)", name, count)
        periodic.settle(conn)
        periodic.prune(conn, keep_seconds=s.periodic_keep_days * 86400.0)

    # --- lifecycle ---------------------------------------------------------------------

    def build(self) -> BlockingScheduler:
        self._executor = ThreadPoolExecutor(max_workers=len(self.jobs) + 1)
        aps = _blocking_scheduler(self.config, self._executor)
        self.add_jobs(aps)
        return aps

    def add_jobs(self, aps: BlockingScheduler, suffix: str = "") -> None:
        """This database's election and jobs on `aps` (ids end with `suffix`, e.g. ":east")."""
        aps.add_job(self.elect, "interval", seconds=self.election_interval, id="elect" + suffix, name="elect" + suffix)
        for spec in self.jobs:
            trigger = (PeriodicTrigger(spec.interval, self.next_periodic_wake) if spec.name == "periodic"
                       else IntervalTrigger(seconds=spec.interval))
            aps.add_job(self.run_job, trigger, args=[spec.name], id=spec.name + suffix,
                        name=spec.name + suffix, next_run_time=datetime.now(UTC))

    def next_periodic_wake(self, now: datetime) -> datetime | None:
        """When (by this host's clock) the next slot of a periodic schedule is due by the
        database's clock, plus SLOT_MARGIN; None without schedules."""
        offset = timedelta(seconds=self._clock_offset)
        slot = periodic.next_slot(self.periodic_entries, now + offset)
        return None if slot is None else slot - offset + SLOT_MARGIN

    def run(self) -> int:
        with connect(self.dsn, application_name=JOB_APP) as conn:
            require_schema(conn)
        self._schema_ok = True
        # APScheduler logs every run at INFO; the runs' health is in skiplock.scheduler_jobs.
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
        self.elect()  # before the first runs, so a winner runs them at once
        self._aps = self.build()
        log.info("scheduler %s starting (election every %gs)", self.node_id, self.election_interval)
        try:
            self._aps.start()
        finally:
            self._stop.set()
            self._executor.shutdown(wait=True)  # runs in progress finish (each is bounded) before we disconnect
            self.close()
        return 0

    def stop(self) -> None:
        self._stop.set()
        if self._aps is not None and self._aps.running:
            self._aps.shutdown(wait=False)

    def install_signal_handlers(self) -> None:
        _stop_on_signals(self.stop)

    def close(self) -> None:
        """Release the lead (closing the election session releases the lock) and connections."""
        try:
            if self._lock_conn is not None and not self._lock_conn.closed:
                self._lock_conn.execute(query("scheduler", "node_stopped"), {"id": self.node_id})
        except psycopg.Error:
            pass
        with self._conns_lock:
            conns = [*self._conns.values()]
            self._conns.clear()
        for conn in [self._lock_conn, *conns]:
            if conn is not None:
                conn.close()
        self._lock_conn = None
        self.is_leader = False


# A periodic pass wakes this long after a slot, so that the database's clock has passed the slot
# too (the offset between the clocks is measured to within a loopback round trip).
SLOT_MARGIN = timedelta(milliseconds=50)


class PeriodicTrigger(BaseTrigger):
    """The periodic job's wake-ups: at the next slot of any schedule, and at least every
    `interval` seconds (`scheduler.periodic_interval`: outcomes are settled and pauses read).

    Waking only every `interval` seconds, a schedule with a shorter period (`every = "2s"` with
    the default 5 s pass) got one job per pass and the other slots counted as missed, which
    fired `periodic_late` although nothing was paused or down. Waking at the slot, every
    schedule gets each of its slots, on time, whatever the pass interval."""

    def __init__(self, interval: float, next_wake: Callable[[datetime], datetime | None]):
        self.interval = timedelta(seconds=interval)
        self.next_wake = next_wake

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime:
        regular = now if previous_fire_time is None else previous_fire_time + self.interval
        wake = self.next_wake(now)
        return regular if wake is None else min(regular, wake)

    def __str__(self) -> str:
        return f"periodic[at each slot, at least every {self.interval.total_seconds():g}s]"


def _blocking_scheduler(config: Any, executor: ThreadPoolExecutor) -> BlockingScheduler:
    grace = max(1, int(round(config.scheduler.misfire_grace)))
    return BlockingScheduler(
        timezone="UTC",
        executors={"default": executor},
        job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": grace},
    )


class Fleet:
    """One scheduler process over several databases: a `Scheduler` per database, one APScheduler.

    `members[name]` is that database's Scheduler (its own election, lock and connections). A
    database that is down at start-up does not stop the start: its member stands by and
    checks the schema once the database answers. `run()` blocks until `stop()`.
    """

    def __init__(self, databases: list[Any], config: Any, *, node_id: str | None = None):
        if not databases:
            raise ValueError("a fleet needs at least one database")
        self.config = config
        self.node_id = node_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.members: dict[str, Scheduler] = {
            d.name: Scheduler(d.dsn, config, node_id=self.node_id, database=d.name, home=(i == 0))
            for i, d in enumerate(databases)
        }
        self._aps: BlockingScheduler | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._stop = threading.Event()

    def elect(self) -> dict[str, bool]:
        """One election tick in every database, in turn; {name: is_leader}."""
        return {name: member.elect() for name, member in self.members.items()}

    def build(self) -> BlockingScheduler:
        workers = sum(len(m.jobs) + 1 for m in self.members.values())
        self._executor = ThreadPoolExecutor(max_workers=workers)
        aps = _blocking_scheduler(self.config, self._executor)
        for name, member in self.members.items():
            member.add_jobs(aps, f":{name}")
        return aps

    def run(self) -> int:
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
        self.elect()
        self._aps = self.build()
        log.info("scheduler %s starting over %d databases (%s; election every %gs)", self.node_id,
                 len(self.members), ", ".join(self.members), self.config.scheduler.election_interval)
        try:
            self._aps.start()
        finally:
            self._halt_members()
            self._executor.shutdown(wait=True)
            self.close()
        return 0

    def _halt_members(self) -> None:
        self._stop.set()
        for member in self.members.values():
            member._stop.set()

    def stop(self) -> None:
        self._halt_members()
        if self._aps is not None and self._aps.running:
            self._aps.shutdown(wait=False)

    def install_signal_handlers(self) -> None:
        _stop_on_signals(self.stop)

    def close(self) -> None:
        for member in self.members.values():
            member.close()
