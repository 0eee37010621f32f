"""bench/throughput.py's loops run the statements they name: every loop claims and completes a
small backlog through to the end, and the bench counts what each one finished. (The bare loop
once lacked two parameters the claim had gained, and `make bench` failed at its first loop cell.)"""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import ROOT


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_throughput", ROOT / "bench" / "throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = load_bench()


@pytest.mark.parametrize("contender", ["bare", "naive", "bare-prelimits", "bare-archive", "bare-delete"])
def test_each_loop_drains_a_backlog_and_is_counted(conn, contender):
    conn.autocommit = True
    bench.fill_skiplock(conn, 5)
    sql_text = bench.LOOP_SQL.get(contender, bench.CLAIM_SQL)
    params = bench.loop_params("loop-test", 3)
    claimed_per_round, done_per_round = [], []
    for _ in range(3):
        rows = conn.execute(sql_text, params).fetchall()
        claimed = [r for r in rows if r[1] is not None]  # r[0]: completed_ids; r[1]: the claimed job's id
        params["ids"] = [r[1] for r in claimed]
        params["attempts"] = [r[7] for r in claimed]
        claimed_per_round.append(len(claimed))
        done_per_round.append(bench.done_by(contender, conn, 5))
    assert claimed_per_round == [3, 2, 0]
    assert done_per_round == [0, 3, 5]
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status <> 'completed'").fetchone()[0] == 0


def test_the_apart_loop_completes_before_it_claims_and_drains_the_backlog(dsn, conn):
    """bare-100-apart, in a real loop process: every job completed, each batch by complete_many."""
    import multiprocessing as mp

    conn.autocommit = True
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    bench.reset_statements(conn)
    bench.fill_skiplock(conn, 250)
    ctx = mp.get_context("fork")
    out, clock = ctx.Queue(), bench.Clock(ctx)
    proc = ctx.Process(target=bench.loop_worker, args=(dsn, bench.CLAIM_SQL, 100, clock, None, out, True))
    proc.start()
    try:
        deadline = bench.time.time() + 60
        while bench.completed_skiplock(conn) < 250:
            assert bench.time.time() < deadline, "the loop did not drain 250 jobs in 60 s"
            bench.time.sleep(0.05)
    finally:
        clock.stop()
        out.get(timeout=30)
        proc.join(30)
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE status <> 'completed'").fetchone()[0] == 0
    # 250 jobs in claims of 100: the first two batches at least were completed by complete_many
    # (the last one perhaps by the loop's final claim, which completes what it still holds).
    apart = conn.execute("SELECT coalesce(sum(rows), 0) FROM pg_stat_statements "
                         "WHERE query LIKE %s AND query NOT LIKE '%%candidates%%'",
                         ("%UPDATE skiplock.jobs AS j%finished_at = now()%unnest%",)).fetchone()[0]
    assert 200 <= apart <= 250


def test_the_cell_diagnostics_see_the_statements_and_the_waits(dsn, conn):
    """--statements reads this database's costliest statements since the reset, per job; --waits
    counts what the other backends are doing (here: one session idle in a transaction)."""
    conn.autocommit = True
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    bench.reset_statements(conn)
    bench.fill_skiplock(conn, 40)
    lines = bench.statement_costs(conn, 40, 3)
    assert any("INSERT INTO skiplock.jobs" in line and "0.0250 calls/job" in line for line in lines), lines

    holder = bench.connect(dsn, autocommit=False)
    try:
        holder.execute("SELECT 1")
        sampler = bench.WaitSampler(dsn)
        sampler.start()
        bench.time.sleep(0.3)
        waits = sampler.stop()
    finally:
        holder.rollback()
        holder.close()
    assert any("idle in transaction" in line and " 1.00 backends" in line for line in waits), waits


def test_the_sustained_warm_up_is_topped_up_but_not_counted(conn):
    """Every contender's first intervals run as the rest do, topped up after each, and are
    dropped: the first counted interval is not the only one with no top-up beside it."""
    from types import SimpleNamespace

    bench = load_bench()
    done = [0]
    top_ups: list[int] = []

    def completed() -> int:
        done[0] += 100
        return done[0]

    args = SimpleNamespace(sustained_warmup=0.2, duration=0.2, interval=0.05, refill=True, data_dir=None)
    rates = bench.measure_intervals(conn, args, "fake", "skiplock.jobs", completed, top_ups.append)
    assert rates, "no interval counted"
    assert len(top_ups) > len(rates), "the warm-up's intervals were counted, or not topped up"
    assert sum(top_ups) == done[0]  # every job completed, warm-up's too, was put back


def test_the_fitted_line_shows_a_decline_that_one_interval_does_not():
    bench = load_bench()
    assert bench.trend([30.0] * 20) == pytest.approx((30.0, 30.0))
    start, end = bench.trend([40.0 - i for i in range(20)])
    assert (start, end) == pytest.approx((40.0, 21.0))
    # five minutes of 6-s intervals, the first at 1.4x the rest: the last minute against the
    # first 10 s says 0.82, the line 0.95
    start, end = bench.trend([50.0] + [35.0] * 47)
    assert end / start == pytest.approx(0.95, abs=0.01)
