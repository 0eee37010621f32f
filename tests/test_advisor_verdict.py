"""The verdict over stored samples: each migration signal, the three outcomes, and an honest
"not enough history"."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from console import samples
from console.advisor.verdict import (
    FITS,
    NO_HISTORY,
    OUTGROWING,
    WATCH,
    evaluate_verdict,
    verdict_line,
)
from console.db import connect
from console.samples import Sample


def history(conn, hours: float, step_minutes: float = 30, **series):
    """Store samples every `step_minutes` over the last `hours`; each keyword is
    metric=(labels, f(fraction of the way from oldest to newest) -> value)."""
    now = datetime.now(UTC)
    steps = int(hours * 60 / step_minutes)
    rows = []
    for i in range(steps + 1):
        at = now - timedelta(hours=hours) + timedelta(minutes=step_minutes * i)
        x = i / steps
        for metric, specs in series.items():
            for labels, f in specs:
                rows.append(Sample(metric, labels, f(x), at))
    samples.store(conn, rows)


def healthy(**extra):
    base = {
        "claim_latency_seconds": [({"queue": "all", "source": "workers", "quantile": "p95"}, lambda x: 0.004)],
        "table_autovacuum_behind": [({"table": "jobs"}, lambda x: 0.0)],
        "lock_waits": [({"relation": "jobs"}, lambda x: 0.0)],
        "lwlock_waits": [({"event": "multixact"}, lambda x: 0.0)],
        "wal_bytes_per_second": [({}, lambda x: 200_000.0)],
        "connections": [({"state": "active"}, lambda x: 10.0), ({"state": "idle"}, lambda x: 20.0)],
        "max_connections": [({}, lambda x: 200.0)],
        "throughput": [({"outcome": "completed"}, lambda x: 50.0)],
    }
    base.update(extra)
    return base


def test_no_samples_is_said_honestly(conn):
    verdict = evaluate_verdict(conn)
    assert verdict.label == NO_HISTORY
    assert "no samples stored yet" in verdict.headline
    line = verdict_line(conn)
    assert line["label"] == NO_HISTORY and line["level"] == "unknown" and line["state"] == "unknown"


def test_two_quiet_days_fit_postgresql(conn):
    history(conn, 48, **healthy())
    verdict = evaluate_verdict(conn)
    assert verdict.label == FITS, verdict.headline
    assert verdict.enough_history
    assert "no migration signal over 2.0 days" in verdict.headline
    assert all(s.level in ("ok", "unknown") for s in verdict.signals)
    assert verdict_line(conn)["state"] == "healthy" and verdict_line(conn)["reasons"] == []


def test_growing_claim_latency_and_autovacuum_behind_are_outgrowing(conn):
    history(conn, 48, **healthy(
        claim_latency_seconds=[({"queue": "all", "source": "workers", "quantile": "p95"}, lambda x: 0.004 + 0.1 * x)],
        table_autovacuum_behind=[({"table": "jobs"}, lambda x: 1.0 if x > 0.5 else 0.0)],
    ))
    verdict = evaluate_verdict(conn)
    assert verdict.label == OUTGROWING
    by_id = {s.id: s for s in verdict.signals}
    assert by_id["claim-latency"].level == "outgrowing"
    assert by_id["autovacuum"].level == "outgrowing"
    assert "claim latency went from" in verdict.headline and "autovacuum" in verdict.headline
    # claims slowed while completed jobs/s stayed flat: something else competes
    assert by_id["competition"].level == "watch"
    line = verdict_line(conn)
    assert line["signals"] == ["Claim latency growing", "Autovacuum falling behind"]
    assert line["state"] == "degraded" and line["reasons"] == [verdict.headline]  # the overview's scale


def test_occasional_lock_waits_with_a_few_hours_of_history_are_watch_and_say_so(conn):
    history(conn, 3, step_minutes=5, **healthy(
        lock_waits=[({"relation": "jobs"}, lambda x: 1.0 if int(x * 36) % 10 == 0 else 0.0)],
    ))
    verdict = evaluate_verdict(conn)
    assert verdict.label == WATCH
    assert "lock waits on the jobs tables" in verdict.headline
    assert "only 3 h of history; trends need at least a day" in verdict.headline
    assert not verdict.enough_history


def test_replica_lag_wal_growth_and_slru_waits_each_raise_the_verdict(conn):
    history(conn, 30, **healthy(
        replica_lag_seconds=[({"standby": "replica1"}, lambda x: 45.0)],
        wal_bytes_per_second=[({}, lambda x: 200_000 + 6_000_000 * x * x)],
        lwlock_waits=[({"event": "multixact"}, lambda x: 2.0 if x > 0.6 else 0.0)],
    ))
    by_id = {s.id: s for s in evaluate_verdict(conn).signals}
    assert by_id["replica-lag"].level == "watch" and "p95 replica lag 45.0 s" in by_id["replica-lag"].text
    assert by_id["wal"].level == "outgrowing"
    assert by_id["slru-waits"].level == "outgrowing"


def test_connections_near_the_limit_are_competition(conn):
    history(conn, 30, **healthy(connections=[({"state": "active"}, lambda x: 190.0)]))
    by_id = {s.id: s for s in evaluate_verdict(conn).signals}
    assert by_id["competition"].level == "outgrowing"
    assert "p95 connections 190 of 200" in by_id["competition"].text


def test_the_overviews_line_is_read_once_per_newest_sample(conn, dsn):
    """The overview passes the newest stored sample's time: while no cycle has stored newer
    samples the line is the one already read (no read of a week of series per page load); a
    newer sample reads again. A connection whose server session is gone shows which happened."""
    history(conn, 48, **healthy())
    newest = conn.execute("SELECT max(collected_at) FROM skiplock.samples").fetchone()[0]
    first = verdict_line(conn, newest=newest)
    assert first["state"] == "healthy"
    with connect(dsn) as gone:
        conn.execute("SELECT pg_terminate_backend(%s)", (gone.info.backend_pid,))
        assert verdict_line(gone, newest=newest) == first  # nothing read
        again = verdict_line(gone, newest=newest + timedelta(seconds=15))  # a new cycle: read, and it fails
        assert again["text"].startswith("advisor verdict not available"), again


# --- enough evidence: a minimum of history, and known causes named instead -------------------


def rising(x: float) -> float:
    """Claim latency flat at 4 ms for the first half of the history, then ten times that."""
    return 0.004 if x < 0.5 else 0.04


def test_eight_minutes_of_history_say_not_enough_history_and_call_nothing_outgrowing(conn):
    """The demo's first minutes: vacuum removed nothing in every sample (its idle session). Eight
    minutes are no basis for "outgrowing", in the verdict or in the signal's row."""
    history(conn, 8 / 60, step_minutes=0.25, **healthy(vacuum_removed_nothing=[({"table": "jobs"}, lambda x: 1.0)]))
    verdict = evaluate_verdict(conn)
    assert verdict.label == NO_HISTORY
    assert verdict.headline.startswith("Not enough history yet (8 min of 1 h of samples)"), verdict.headline
    autovacuum = {s.id: s for s in verdict.signals}["autovacuum"]
    assert autovacuum.level == "watch", autovacuum
    assert "not enough history yet to call it outgrowing (8 min of 6 h, 33 of 6 sampling points at least)" in autovacuum.text
    assert all(s.level != "outgrowing" for s in verdict.signals)
    assert "needs 6 h and 6 sampling points of the signal's own history" in verdict.minimums["text"]


