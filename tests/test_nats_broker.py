"""Broker queues against a real nats-server (issue 32; docs/exit-plan.md): the relay publishes the
outbox with JetStream's de-duplication, `skiplock worker --backend nats` runs the same handlers,
retries with backoff, dead-letters, and survives kill -9 of either process.

Each test starts a private `nats-server -js` (tests/nats_helpers.py) and real `skiplock relay` /
`skiplock worker --backend nats` processes; handlers (tests/nats_tasks.py) write a row per run
to public.nats_runs, so "one 'done' row per job" means it ran to completion exactly once.
"""

from __future__ import annotations

import collections
import time

import psycopg
import pytest

from console import queue as q
from console.queue import broker
from tests import nats_helpers
from tests.nats_helpers import (
    _run,
    delete_stream,
    kill_when_stored,
    read_all,
    rows,
    set_backend,
    stream_messages,
)
from tests.workers import wait_for

# The fixtures (a private nats-server, the runs table, the relay and worker processes).
nats_server, runs_table, procs = nats_helpers.nats_server, nats_helpers.runs_table, nats_helpers.procs


def done_counts(dsn: str) -> collections.Counter:
    return collections.Counter(job_id for (job_id,) in rows(dsn, "SELECT job_id FROM public.nats_runs WHERE what = 'done'"))


def unsent(dsn: str) -> int:
    return rows(dsn, "SELECT count(*) FROM skiplock.outbox WHERE sent_at IS NULL")[0][0]


def test_a_committed_job_is_relayed_and_run_once_and_a_rolled_back_one_never_reaches_the_broker(procs, nats_server):
    dsn = procs.env["DATABASE_URL"]
    set_backend(dsn, "mail")
    with psycopg.connect(dsn) as conn:
        rolled_back = q.enqueue(conn, "record", {"n": 1}, queue="mail")
        conn.rollback()
        committed = q.enqueue(conn, "record", {"n": 2}, queue="mail")
        async_job = q.enqueue(conn, "async_record", {"n": 3}, queue="mail")
        conn.commit()
    procs.relay()
    wait_for(lambda: unsent(dsn) == 0, timeout=20, what="the relay to mark the outbox sent")
    assert stream_messages(nats_server, broker.stream("mail")) == 2  # stored, nobody consumes yet
    procs.worker("mail")
    wait_for(lambda: sum(done_counts(dsn).values()) >= 2, timeout=20, what="the nats worker to run both jobs")
    time.sleep(1.0)  # a second run, if any, would show up now
    assert done_counts(dsn) == {committed: 1, async_job: 1}
    assert rolled_back not in done_counts(dsn)
    wait_for(lambda: stream_messages(nats_server, broker.stream("mail")) == 0, timeout=10,
             what="the work queue to drop the acknowledged messages")
    assert stream_messages(nats_server, broker.dead_stream("mail")) == 0


