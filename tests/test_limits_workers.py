"""Limits held by real `skiplock worker` processes against a real PostgreSQL: two workers racing
a concurrency limit of 2 while 30 jobs wait, a rate limit over a window, a limit held across a
worker's SIGKILL (its slots come back only when the reaper rescues its leases), and a kind's
concurrency declared with `@console.task("scarce", concurrency=1)`.

"At no instant" is checked two ways: a sampler counts the queue's running rows every few
milliseconds, and the handlers write when they started and ended (public.spans), whose largest
overlap must stay within the limit too.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from psycopg import sql

from console import queue as q
from console.db import connect
from console.queue import limits
from tests.workers import EXECUTIONS_TABLE, wait_for

pytestmark = pytest.mark.slow

SPANS_TABLE = """
CREATE TABLE IF NOT EXISTS public.spans (
    job_id     bigint      NOT NULL,
    attempt    integer     NOT NULL,
    queue      text        NOT NULL,
    worker_pid integer     NOT NULL,
    started    timestamptz NOT NULL,
    ended      timestamptz
)
"""


@pytest.fixture
def db(conn):
    conn.execute(EXECUTIONS_TABLE)
    conn.execute(SPANS_TABLE)
    return conn


class Sampler(threading.Thread):
    """Counts running rows whose `column` (queue or kind) is `value` every few milliseconds;
    keeps the largest count."""

    def __init__(self, dsn: str, column: str, value: str, *, deadline: float = 120):
        super().__init__(daemon=True)
        self.dsn, self.params = dsn, (value,)
        self.sql = sql.SQL("SELECT count(*) FROM skiplock.jobs WHERE status = 'running' AND {} = %s").format(sql.Identifier(column))
        self.most = 0
        self.samples = 0
        self._halt = threading.Event()
        self._deadline = time.monotonic() + deadline

    def run(self) -> None:
        with connect(self.dsn) as conn:
            while not self._halt.is_set() and time.monotonic() < self._deadline:
                self.most = max(self.most, conn.execute(self.sql, self.params).fetchone()[0])
                self.samples += 1
                time.sleep(0.005)

    def stop(self) -> int:
        self._halt.set()
        self.join(timeout=10)
        return self.most


def largest_overlap(conn, queue: str) -> int:
    """The most spans of `queue` open at once (each span's start is a candidate instant)."""
    return conn.execute("""
        SELECT coalesce(max(n), 0) FROM (
            SELECT (SELECT count(*) FROM public.spans AS o
                    WHERE o.queue = s.queue AND o.started <= s.started
                      AND (o.ended IS NULL OR o.ended > s.started)) AS n
            FROM public.spans AS s WHERE s.queue = %s) AS t""", (queue,)).fetchone()[0]


def enqueue(conn, n: int, *, queue: str, kind: str = "span", payload=None) -> list[int]:
    with conn.transaction():
        return q.enqueue_many(conn, [q.NewJob(kind, payload or {"sleep": 0.1}, queue=queue) for _ in range(n)])


def done(conn, queue: str) -> int:
    return conn.execute("SELECT count(*) FROM skiplock.jobs WHERE queue = %s AND status = 'completed'", (queue,)).fetchone()[0]


def test_two_workers_racing_a_concurrency_limit_of_two(db, dsn, workers):
    """Three workers with one handler thread each race for a queue limited to 2: without a
    fleet-wide limit three would run at once. A worker whose job finishes claims again at once
    while the others wait for their poll, so which workers win is not fair, only bounded; two
    handlers overlapping can only be two different workers."""
    limits.set_limits(db, "lim", concurrency=2, actor="test")
    procs = [workers.start("--concurrency", "1") for _ in range(3)]
    pids = [p.pid for p in procs]
    wait_for(lambda: db.execute("SELECT count(DISTINCT pid) FROM skiplock.workers WHERE pid = ANY(%s)",
                                (pids,)).fetchone()[0] == 3, timeout=60, what="the three workers registered")
    sampler = Sampler(dsn, "queue", "lim")
    sampler.start()
    enqueue(db, 30, queue="lim", payload={"sleep": 0.2})
    enqueue(db, 10, queue="free", payload={"sleep": 0.05})  # unlimited work beside it
    wait_for(lambda: done(db, "lim") == 30, timeout=90, what="30 limited jobs completed")
    most = sampler.stop()
    assert sampler.samples > 100, f"only {sampler.samples} samples"
    assert most <= 2, f"{most} jobs of a queue limited to 2 ran at once"
    overlap = largest_overlap(db, "lim")
    assert overlap == 2, f"the handlers' largest overlap was {overlap} (limit 2: never more, and used)"
    ran_in = {r[0] for r in db.execute("SELECT DISTINCT worker_pid FROM public.spans WHERE queue = 'lim'").fetchall()}
    assert len(ran_in) >= 2 and ran_in <= set(pids), f"the limited jobs ran in {ran_in} (workers {pids})"
    assert done(db, "free") == 10
    for proc in procs:
        assert workers.stop(proc)[0] == 0


def test_a_rate_limit_over_a_window(db, dsn, workers):
    rate, burst = 4, 4  # 4/s: a bucket of 4
    limits.set_limits(db, "rated", rate="4/s", actor="test")
    enqueue(db, 20, queue="rated", kind="noop", payload={})
    workers.start("--concurrency", "4")
    workers.start("--concurrency", "4")
    wait_for(lambda: done(db, "rated") == 20, timeout=60, what="20 rate-limited jobs completed")
    times = [r[0] for r in db.execute("SELECT extract(epoch FROM locked_at)::float8 FROM skiplock.jobs"
                                      " WHERE queue = 'rated' ORDER BY locked_at").fetchall()]
    for window in (0.5, 1.0, 2.0, 3.0):
        most = max(sum(1 for u in times if t <= u < t + window) for t in times)
        assert most <= rate * window + burst, f"{most} claims within {window}s (allowed {rate * window + burst:g})"
    assert times[-1] - times[0] >= (20 - burst) / rate - 0.1  # 16 jobs past the burst at 4/s: at least ~4 s


def test_a_limit_held_across_a_worker_sigkill(db, dsn, workers):
    limits.set_limits(db, "lim", concurrency=2, actor="test")
    slow = enqueue(db, 2, queue="lim", kind="slow_first", payload={"first_sleep": 120})
    quick = enqueue(db, 4, queue="lim", kind="record", payload={"sleep": 0.1})
    sampler = Sampler(dsn, "queue", "lim")
    sampler.start()
    a = workers.start("--concurrency", "4", "--lease", "1")
    wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.jobs WHERE status = 'running' AND id = ANY(%s)",
                                (slow,)).fetchone()[0] == 2, timeout=30, what="worker A running both slow jobs")
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=10)
    b = workers.start("--concurrency", "4")
    # A's leases expire a second later; nothing reaps them, so its two slots stay taken.
    wait_for(lambda: db.execute("SELECT bool_and(lease_until < now() - interval '2 seconds') FROM skiplock.jobs"
                                " WHERE id = ANY(%s)", (slow,)).fetchone()[0], timeout=30, what="A's leases long expired")
    wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.workers WHERE pid = %s", (b.pid,)).fetchone()[0],
             timeout=30, what="worker B registered")
    time.sleep(1.0)  # B polls every 0.2 s: several chances to (wrongly) take a slot
    assert db.execute("SELECT count(*) FROM public.executions WHERE worker_pid = %s", (b.pid,)).fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND status = 'pending'", (quick,)).fetchone()[0] == 4
    # The reaper rescues A's leases: the slots come back and B drains the queue.
    assert q.reap(db)["pending"] == 2
    wait_for(lambda: done(db, "lim") == 6, timeout=60, what="every job completed by B")
    assert sampler.stop() <= 2
    assert db.execute("SELECT count(DISTINCT job_id) FROM public.executions WHERE worker_pid = %s", (b.pid,)).fetchone()[0] == 6
    assert workers.stop(b)[0] == 0


def test_a_kind_concurrency_declared_in_code(db, dsn, workers):
    with db.transaction():
        q.enqueue_many(db, [q.NewJob("scarce", {"sleep": 0.1}, queue=name) for name in ("a", "b") for _ in range(5)])
    sampler = Sampler(dsn, "kind", "scarce")
    sampler.start()
    workers.start("--concurrency", "4")
    workers.start("--concurrency", "4")
    wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = 'scarce' AND status = 'completed'")
             .fetchone()[0] == 10, timeout=60, what="10 scarce jobs completed")
    assert sampler.stop() <= 1
    assert [(r["kind"], r["concurrency"]) for r in limits.kind_limits(db)] == [("scarce", 1)]