def test_three_hours_of_a_tenfold_claim_latency_are_watch_until_six(conn):
    history(conn, 3, step_minutes=5, **healthy(
        claim_latency_seconds=[({"queue": "all", "source": "workers", "quantile": "p95"}, rising)]))
    verdict = evaluate_verdict(conn)
    assert verdict.label == WATCH, verdict.headline
    assert "claim latency went from 4.0 ms to 40.0 ms (10.0x); not enough history yet to call it outgrowing (3 h of 6 h" in verdict.headline
    assert verdict_line(conn)["state"] == "healthy"


def with_holder(x: float) -> float:
    """A holder's age: none in the first half, then a session idle for minutes on end."""
    return 0.0 if x < 0.5 else 360.0


def test_claims_climbing_behind_an_idle_holder_name_it_and_its_fix_not_outgrowing(conn, dsn):
    from tests.collector_helpers import cycle

    idle = connect(dsn, application_name="report-export", autocommit=False)
    try:
        idle.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        idle.execute("SELECT count(*) FROM skiplock.jobs")  # idle in transaction, holding its snapshot
        pid = idle.info.backend_pid
        history(conn, 8, step_minutes=5, **healthy(
            claim_latency_seconds=[({"queue": "all", "source": "workers", "quantile": "p95"}, rising)],
            vacuum_removed_nothing=[({"table": "jobs"}, lambda x: 1.0 if x >= 0.5 else 0.0)],
            xmin_horizon_age_seconds=[({"holder": "any"}, with_holder), ({"holder": "idle_in_transaction"}, with_holder),
                                      ({"holder": "replication_slot"}, lambda x: 0.0)],
        ))
        cycle(dsn, only=("horizon",))  # the horizon collector's details name the session
        verdict = evaluate_verdict(conn)
        by_id = {s.id: s for s in verdict.signals}
        assert verdict.label == WATCH, verdict.headline
        for sid in ("claim-latency", "autovacuum"):
            assert by_id[sid].level == "watch" and by_id[sid].cause["subject"] == f"pid {pid}", by_id[sid]
        held = f"an idle-in-transaction session (pid {pid}, app report-export) holds the xmin horizon for"
        assert held in verdict.headline and f"end it (pg_terminate_backend({pid})); claims recover once vacuum runs" in verdict.headline
        line = verdict_line(conn)
        assert line["state"] == "healthy" and line["reasons"] == [] and held in line["text"]
    finally:
        idle.rollback()
        idle.close()
    cycle(dsn, only=("horizon",))  # the session ended: the newest details no longer list it
    ended = {s.id: s for s in evaluate_verdict(conn).signals}["claim-latency"]
    assert ended.level == "watch"
    assert ended.cause["text"].startswith("a session idle in transaction held the xmin horizon (up to 6 min) while this signal held")
    assert "set idle_in_transaction_session_timeout" in ended.cause["fix"]


