"""pgmq watched through [[external_queues]] and acted on, against the real pgmq SQL installed
from the PyPI package `pgmq` (1.1.4, pgmq.sql 1.13.0: `pgmq.install`), driven by its own
client (PGMQueue: create_queue, send, read, delete, metrics).

One database: a queue `orders` with messages that wait, one sent with a delay, two read by a
consumer that still holds them (their visibility timeout runs) and one whose consumer let its
timeout lapse. The collectors' figures are compared with pgmq's own metrics(); the console's
cancel archives a waiting message with pgmq's own archive(); and a consumer reading and
deleting messages while the console cancels all of them: each message is either processed
once or archived, never both.
"""

from __future__ import annotations

import threading
import time

import pytest

from console import external
from console.collectors import Options
from console.config import ConfigError, ExternalQueue
from console.db import connect
from console.external import actions as xa
from tests.collector_helpers import cycle
from tests.test_external_libraries import library_db, url  # noqa: F401

pytestmark = pytest.mark.slow
MQ = ExternalQueue(name="mq", system="pgmq", queue="orders", actions=True)
FIGURES = ("eligible", "scheduled", "running", "failed")


def client(dsn: str):
    from pgmq import PGMQueue

    return PGMQueue(conn_string=url(dsn), init_extension=False, pool_size=2)


@pytest.fixture
def pgmq_db(library_db):  # noqa: F811
    from pgmq.install import install_pgmq_from_sql

    dsn = library_db()
    install_pgmq_from_sql(dsn=url(dsn))  # the SQL-only install its package ships
    q = client(dsn)
    q.create_queue("orders")
    try:
        yield dsn, q
    finally:
        q.close()


def figures(report) -> dict[str, float]:
    return {s.labels["state"]: s.value for s in report.samples
            if s.metric == "queue_depth" and s.labels.get("external") == "mq"}


def test_pgmq_figures_match_its_own_metrics(pgmq_db):
    dsn, q = pgmq_db
    for i in range(5):
        q.send("orders", {"order": i})
    q.send("orders", {"order": "later"}, delay=3600)
    held = q.read("orders", vt=600, qty=2)  # a consumer holds two
    lapsed = q.read("orders", vt=1, qty=1)  # one consumer let its timeout lapse
    assert len(held) == 2 and lapsed
    time.sleep(1.2)
    with connect(dsn) as c:
        external.validate(c, external.adapter_for(MQ))

    report = cycle(dsn, Options(external=(MQ,)))

    assert report.details["external_sources"]["mq"]["error"] is None
    assert figures(report) == {"eligible": 3.0, "scheduled": 1.0, "running": 2.0, "failed": 0.0}
    metrics = q.metrics("orders")
    assert sum(figures(report).values()) == metrics.queue_length == 6  # its own count of messages in the queue
    age = next(s.value for s in report.samples if s.metric == "queue_age_seconds" and s.labels.get("external") == "mq")
    assert 0 < age <= metrics.oldest_msg_age_sec + 2
    assert not [s for s in report.samples if s.metric == "dead_letter_growth" and s.labels.get("external") == "mq"]


def test_pgmq_cancel_archives_a_waiting_message_with_its_own_function(pgmq_db):
    dsn, q = pgmq_db
    ids = [q.send("orders", {"order": i}) for i in range(3)]
    held = q.read("orders", vt=600, qty=1).msg_id  # the oldest: a consumer holds it
    adapter = external.adapter_for(MQ)
    with connect(dsn) as c:
        out = xa.cancel_jobs(c, c, adapter, [str(i) for i in ids], actor="alice", reason="duplicate orders")
        archived = [r[0] for r in c.execute("SELECT msg_id FROM pgmq.a_orders ORDER BY msg_id")]
        audit = c.execute("SELECT action, target, rows, detail->>'system' FROM skiplock.audit_log").fetchall()
    assert (out.changed, out.asked) == (2, 3) and archived == [i for i in ids if i != held]  # the held one stays
    assert audit == [("cancel", "pgmq:mq/jobs", 2, "pgmq")]
    assert not q.read("orders", vt=1, qty=10)  # pgmq itself no longer hands them out (the held one is hidden)
    for action in ("replay", "purge", "pause"):
        with pytest.raises(xa.ActionsOff, match="pgmq"):
            xa.require_action(adapter, action)


def test_pgmq_race_a_consumer_reads_while_the_console_cancels_every_message(pgmq_db):
    dsn, q = pgmq_db
    ids = sorted(q.send("orders", {"order": i}) for i in range(40))
    processed: list[int] = []
    stop = threading.Event()

    def consume():
        consumer = client(dsn)
        try:
            while not stop.is_set():
                for m in consumer.read("orders", vt=30, qty=2) or []:
                    processed.append(m.msg_id)
                    consumer.delete("orders", m.msg_id)
        finally:
            consumer.close()

    thread = threading.Thread(target=consume)
    thread.start()
    adapter = external.adapter_for(MQ)
    changed = 0
    with connect(dsn) as c:
        for chunk in (ids[i:i + 4] for i in range(0, 40, 4)):  # the console cancels in small steps meanwhile
            changed += xa.cancel_jobs(c, c, adapter, [str(i) for i in chunk], actor="alice").changed
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(processed) + changed < 40:
        time.sleep(0.1)
    stop.set()
    thread.join(timeout=30)
    archived = [r[0] for r in connect(dsn).execute("SELECT msg_id FROM pgmq.a_orders").fetchall()]
    assert len(processed) == len(set(processed)), "a message was processed twice"
    assert not set(processed) & set(archived), "a message was both processed and archived"
    assert sorted(processed + archived) == ids, "a message was lost"
    assert changed == len(archived)


def test_a_pgmq_entry_names_its_queue(tmp_path):
    from console.config import external_queues, load_config

    for body, complaint in [('system = "pgmq"', "queue is required for system 'pgmq'"),
                            ('system = "pgmq"\nqueue = "a-b"', "1-47 letters, digits or _"),
                            ('system = "pgmq"\nqueue = "orders"\ntable = "x"', "unknown key(s) table"),
                            ('system = "pgmq"\nqueue = "orders"\nschema = "other"', "schema pgmq")]:
        path = tmp_path / "skiplock.toml"
        path.write_text(f'[[external_queues]]\nname = "mq"\n{body}\n')
        with pytest.raises(ConfigError, match=complaint.replace("(", r"\(").replace(")", r"\)")):
            external_queues(load_config(path, env={}))