def test_a_job_whose_publish_is_refused_stays_in_the_outbox_until_the_broker_stores_it(procs, nats_server):
    """A row is marked sent only after the broker acknowledged it: with the queue's stream
    deleted under the running relay, the publish gets no answer and the row stays unsent; the
    relay creates the stream again and the job arrives."""
    dsn = procs.env["DATABASE_URL"]
    set_backend(dsn, "mail")
    with psycopg.connect(dsn, autocommit=True) as conn:
        q.enqueue(conn, "record", {"n": 1}, queue="mail")
    relay = procs.relay(SKIPLOCK_BROKER_PUBLISH_TIMEOUT="1")
    wait_for(lambda: unsent(dsn) == 0, timeout=20, what="the first job sent")
    delete_stream(nats_server, broker.stream("mail"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        second = q.enqueue(conn, "record", {"n": 2}, queue="mail")
    wait_for(lambda: "not acknowledged" in procs.log("relay") or unsent(dsn) == 0, timeout=20,
             what="the relay's publish of the second job")
    wait_for(lambda: stream_messages(nats_server, broker.stream("mail")) == 1, timeout=20,
             what="the second job in the re-created stream")
    assert unsent(dsn) == 0 and relay.poll() is None
    stored = read_all(nats_server, broker.stream("mail"), broker.subject("mail"))
    assert [m["data"]["id"] for m in stored] == [second]
    assert "not acknowledged" in procs.log("relay")  # it was refused once: the row waited


def test_failures_retry_with_backoff_then_land_in_the_dead_letter_stream(procs, nats_server):
    dsn = procs.env["DATABASE_URL"]
    set_backend(dsn, "mail")
    with psycopg.connect(dsn, autocommit=True) as conn:
        flaky = q.enqueue(conn, "always_fails", {"to": "x"}, queue="mail", max_attempts=3)
        fatal = q.enqueue(conn, "no_retry", {}, queue="mail", max_attempts=5)
    procs.relay()
    procs.worker("mail", SKIPLOCK_QUEUE_BACKOFF_BASE="0.6", SKIPLOCK_QUEUE_BACKOFF_CAP="10")
    wait_for(lambda: stream_messages(nats_server, broker.dead_stream("mail")) == 2, timeout=30,
             what="both jobs in the dead-letter stream")
    runs = rows(dsn, "SELECT job_id, attempt, extract(epoch FROM at) FROM public.nats_runs ORDER BY at")
    flaky_runs = [(attempt, at) for job_id, attempt, at in runs if job_id == flaky]
    assert [a for a, _ in flaky_runs] == [1, 2, 3]
    # backoff_delay(n) is base * 2^(n-1) scaled by 0.5-1.0: at least 0.3 s, then at least 0.6 s
    gaps = [float(b - a) for (_, a), (_, b) in zip(flaky_runs, flaky_runs[1:], strict=False)]
    assert gaps[0] >= 0.3 - 0.05 and gaps[1] >= 0.6 - 0.05, gaps
    assert [attempt for job_id, attempt, _ in runs if job_id == fatal] == [1]  # DoNotRetry: no retry
    dead = {m["data"]["id"]: m for m in read_all(nats_server, broker.dead_stream("mail"), broker.dead_subject("mail"))}
    assert set(dead) == {flaky, fatal}
    assert dead[flaky]["data"]["attempts"] == 3 and dead[flaky]["data"]["payload"] == {"to": "x"}
    assert "RuntimeError: attempt 3" in dead[flaky]["data"]["last_error"]
    assert dead[fatal]["data"]["error"]["error_class"] == "DoNotRetry" and dead[fatal]["data"]["attempts"] == 1
    assert stream_messages(nats_server, broker.stream("mail")) == 0


def test_in_progress_acks_keep_a_long_job_from_redelivery(procs, nats_server):
    dsn = procs.env["DATABASE_URL"]
    set_backend(dsn, "mail")
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = q.enqueue(conn, "long_heartbeat", {"sleep": 3.5}, queue="mail")
    procs.relay()
    procs.worker("mail", "--lease", "1", "--concurrency", "2")  # a redelivery would run here again
    wait_for(lambda: done_counts(dsn)[job] == 1, timeout=20, what="the long job to finish")
    started = rows(dsn, "SELECT attempt FROM public.nats_runs WHERE job_id = %s AND what = 'started'", (job,))
    assert started == [(1,)], "the job ran for 3.5 ack waits of 1 s: without heartbeats it is handed out again"


@pytest.mark.slow
def test_kill_9_of_the_relay_mid_batch_loses_nothing_and_publishes_nothing_twice(procs, nats_server):
    """The relay is killed while a batch's publishes are acknowledged but the batch is not yet
    marked sent (the stream holds more messages than the outbox says were sent); the next relay
    publishes those rows again with the same Nats-Msg-Id, and JetStream stores each once."""
    dsn = procs.env["DATABASE_URL"]
    set_backend(dsn, "mail")
    n = 600
    stream = broker.stream("mail")
    ids: list[int] = []
    caught = None
    for attempt in range(5):  # each try a fresh backlog, killed at the first message it stores
        with psycopg.connect(dsn, autocommit=True) as conn:
            ids += q.enqueue_many(conn, [q.NewJob("record", {"i": i}, queue="mail") for i in range(n)])
        before = stream_messages(nats_server, stream) or 0
        relay = procs.relay(f"relay-{attempt}", SKIPLOCK_BROKER_RELAY_BATCH_SIZE="300")
        kill_when_stored(nats_server, stream, relay, more_than=before)
        relay.wait(timeout=10)
        stored = stream_messages(nats_server, stream) or 0
        sent = len(ids) - unsent(dsn)
        if stored != sent:  # killed inside a round: published and sent disagree
            caught = (stored, sent)
            break
    assert caught, "no kill landed inside a round (between a publish and its mark) in 5 tries"
    procs.relay("relay-final")
    wait_for(lambda: unsent(dsn) == 0, timeout=30, what="the restarted relay to send the rest")
    assert stream_messages(nats_server, stream) == len(ids), f"killed at {caught} (stored, sent): duplicates or losses"
    procs.worker("mail", "--concurrency", "8", "--batch-size", "50")
    wait_for(lambda: len(done_counts(dsn)) == len(ids), timeout=40, interval=0.3, what="every job run")
    counts = done_counts(dsn)
    assert set(counts) == set(ids) and max(counts.values()) == 1


@pytest.mark.slow
def test_kill_9_of_a_nats_worker_mid_job_redelivers_it_after_the_ack_wait(procs, nats_server):
    """The killed worker's job is delivered again once the ack wait (the lease) runs out, as the
    reaper rescues an expired lease; a job with max_attempts=1 whose only run was lost becomes a
    dead letter instead, without running again."""
    dsn = procs.env["DATABASE_URL"]
    set_backend(dsn, "mail")
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = q.enqueue(conn, "slow_first", {"sleep": 60}, queue="mail")
        once = q.enqueue(conn, "slow_first", {"sleep": 60}, queue="mail", max_attempts=1)
    procs.relay()
    first = procs.worker("mail", "--lease", "2", name="first")
    wait_for(lambda: len(rows(dsn, "SELECT 1 FROM public.nats_runs WHERE what = 'started'")) == 2,
             timeout=20, what="both first attempts to start")
    first.kill()
    killed_at = time.monotonic()
    first.wait(timeout=10)
    procs.worker("mail", "--lease", "2", name="second")
    wait_for(lambda: done_counts(dsn)[job] == 1, timeout=20, what="the job's redelivery to the second worker")
    waited = time.monotonic() - killed_at
    assert rows(dsn, "SELECT attempt, what FROM public.nats_runs WHERE job_id = %s ORDER BY at", (job,)) == [
        (1, "started"), (2, "done")]
    assert waited >= 1.0, f"redelivered {waited:.1f} s after the kill: before the ack wait (2 s) ran out?"
    wait_for(lambda: stream_messages(nats_server, broker.dead_stream("mail")) == 1, timeout=20,
             what="the exhausted job in the dead-letter stream")
    dead = read_all(nats_server, broker.dead_stream("mail"), broker.dead_subject("mail"))
    assert [(m["data"]["id"], m["data"]["attempts"]) for m in dead] == [(once, 2)]
    assert "attempts exhausted" in dead[0]["data"]["last_error"]
    assert rows(dsn, "SELECT attempt, what FROM public.nats_runs WHERE job_id = %s", (once,)) == [(1, "started")]


def test_one_relay_leads_a_database_and_a_standby_takes_over_after_kill_9(procs, nats_server):
    dsn = procs.env["DATABASE_URL"]
    set_backend(dsn, "mail")
    leader = procs.relay("relay-a")
    wait_for(lambda: "leader for this database" in procs.log("relay-a"), timeout=20, what="the first relay to lead")
    standby = procs.relay("relay-b")
    wait_for(lambda: "standing by" in procs.log("relay-b"), timeout=20, what="the second relay to stand by")
    leader.kill()
    leader.wait(timeout=10)
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = q.enqueue(conn, "record", {}, queue="mail")
    wait_for(lambda: unsent(dsn) == 0, timeout=20, what="the standby to lead and relay the job")
    assert "leader for this database" in procs.log("relay-b") and standby.poll() is None
    stored = read_all(nats_server, broker.stream("mail"), broker.subject("mail"))
    assert [m["data"]["id"] for m in stored] == [job]


def test_a_stream_that_exists_with_another_replica_count_is_used_and_the_difference_logged(procs, nats_server):
    """[broker] replicas applies when the relay creates a queue's streams; a stream created
    before with another count is left as it is (changing it is the operator's call) and said."""
    dsn = procs.env["DATABASE_URL"]
    set_backend(dsn, "mail")
    with psycopg.connect(dsn, autocommit=True) as conn:
        q.enqueue(conn, "record", {"n": 1}, queue="mail")
    first = procs.relay("relay-1")  # replicas = 1, the default: a single server holds one replica
    wait_for(lambda: unsent(dsn) == 0, timeout=20, what="the streams created and the first job sent")
    first.terminate()
    first.wait(timeout=10)
    with psycopg.connect(dsn, autocommit=True) as conn:
        q.enqueue(conn, "record", {"n": 2}, queue="mail")
    procs.relay("relay-3", SKIPLOCK_BROKER_REPLICAS="3")
    wait_for(lambda: unsent(dsn) == 0, timeout=20, what="the second job sent to the existing stream")
    log = procs.log("relay-3")
    assert f"stream {broker.stream('mail')} exists with 1 replica(s), not [broker] replicas = 3" in log
    assert f"stream {broker.dead_stream('mail')} exists with 1 replica(s)" in log
    assert "exists with" not in procs.log("relay-1")
    assert stream_messages(nats_server, broker.stream("mail")) == 2


def test_a_queue_whose_streams_cannot_be_made_does_not_hold_up_the_other_queues(dsn, conn, nats_server):
    """A queue whose stream JetStream refuses (here its subject is taken by another stream) keeps
    its rows unsent; with more of them than a batch, they used to fill every read, and the other
    queues' jobs waited behind them for ever. The relay now leaves such a queue out of its reads
    for relay.BLOCKED_RETRY seconds."""
    import nats
    from nats.js import api

    from console.queue.broker import relay

    for queue in ("stuck", "fine"):
        set_backend(dsn, queue)
    stuck = [q.enqueue(conn, "a", queue="stuck") for _ in range(3)]
    fine = q.enqueue(conn, "a", queue="fine")

    async def rounds() -> list[tuple[int, int]]:
        nc = await nats.connect(nats_server)
        try:
            await nc.jetstream().add_stream(api.StreamConfig(name="squatter", subjects=[broker.subject("stuck")]))
        finally:
            await nc.close()
        relayer = relay.Relay(dsn, relay.RelaySettings(nats_url=nats_server, batch_size=2))
        pg = await relayer._connect()
        nc = await relay.connect_nats(nats_server, "test-relay")
        try:
            js = nc.jetstream(timeout=5)
            return [await relayer.relay_once(pg, js) for _ in range(3)]
        finally:
            await nc.close()
            await pg.close()

    done = _run(rounds(), timeout=60)
    assert done[0] == (2, 0)  # the two oldest rows are the stuck queue's: not sent
    assert done[1] == (1, 1)  # then the stuck queue is left out, and the fine queue's job goes
    assert done[2] == (0, 0)  # nothing else is due until the stuck queue is tried again
    sent = dict(conn.execute("SELECT id, sent_at IS NOT NULL FROM skiplock.outbox").fetchall())
    assert sent == {**{i: False for i in stuck}, fine: True}