def test_a_paused_queue_whose_backlog_grows_names_the_pause(conn):
    from console import queue as q
    from console.maintenance import actions

    q.enqueue_many(conn, [q.NewJob("reindex", queue="search", priority=5) for _ in range(150)])
    actions.pause_queue(conn, "search", actor="alice", reason="search cluster upgrade")
    # paused before the claims grew dearer: the pause is five hours old
    conn.execute("UPDATE skiplock.queues SET paused_at = now() - interval '5 hours' WHERE name = 'search'")
    history(conn, 8, step_minutes=5, **healthy(
        claim_latency_seconds=[({"queue": "all", "source": "workers", "quantile": "p95"}, rising)],
        queue_age_seconds=[({"queue": "search", "system": "skiplock"}, lambda x: max(0.0, x - 0.375) * 8 * 3600)],
    ))
    verdict = evaluate_verdict(conn)
    assert verdict.label == WATCH, verdict.headline
    latency = {s.id: s for s in verdict.signals}["claim-latency"]
    assert latency.cause["kind"] == "held-back-work" and latency.cause["subject"] == "queue search"
    assert "queue search is paused (paused by alice 5.0 h ago) with 150 jobs at the head of the claim index" in verdict.headline
    assert "resume it once its incident allows (skiplock resume search" in verdict.headline


def test_an_operators_change_shortly_before_the_rise_is_named(conn):
    history(conn, 8, step_minutes=5, **healthy(
        claim_latency_seconds=[({"queue": "all", "source": "workers", "quantile": "p95"}, rising)]))
    # a bulk replay ten minutes before the claims grew dearer (the audit log keeps when)
    conn.execute("INSERT INTO skiplock.audit_log (at, actor, action, target, rows, reason) "
                 "VALUES (now() - interval '4 hours 10 minutes', 'alice', 'replay', 'operation:7', 20000, 'provider is back')")
    verdict = evaluate_verdict(conn)
    assert verdict.label == WATCH, verdict.headline
    latency = {s.id: s for s in verdict.signals}["claim-latency"]
    assert latency.cause["kind"] == "operator-change"
    assert "an operator's change shortly before: alice ran 'replay' on operation:7" in verdict.headline
    assert "20,000 rows, reason: provider is back" in verdict.headline and "before the rise began" in verdict.headline


def test_a_capacity_signal_with_no_known_cause_is_still_outgrowing(conn):
    """The converse: enough history, claims ten times dearer, and only what does not explain it:
    a holder in a fifth of the samples, a paused queue with 50 jobs, a replay three hours before
    the rise, a sign-in just before it."""
    from console import queue as q
    from console.maintenance import actions

    q.enqueue_many(conn, [q.NewJob("reindex", queue="search", priority=5) for _ in range(50)])
    actions.pause_queue(conn, "search", actor="alice")
    conn.execute("UPDATE skiplock.queues SET paused_at = now() - interval '5 hours' WHERE name = 'search'")
    conn.execute("INSERT INTO skiplock.audit_log (at, actor, action, target, rows) VALUES "
                 "(now() - interval '7 hours', 'alice', 'replay', 'operation:3', 20000), "
                 "(now() - interval '4 hours 5 minutes', 'alice', 'login', 'user:alice', NULL)")
    history(conn, 8, step_minutes=5, **healthy(
        claim_latency_seconds=[({"queue": "all", "source": "workers", "quantile": "p95"}, rising)],
        xmin_horizon_age_seconds=[({"holder": "any"}, lambda x: 360.0 if 0.5 <= x < 0.6 else 0.0)],
    ))
    verdict = evaluate_verdict(conn)
    assert verdict.label == OUTGROWING, verdict.headline
    latency = {s.id: s for s in verdict.signals}["claim-latency"]
    assert latency.level == "outgrowing" and latency.cause is None
    assert verdict_line(conn)["state"] == "degraded"
