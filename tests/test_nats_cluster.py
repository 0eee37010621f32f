"""A broker queue on a three-node JetStream cluster (issue 32, item 5; docs/exit-plan.md, "A
JetStream cluster"): kill -9 of the node that leads the queue's stream, under load.

The cluster runs on loopback ports (tests/nats_helpers.py `nats_cluster`); the streams have
three replicas (`[broker] replicas = 3`); a real `skiplock relay` and a real `skiplock worker
--backend nats` are given all three addresses. Jobs are enqueued through PostgreSQL (the
outbox) the whole time, each in its own committed transaction, and the handler records each
run in PostgreSQL (tests/nats_tasks.py). Both processes are made to hold their connection on
the node that is killed, and that node leads the job stream and its consumer, so the kill
takes away at once the relay's and the worker's server, the stream's leader and the
consumer's leader (with its record of what was delivered and acknowledged).

What must hold, with no restart of the relay or the worker by the test:
- every committed job runs at least once (no acknowledged publish, no job is lost);
- duplicates (runs beyond a job's first) are at most the jobs in flight at the kill, bounded
  by the worker's slots: it fetches only as many messages as it has free slots
  (`--concurrency 4 --async-concurrency 1`: 5) and frees a slot only once the server confirmed
  the ack, so at any instant at most 5 messages are delivered and not yet acknowledged, and
  only such a message can be delivered again. The relay adds none: a publish repeated after a
  lost ack carries the same Nats-Msg-Id, and the stream stores it once. (A duplicate may come
  back with delivery count 1: the new consumer leader did not know of the first delivery.
  Before the worker retried unanswered acks past the ack wait, every run had 4-5 duplicates,
  one per job in flight; with it, 0 so far.)
- the relay and the worker reconnect by themselves, and the outbox drains to zero unsent.
"""

from __future__ import annotations

import collections
import threading
import time

import psycopg
import pytest

from console import queue as q
from console.queue import broker
from tests import nats_helpers
from tests.nats_helpers import (
    Procs,
    consumer_state,
    move_leaders,
    rows,
    set_backend,
    stream_cluster,
)
from tests.workers import wait_for

nats_cluster, runs_table = nats_helpers.nats_cluster, nats_helpers.runs_table

SLOTS = 5  # the worker below: --concurrency 4 + --async-concurrency 1 (tests.nats_tasks has async handlers)


def done_counts(dsn: str) -> collections.Counter:
    return collections.Counter(j for (j,) in rows(dsn, "SELECT job_id FROM public.nats_runs WHERE what = 'done'"))


def unsent(dsn: str) -> int:
    return rows(dsn, "SELECT count(*) FROM skiplock.outbox WHERE sent_at IS NULL")[0][0]


class Producer(threading.Thread):
    """Enqueues one job per committed transaction every `every` seconds until stopped; `ids`
    holds the committed ones (with the monotonic time of their commit)."""

    def __init__(self, dsn: str, every: float = 0.01):
        super().__init__(name="producer", daemon=True)
        self.dsn, self.every = dsn, every
        self.ids: list[tuple[int, float]] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn) as conn:
                n = 0
                while not self.halt.is_set():
                    n += 1
                    job = q.enqueue(conn, "record", {"n": n}, queue="mail")
                    conn.commit()
                    self.ids.append((job, time.monotonic()))
                    self.halt.wait(self.every)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def stop(self) -> list[int]:
        self.halt.set()
        self.join(timeout=10)
        assert not self.is_alive(), "the producer did not stop"
        assert self.error is None, f"the producer failed: {self.error!r}"
        return [job for job, _ in self.ids]


