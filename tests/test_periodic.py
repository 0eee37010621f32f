"""Periodic (cron) jobs: config validation naming the entry, DST-safe slots, catch-up after
downtime, exactly one job per slot under racing schedulers (threads on separate connections and
two real `skiplock scheduler` processes), and no second job for an archived slot."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import pytest

from console.config import ConfigError, load_config
from console.db import connect
from console.queue import periodic
from console.queue.periodic import Entry, parse_entry
from tests.collector_helpers import eventually
from tests.workers import stop_processes

BERLIN = "Europe/Berlin"


def entries(*raws):
    return periodic.parse_entries((f"[[periodic]] #{i + 1}", raw, "config") for i, raw in enumerate(raws))


# --- validation ---------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "complaint"), [
    ({"name": "bad-cron", "kind": "k", "cron": "61 * * * *"}, "bad cron expression '61 * * * *'"),
    ({"name": "four-fields", "kind": "k", "cron": "0 3 * *"}, "must have five fields"),
    ({"name": "bad-tz", "kind": "k", "cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "unknown timezone 'Mars/Olympus'"),
    ({"name": "both", "kind": "k", "cron": "0 3 * * *", "every": "10s"}, "either cron or every, not both"),
    ({"name": "neither", "kind": "k"}, "needs a schedule"),
    ({"name": "bad-every", "kind": "k", "every": "soon"}, "is not a duration"),
    ({"name": "no-kind", "cron": "0 3 * * *"}, "kind must be"),
    ({"name": "typo", "kind": "k", "cron": "0 3 * * *", "timezon": "UTC"}, "unknown key(s) timezon"),
])
def test_a_bad_entry_stops_loading_with_a_message_naming_it(raw, complaint):
    with pytest.raises(ConfigError) as info:
        entries({"name": "fine", "kind": "k", "every": "1m"}, raw)
    message = str(info.value)
    assert "[[periodic]] #2" in message and repr(raw["name"]) in message and complaint in message


def test_a_duplicate_name_is_refused_naming_both_entries():
    with pytest.raises(ConfigError, match=r"#2.*'nightly' is already used by \[\[periodic\]\] #1"):
        entries({"name": "nightly", "kind": "a", "cron": "0 3 * * *"}, {"name": "nightly", "kind": "b", "every": "1h"})


def test_the_scheduler_and_the_web_refuse_to_start_with_a_bad_entry(tmp_path, subprocess_env):
    path = tmp_path / "skiplock.toml"
    path.write_text('[[periodic]]\nname = "nightly-report"\nkind = "reports.build"\ncron = "0 3 * * *"\n'
                    'timezone = "Europe/Berlni"\n')
    result = subprocess.run([sys.executable, "-m", "console", "--config", str(path), "scheduler"],
                            env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "'nightly-report'" in result.stderr and "Europe/Berlni" in result.stderr
    from console.web import create_app

    with pytest.raises(ConfigError, match="nightly-report"):
        create_app(load_config(path, env={}))


# --- slots ----------------------------------------------------------------------------------

def walk(entry: Entry, start: datetime, n: int) -> list[datetime]:
    out, t = [], start
    for _ in range(n):
        t = entry.next_after(t)
        out.append(t)
    return out


def test_spring_forward_skips_the_slot_in_the_missing_hour():
    e = parse_entry({"name": "n", "kind": "k", "cron": "30 2 * * *", "timezone": BERLIN}, where="t")
    slots = walk(e, datetime(2024, 3, 29, 12, tzinfo=UTC), 3)
    # 30 March 02:30 CET, then no 31 March (02:30 does not exist), then 1 April 02:30 CEST.
    assert slots == [datetime(2024, 3, 30, 1, 30, tzinfo=UTC), datetime(2024, 4, 1, 0, 30, tzinfo=UTC),
                     datetime(2024, 4, 2, 0, 30, tzinfo=UTC)]


def test_fall_back_runs_the_repeated_hour_once():
    e = parse_entry({"name": "n", "kind": "k", "cron": "30 2 * * *", "timezone": BERLIN}, where="t")
    assert walk(e, datetime(2024, 10, 26, 12, tzinfo=UTC), 2) == [
        datetime(2024, 10, 27, 0, 30, tzinfo=UTC),  # 02:30 CEST, the first occurrence only
        datetime(2024, 10, 28, 1, 30, tzinfo=UTC),
    ]
    half_hourly = parse_entry({"name": "h", "kind": "k", "cron": "*/30 * * * *", "timezone": BERLIN}, where="t")
    slots, total = half_hourly.due(datetime(2024, 10, 26, 23, tzinfo=UTC), datetime(2024, 10, 27, 3, tzinfo=UTC), keep=100)
    local = [s.astimezone(half_hourly.tz).strftime("%H:%M%z") for s in slots]
    assert local == ["01:30+0200", "02:00+0200", "02:30+0200", "03:00+0100", "03:30+0100", "04:00+0100"]
    assert total == 6


def test_cron_day_of_week_zero_is_sunday_and_every_slots_are_epoch_aligned():
    sunday = parse_entry({"name": "s", "kind": "k", "cron": "0 3 * * 0"}, where="t")
    assert sunday.next_after(datetime(2024, 1, 1, tzinfo=UTC)).strftime("%a %H:%M") == "Sun 03:00"
    weekdays = parse_entry({"name": "w", "kind": "k", "cron": "0 3 * * 1-5"}, where="t")
    assert weekdays.describe() == "weekdays at 03:00"
    every = parse_entry({"name": "e", "kind": "k", "every": "10s"}, where="t")
    assert every.next_after(datetime(2024, 1, 1, 0, 0, 3, tzinfo=UTC)) == datetime(2024, 1, 1, 0, 0, 10, tzinfo=UTC)


# --- enqueueing -------------------------------------------------------------------------------

T0 = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)


def start(conn, *raws) -> list[Entry]:
    declared = entries(*raws)
    periodic.sync(conn, declared)
    periodic.enqueue_due(conn, declared, now=T0)  # first sight: nothing is enqueued for the past
    return declared


def jobs_of(conn, name):
    return conn.execute("SELECT idempotency_key FROM skiplock.jobs WHERE idempotency_key LIKE %s ORDER BY id",
                        (f"periodic:{name}:%",)).fetchall()


@pytest.mark.parametrize(("catch_up", "expected_jobs", "expected_missed"), [(False, 1, 4), (True, 5, 0)])
def test_after_downtime_catch_up_decides_between_the_latest_slot_and_every_slot(conn, catch_up, expected_jobs, expected_missed):
    declared = start(conn, {"name": "hourly", "kind": "k", "cron": "0 * * * *", "catch_up": catch_up})
    assert jobs_of(conn, "hourly") == []
    report = periodic.enqueue_due(conn, declared, now=T0 + timedelta(hours=5, minutes=10))  # down for five slots
    keys = [k for (k,) in jobs_of(conn, "hourly")]
    assert len(keys) == expected_jobs and keys[-1] == "periodic:hourly:2030-01-01T08:00:00+00:00"
    assert report.missed.get("hourly", 0) == expected_missed
    row = conn.execute("SELECT missed, last_slot, next_slot FROM skiplock.periodic WHERE name = 'hourly'").fetchone()
    assert row == (expected_missed, datetime(2030, 1, 1, 8, tzinfo=UTC), datetime(2030, 1, 1, 9, tzinfo=UTC))


@pytest.mark.parametrize(("grace", "late_by", "expected"), [
    (30, 25, (["03:00:10", "03:00:20", "03:00:30"], 0)),  # a loaded pass, 25 s late: every slot, on its key
    (30, 55, (["03:00:30", "03:00:40", "03:00:50", "03:01:00"], 2)),  # down 55 s: the last 30 s, edge included
    (0, 25, (["03:00:30"], 2)),  # no grace: the newest only, as after downtime
])
def test_without_catch_up_a_late_pass_enqueues_the_slots_within_the_grace(conn, grace, late_by, expected):
    """`catch_up = false`: slots at most `grace` old are late, not missed (the scheduler passes
    scheduler.misfire_grace); a pass that woke a second late under load once counted a slot
    of an `every = "1s"` schedule missed."""
    declared = start(conn, {"name": "tens", "kind": "k", "every": "10s"})
    report = periodic.enqueue_due(conn, declared, now=T0 + timedelta(seconds=5 + late_by), grace=timedelta(seconds=grace))
    keys = [k.split("T")[1][:8] for (k,) in jobs_of(conn, "tens")]
    assert (keys, report.missed.get("tens", 0)) == expected
    assert conn.execute("SELECT missed FROM skiplock.periodic WHERE name = 'tens'").fetchone()[0] == expected[1]


def test_catch_up_is_bounded_and_keeps_the_newest_slots(conn):
    declared = start(conn, {"name": "minutely", "kind": "k", "every": "1m", "catch_up": True})
    periodic.enqueue_due(conn, declared, now=T0 + timedelta(minutes=30), catch_up_limit=10)
    keys = [k for (k,) in jobs_of(conn, "minutely")]
    assert len(keys) == 10 and keys[-1].endswith("03:30:00+00:00") and keys[0].endswith("03:21:00+00:00")
    assert conn.execute("SELECT missed FROM skiplock.periodic").fetchone()[0] == 20


def test_a_paused_schedule_counts_its_slots_as_missed_and_resumes_with_the_next(conn):
    declared = start(conn, {"name": "p", "kind": "k", "every": "1m"})
    periodic.set_paused(conn, "p", True, actor="alice", reason="maintenance window")
    periodic.enqueue_due(conn, declared, now=T0 + timedelta(minutes=3))
    assert jobs_of(conn, "p") == []
    assert conn.execute("SELECT missed FROM skiplock.periodic").fetchone()[0] == 3
    periodic.set_paused(conn, "p", False, actor="alice")
    periodic.enqueue_due(conn, declared, now=T0 + timedelta(minutes=4))
    assert [k for (k,) in jobs_of(conn, "p")] == ["periodic:p:2030-01-01T03:04:00+00:00"]


def test_two_schedulers_racing_on_separate_connections_enqueue_each_slot_once(dsn, conn):
    declared = start(conn, {"name": "race", "kind": "k", "every": "1s", "catch_up": True})
    barrier = threading.Barrier(4)
    errors = []

    def scheduler_like():
        try:
            with connect(dsn, application_name="skiplock-test") as own:
                barrier.wait(timeout=10)
                for step in range(1, 21):  # the same 20 passes, each racing the others
                    periodic.enqueue_due(own, declared, now=T0 + timedelta(seconds=step))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=scheduler_like) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    keys = [k for (k,) in jobs_of(conn, "race")]
    assert len(keys) == len(set(keys)) == 20
    assert conn.execute("SELECT count(*) FROM skiplock.periodic_runs").fetchone()[0] == 20
    assert conn.execute("SELECT missed FROM skiplock.periodic").fetchone()[0] == 0


def test_an_archived_slot_is_not_enqueued_again_even_when_the_schedule_state_is_reset(conn):
    declared = start(conn, {"name": "daily", "kind": "k", "cron": "0 4 * * *", "catch_up": True})
    periodic.enqueue_due(conn, declared, now=T0 + timedelta(hours=2))
    [(job_id,)] = conn.execute("SELECT id FROM skiplock.jobs").fetchall()
    conn.execute("UPDATE skiplock.jobs SET status = 'completed', finished_at = now() - interval '2 days' WHERE id = %s", (job_id,))
    from console import maintenance

    maintenance.archive_completed(conn, older_than=timedelta(hours=1), batch_size=100, pause_ms=0)
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
    # The idempotency key is free again in the hot table; a scheduler whose view of the schedule
    # is behind (a restore, a second leader for a moment) must still not run 04:00 twice.
    conn.execute("UPDATE skiplock.periodic SET last_slot = %s", (T0,))
    periodic.enqueue_due(conn, declared, now=T0 + timedelta(hours=2))
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
    # The run's outcome is found in the archive.
    assert periodic.settle(conn) == 1
    assert conn.execute("SELECT outcome FROM skiplock.periodic_runs").fetchone()[0] == "completed"
    assert conn.execute("SELECT last_success_at FROM skiplock.periodic").fetchone()[0] is not None


def test_run_now_enqueues_a_manual_run_and_audits_it(conn):
    start(conn, {"name": "nightly", "kind": "reports.build", "queue": "reports", "payload": {"scope": "all"}, "cron": "0 3 * * *"})
    job_id = periodic.run_now(conn, "nightly", actor="olga", reason="re-run after fix")
    job = conn.execute("SELECT kind, queue, payload, idempotency_key FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()
    assert job[:3] == ("reports.build", "reports", {"scope": "all"}) and job[3].startswith("periodic:nightly:manual:")
    audit = conn.execute("SELECT actor, action, target, reason FROM skiplock.audit_log ORDER BY id DESC LIMIT 1").fetchone()
    assert audit == ("olga", "periodic_run_now", "periodic:nightly", "re-run after fix")
    with pytest.raises(periodic.PeriodicError):
        periodic.run_now(conn, "nope", actor="olga")


# --- two real scheduler processes --------------------------------------------------------------

@pytest.mark.slow
def test_two_scheduler_processes_enqueue_each_slot_exactly_once_across_a_failover(tmp_path, subprocess_env, conn):
    path = tmp_path / "skiplock.toml"
    path.write_text('[scheduler]\nperiodic_interval = 0.2\nelection_interval = 0.5\ncollect_interval = 60\n\n'
                    '[[periodic]]\nname = "tick"\nkind = "tick"\nevery = "1s"\ncatch_up = true\n')
    env = {**subprocess_env, "SKIPLOCK_CONFIG": str(path)}

    def spawn():
        return subprocess.Popen([sys.executable, "-m", "console", "scheduler"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    procs = [spawn(), spawn()]
    try:
        count = lambda: conn.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = 'tick'").fetchone()[0]  # noqa: E731
        eventually(lambda: count() >= 3, timeout=30)
        leader_pid = eventually(lambda: (conn.execute(
            "SELECT pid FROM skiplock.scheduler_nodes WHERE is_leader AND stopped_at IS NULL").fetchone() or [None])[0], timeout=10)
        leader = next(p for p in procs if p.pid == leader_pid)
        leader.send_signal(signal.SIGKILL)  # mid-flight: the standby takes over and catches up
        leader.wait(10)
        procs.append(spawn())  # a restart of the killed one races the new leader
        before = count()
        eventually(lambda: count() >= before + 3, timeout=30)
    finally:
        stop_processes(procs)
    keys = [k for (k,) in conn.execute("SELECT idempotency_key FROM skiplock.jobs WHERE kind = 'tick'")]
    slots = conn.execute("SELECT count(*) FROM skiplock.periodic_runs WHERE name = 'tick'").fetchone()[0]
    assert len(keys) == len(set(keys)) == slots >= 6
    # One job per second of slots, no gap: catch_up filled the failover's missed seconds.
    stamps = sorted(datetime.fromisoformat(k.split(":", 2)[2]) for k in keys)
    assert all((b - a) == timedelta(seconds=1) for a, b in zip(stamps, stamps[1:], strict=False))


# --- the scheduler's passes ------------------------------------------------------------------

def _config_file(tmp_path, text: str) -> str:
    path = tmp_path / "skiplock.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.slow
def test_a_period_shorter_than_the_pass_gets_every_slot_and_misses_none(tmp_path, dsn, conn):
    """`every = "1s"` with the default 5 s periodic pass: the pass wakes at each slot, so every
    second has its job and none is counted missed (one job per pass, the rest "missed", and a
    periodic_late alert followed when the pass only woke every 5 s)."""
    from console.scheduler import Scheduler

    config = load_config(_config_file(tmp_path, '[scheduler]\ncollect_interval = 60\n\n'
                                                '[[periodic]]\nname = "tick"\nkind = "tick"\nevery = "1s"\n'), env={})
    assert config.scheduler.periodic_interval == 5.0
    s = Scheduler(dsn, config)
    runner = threading.Thread(target=s.run, name="scheduler", daemon=True)
    runner.start()
    try:
        count = lambda: conn.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = 'tick'").fetchone()[0]  # noqa: E731
        eventually(lambda: count() >= 3, timeout=30)
    finally:
        s.stop()
        runner.join(30)
    assert not runner.is_alive()
    missed = conn.execute("SELECT missed FROM skiplock.periodic WHERE name = 'tick'").fetchone()[0]
    keys = [k for (k,) in conn.execute("SELECT idempotency_key FROM skiplock.jobs WHERE kind = 'tick'")]
    stamps = sorted(datetime.fromisoformat(k.split(":", 2)[2]) for k in keys)
    assert missed == 0, f"{missed} slot(s) counted missed; enqueued {stamps}"
    assert all((b - a) == timedelta(seconds=1) for a, b in zip(stamps, stamps[1:], strict=False)), stamps


def test_periodic_schedules_run_in_every_configured_database(tmp_path, make_database, monkeypatch):
    from console.databases import load_databases
    from console.scheduler import Fleet

    monkeypatch.delenv("DATABASE_URL", raising=False)
    east, west = make_database(), make_database()
    path = _config_file(tmp_path, f'[[databases]]\nname = "east"\ndsn = "{east}"\n\n'
                                  f'[[databases]]\nname = "west"\ndsn = "{west}"\n\n'
                                  '[[periodic]]\nname = "tick"\nkind = "tick"\nevery = "1s"\n')
    config = load_config(path, env={})
    fleet = Fleet(load_databases(config, env={}), config)
    try:
        assert fleet.elect() == {"east": True, "west": True}
        for member in fleet.members.values():
            assert member.run_job("periodic") is True  # declares the schedule (first sight)
        enqueued = {}
        for name, dsn in (("east", east), ("west", west)):
            with connect(dsn) as conn:
                enqueued[name] = eventually(lambda conn=conn, member=fleet.members[name]: member.run_job("periodic") and conn.execute(
                    "SELECT count(*) FROM skiplock.jobs WHERE kind = 'tick'").fetchone()[0], timeout=10, interval=0.3)
    finally:
        fleet.close()
    assert enqueued["east"] >= 1 and enqueued["west"] >= 1, enqueued
