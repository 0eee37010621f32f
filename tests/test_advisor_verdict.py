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