@pytest.mark.slow
def test_kill_9_of_the_stream_leader_under_load_loses_no_job_and_everyone_reconnects(runs_table, nats_cluster,
                                                                                     tmp_path):
    dsn, cluster = runs_table, nats_cluster
    stream = broker.stream("mail")
    set_backend(dsn, "mail")
    procs = Procs(dsn, cluster.urls, tmp_path)
    procs.env.update(SKIPLOCK_BROKER_REPLICAS="3", SKIPLOCK_BROKER_PUBLISH_TIMEOUT="2")
    producer = Producer(dsn)
    try:
        # The victim: the node both processes are connected to. Clients shuffle the addresses
        # they are given, so the test cannot pick their node; it starts one node alone (a
        # refused address is skipped), lets the processes connect, then starts the two others.
        # Until they are up there is no JetStream (no quorum): the worker tries again.
        victim, others = cluster.names[0], cluster.names[1:]
        cluster.start(victim)
        relay = procs.relay()
        worker = procs.worker("mail", "--lease", "2", "--concurrency", "4", "--async-concurrency", "1")
        wait_for(lambda: cluster.client_node("skiplock-relay") == victim
                 and cluster.client_node("skiplock-worker") == victim, timeout=20,
                 what="the relay and the worker to connect to the only node up")
        for node in others:
            cluster.start(node)
        cluster.wait_ready()
        # The worker creates the queue's streams ([broker] replicas = 3) and its consumer.
        wait_for(lambda: _has_consumer(cluster.urls, stream), timeout=20, what="the worker's consumer on the cluster")

        producer.start()
        wait_for(lambda: len(done_counts(dsn)) >= 20, timeout=20, what="the first jobs to run on the cluster")
        for name in (stream, broker.dead_stream("mail")):  # [broker] replicas, used when the streams were created
            assert stream_cluster(cluster.urls, name)["num_replicas"] == 3
        leaders = move_leaders(cluster.urls, stream, broker.CONSUMER, to=victim)
        assert leaders == (victim, victim), f"could not move the stream's and consumer's leaders to {victim}: {leaders}"
        assert (cluster.client_node("skiplock-relay"), cluster.client_node("skiplock-worker")) == (victim, victim)
        time.sleep(1.0)  # under load on the arranged leaders

        in_flight = consumer_state(cluster.urls, stream, broker.CONSUMER)["ack_pending"]
        cluster.kill(victim)
        killed_at, killed_wall, killed_before = time.monotonic(), time.time(), len(producer.ids)
        time.sleep(3.0)  # keep enqueuing while the cluster elects new leaders (4-7 s here)
        ids = producer.stop()

        wait_for(lambda: unsent(dsn) == 0, timeout=20, what="the relay to drain the outbox after the node's loss")
        wait_for(lambda: set(done_counts(dsn)) >= set(ids), timeout=25, interval=0.3,
                 what="every committed job to run after the node's loss")
        time.sleep(2.2)  # one more ack wait: a late redelivery would show up as a duplicate now
        counts = done_counts(dsn)
        after_kill = [(job, at) for job, at in producer.ids if at > killed_at]
        # The outage as the application sees it: from the kill to the first run of a job
        # enqueued after it (relay reconnected and published, worker reconnected and fetched).
        first_run_after = rows(dsn, "SELECT extract(epoch FROM min(at)) FROM public.nats_runs WHERE job_id = ANY(%s)",
                               ([job for job, _ in after_kill],))[0][0]
        outage = float(first_run_after) - killed_wall

        missing = set(ids) - set(counts)
        duplicates = sum(n - 1 for n in counts.values())
        assert not missing, f"{len(missing)} committed job(s) never ran: {sorted(missing)[:10]}"
        assert set(counts) <= set(ids)
        # Runs beyond a job's first whose delivery count is 1 again: the new consumer leader
        # did not know of the earlier delivery (or, were the relay's de-duplication to fail,
        # a second copy of the job in the stream).
        fresh = sum(n - 1 for n in collections.Counter(j for (j,) in rows(
            dsn, "SELECT job_id FROM public.nats_runs WHERE what = 'done' AND attempt = 1")).values())
        assert duplicates <= SLOTS, (f"{duplicates} duplicate run(s), more than the {SLOTS} messages the worker "
                                     f"can hold unacknowledged (ack pending just before the kill: {in_flight})")
        assert relay.poll() is None and worker.poll() is None, "the relay or the worker died with the node"
        assert unsent(dsn) == 0
        for name in ("relay", "worker"):
            assert "nats: reconnected to" in procs.log(name), f"the {name} did not say it reconnected"
        pids = {pid for (pid,) in rows(dsn, "SELECT DISTINCT pid FROM public.nats_runs")}
        assert pids == {worker.pid}, "jobs ran in a process other than the one worker started once"

        # The killed node comes back, rejoins and catches up the stream it held.
        cluster.restart(victim)
        wait_for(lambda: all(r["current"] and not r["offline"]
                             for r in stream_cluster(cluster.urls, stream)["replicas"]),
                 timeout=20, what=f"{victim} to catch up the stream as a replica")
        print(f"\ncluster kill figures: {len(ids)} jobs ({killed_before} before the kill, {len(after_kill)} after), "
              f"{duplicates} duplicate run(s) ({fresh} with delivery count 1), ack pending before the kill {in_flight}, "
              f"first job enqueued after the kill ran {outage:.2f} s after it; "
              f"relay log: {_reconnect_lines(procs.log('relay'))}; worker log: {_reconnect_lines(procs.log('worker'))}")
    finally:
        producer.halt.set()
        procs.stop_all()


def _has_consumer(urls: str, stream: str) -> bool:
    try:
        return consumer_state(urls, stream, broker.CONSUMER)["leader"] is not None
    except Exception:  # noqa: BLE001 - not created yet, or no leader yet
        return False


def _reconnect_lines(log: str) -> list[str]:
    return [line[11:23] + " " + line.split(": ", 1)[-1] for line in log.splitlines() if "nats: " in line][:6]
