"""Signal scenarios on a queue Skiplock did not create: the same alert rules (queue age,
dead-letter growth) fire per external queue, with its `system` and `external` labels, and their
"look here" opens that queue's own page (/external/<name>?queue=...) showing the offending jobs.

A real PGQueuer schema (its Queries.install, what `pgq install` runs) in the scenario's database, watched as 'legacy' with
`actions = true`; its own consumer holds failing `flaky` jobs as dead letters
(tests/external_workers.py). The dead-letter alert resolves once the console replays them
through PGQueuer's own requeue and its consumer runs them (the switch is off by then).
"""

from __future__ import annotations

import sys
import time

import pytest

from console.config import ExternalQueue
from console.db import connect
from console.external import actions as xa
from console.external import adapter_for
from tests import external_workers as w
from tests.collector_helpers import eventually
from tests.scenarios import SCALED, scenario_console
from tests.test_external_actions import RUNS
from tests.test_external_libraries import kill, run_async, scalar, start, url, wait_for_line

pytestmark = [pytest.mark.slow, pytest.mark.scenario]
SOURCE = '\n[[external_queues]]\nname = "legacy"\nsystem = "pgqueuer"\nactions = true\nstuck_after = "2s"\n'


def advisor_signals(console):
    """The advisor's ext-queue-signals result for 'legacy', as its stored run computes it."""
    from console.advisor.external import run_sources

    return next(r for r in run_sources(console.conn, console.config)
                if r.id == "ext-queue-signals" and r.external == "legacy")


@pytest.fixture
def pgqueuer(dsn, tmp_path):

    run_async(w.pgqueuer_install(url(dsn)))
    with connect(dsn) as c:
        c.execute(RUNS)
    switch = tmp_path / "switch"
    switch.write_text("on")
    consumer = start([sys.executable, "-m", "tests.external_workers", "pgqueuer-consume", url(dsn)],
                     {"FLAKY_SWITCH": str(switch)})
    try:
        wait_for_line(consumer, "CONSUMING")
        yield switch
    finally:
        kill(consumer)


def test_dead_letter_growth_of_an_external_queue(dsn, tmp_path, pgqueuer):
    """... and the look-here is the external queue's, not the new error group of Skiplock's own
    queue of the same name (one dead letter of Skiplock's queue 'flaky' failed a second ago)."""
    from datetime import timedelta

    from tests.maintenance_data import add_failed

    with scenario_console(dsn, tmp_path, name="external dead letters", extra_config=SOURCE) as console:
        add_failed(console.conn, 1, queue="flaky", fingerprint="SkiplockError: a group of its own",
                   age=timedelta(seconds=1))
        console.tick()
        run_async(w.pgqueuer_produce(url(dsn), ["flaky"] * 6))
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM pgqueuer WHERE status = 'failed'") == 6, timeout=30)
        since = time.monotonic()  # six within the 20 s window: 1080 an hour, over 720
        keys = [str(r[0]) for r in connect(dsn).execute("SELECT id FROM pgqueuer WHERE status = 'failed'").fetchall()]
        labels = {"system": "pgqueuer", "external": "legacy", "queue": "flaky"}
        fired = console.expect_firing("dead_letter_growth", since=since, labels=labels, mention="Queue flaky gains",
                                      offender=lambda html: all(f'data-key="{k}"' in html for k in keys),
                                      scenario="external dead letters")
        assert fired.labels == labels
        link = console.api(f"/api/v1/alerts/{fired.id}")["alert"]["look_here"][0]["path"]
        assert link == "/external/legacy?queue=flaky#external-dead-letters"
        check = advisor_signals(console)  # the advisor judges the same queue by the same rule
        assert (check.status, check.data["breaches"]) == ("warn", [{"rule": "dead_letter_growth", "status": "warn"}])
        assert any(e.startswith("queue flaky: dead letters per hour") for e in check.evidence), check.evidence
        pgqueuer.unlink()  # the cause is fixed: the console replays them the library's way
        adapter = adapter_for(ExternalQueue(name="legacy", system="pgqueuer", actions=True))
        with connect(dsn) as c:
            p = xa.preview(c, adapter, xa.Selection(queue="flaky"))
            op = xa.start(c, c, adapter, "replay", xa.Selection(queue="flaky"), actor="alice", reason="INC-5 fixed",
                          preview=p.bound())
        assert xa.run(dsn, op, {"legacy": adapter})["done"] == 6
        console.expect_resolved(fired, budget=30)
        eventually(lambda: scalar(dsn, "SELECT count(*) FROM runs") == 6, timeout=30)  # its consumer ran them


def test_an_external_queue_nobody_consumes(dsn, tmp_path, pgqueuer):
    with scenario_console(dsn, tmp_path, name="external stalled queue", extra_config=SOURCE) as console:
        console.tick()
        t0 = time.monotonic()
        run_async(w.pgqueuer_produce(url(dsn), ["nobody-listens"] * 2))  # no entrypoint of that name
        labels = {"system": "pgqueuer", "external": "legacy", "queue": "nobody-listens"}
        fired = console.expect_firing("queue_age", since=t0 + SCALED["queue_age"]["threshold"], labels=labels,
                                      mention="nobody-listens",
                                      offender='data-external-queue="legacy/nobody-listens"',
                                      scenario="external stalled queue")
        assert console.api(f"/api/v1/alerts/{fired.id}")["alert"]["look_here"][0]["path"] == \
            "/external/legacy?queue=nobody-listens#external-source"
        check = advisor_signals(console)
        assert check.status == "fail" and {"rule": "queue_age", "status": "fail"} in check.data["breaches"], check
