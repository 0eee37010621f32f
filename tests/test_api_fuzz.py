"""The JSON API against its own OpenAPI document, fuzzed with Schemathesis.

A live console (tests/web_fixtures.py `live_server`, a real port) over a database seeded with
jobs in every state, dead letters in three error groups, a bulk operation, a firing and an
acknowledged alert, a silence, a webhook destination (a local receiver) with deliveries, a paused
queue, maintenance runs and audit rows. Every operation of /api/v1/openapi.json runs through the
examples, coverage and fuzzing phases (positive and negative data) with an operator API token,
and each answer must be: no 5xx, a documented status, a body matching the documented schema,
and the documented content type.

Bounded: at most MAX_EXAMPLES generated cases per operation in the fuzzing phase (coverage adds
its own boundary cases), derandomized, no shrinking, no deadline: 62 s of fuzzing for 39 operations on this
2-core machine under a load of 12 (docs/security.md).
Run: `.venv/bin/python -m pytest tests/test_api_fuzz.py`.

Excluded from fuzzing (EXCLUDED below, each with its reason); they keep their own tests.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import requests

from console import audit, samples
from console import queue as q
from console import users as users_mod
from console.alerts import evaluate as ev
from console.alerts import outbox
from console.alerts import rules as r
from console.maintenance import actions as maint_actions
from console.samples import Sample
from tests.alert_receiver import Receiver
from tests.maintenance_data import add_completed, add_failed
from tests.oncall_data import make_dead_letters, store_history

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from console.config import load_config  # noqa: E402

MAX_EXAMPLES = 5

# (method, path): why the fuzzer must not call it.
EXCLUDED: dict[tuple[str, str], str] = {
    ("POST", "/api/v1/deadletters/operations"):
        "starts a bulk replay/purge in a background thread: a fuzzed {\"all\": true} purge would empty the dead "
        "letters the rest of the run reads, and its thread would outlive the test's database. The seed calls it "
        "once (a one-job replay); tests/test_web_deadletters.py tests it.",
}


def seed(conn, receiver_url: str) -> dict:
    """Data in every shape the API can answer with."""
    store_history(conn, minutes=30)
    dead = make_dead_letters(conn)
    add_failed(conn, 4, queue="default", kind="doomed")
    add_completed(conn, 5)
    for i in range(3):
        q.enqueue(conn, "report", {"n": i}, queue="default")
    q.enqueue(conn, "later", {"n": 9}, queue="default", run_at=None)
    q.enqueue(conn, "work", {"n": 1}, queue="slow")
    q.claim(conn, "fuzz-worker:1", queues=["slow"], limit=1, lease=600)
    maint_actions.reap(conn, actor="fuzz-seed", reason="seed", batch_size=100)

    dest = r.save_destination(conn, {"name": "oncall", "url": receiver_url}, actor="admin",
                              config=load_config(overrides=ALLOW_LOOPBACK))
    rule = r.parse_rule({"name": "queue_age", "metric": "queue_age_seconds", "op": ">", "threshold": 100,
                         "for": "0s"})
    rules = r.RuleSet(rules={"queue_age": rule}, destinations={"oncall": dest})
    now = conn.execute("SELECT now()").fetchone()[0]
    samples.store(conn, [Sample("queue_age_seconds", {"queue": "mail"}, 500, now),
                         Sample("queue_age_seconds", {"queue": "billing"}, 700, now)])
    ev.evaluate(conn, rules, ev.AlertSettings(), now=now)
    sender = outbox.Sender(conn, lambda: {"oncall": dest}, ev.AlertSettings())
    sender.run_once()
    alert_id = conn.execute("SELECT id FROM skiplock.alerts WHERE labels->>'queue' = 'mail'").fetchone()[0]
    ev.acknowledge(conn, alert_id, actor="operator", note="looking")
    ev.silence(conn, rule="queue_age", labels={"queue": "billing"}, duration=timedelta(hours=1),
               reason="known", actor="operator", ruleset=rules)
    audit.record(conn, actor="fuzz-seed", action="seed", target="db", detail={"why": "fuzz"})
    return {"dead": dead, "alert_id": alert_id}


ALLOW_LOOPBACK = {"alerts.allow_private_destinations": True}  # the receiver is on loopback


@pytest.fixture
def web_settings(web_settings):
    return {**web_settings, **ALLOW_LOOPBACK}


@pytest.fixture
def fuzz_api(live_server, conn, personas):
    """(base URL, operator token) of a live console over seeded data."""
    with Receiver(default=200) as receiver:
        info = seed(conn, receiver.url)
        token = users_mod.create_token(conn, "operator", "fuzz")
        auth = {"Authorization": f"Bearer {token}"}
        # One real bulk operation through the API, so operations have a row to show.
        started = requests.post(f"{live_server}/api/v1/deadletters/operations", headers=auth, timeout=10,
                                data={"action": "replay", "ids": info["dead"]["card"][:1], "reason": "seed"})
        assert started.status_code == 201, started.text
        op = started.json()["id"]
        deadline = time.monotonic() + 10
        while requests.get(f"{live_server}/api/v1/deadletters/operations/{op}", headers=auth,
                           timeout=10).json()["active"]:
            assert time.monotonic() < deadline, "the seed replay did not finish"
            time.sleep(0.05)
        requests.post(f"{live_server}/api/v1/queues/billing/pause", headers=auth, data={"reason": "seed"}, timeout=10)
        yield live_server, token, info


@pytest.fixture
def api_schema(fuzz_api):
    base, token, _ = fuzz_api
    config = SchemathesisConfig.from_dict({
        "headers": {"Authorization": f"Bearer {token}"},
        "phases": {"examples": {"enabled": True}, "coverage": {"enabled": True}, "fuzzing": {"enabled": True},
                   "stateful": {"enabled": False}},
        "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "deterministic": True, "no-shrink": True},
    })
    loaded = schemathesis.openapi.from_url(f"{base}/api/v1/openapi.json", config=config,
                                           headers={"Authorization": f"Bearer {token}"}, timeout=10)
    for method, path in EXCLUDED:
        loaded = loaded.exclude(method=method, path=path)
    return loaded


CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, content_type_conformance]
SETTINGS = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=False,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking: bounded time


def test_every_operation_keeps_its_contract(api_schema, fuzz_api):
    # Schemathesis's own per-operation tests (examples, coverage and fuzzing phases), run here
    # one after the other: its pytest plugin (`from_fixture`) cannot name subtests under pytest 9.2.
    from schemathesis.pytest.lazy import get_all_tests

    base, token, _ = fuzz_api

    def check(case):
        case.call_and_validate(base_url=base, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS,
                               timeout=30)

    failures, ran = [], []
    for result in get_all_tests(schema=api_schema, test_func=check, settings=SETTINGS, given_kwargs=None):
        try:
            operation, test = result.ok()
        except Exception as exc:  # the document itself is wrong for this operation
            failures.append(f"schema error: {exc}")
            continue
        ran.append(operation.label)
        began = time.monotonic()
        try:
            test()
        except (Exception, BaseExceptionGroup) as exc:
            failures.append(f"{operation.label}:\n{exc}")
        print(f"{operation.label}: {time.monotonic() - began:.1f} s")
    assert not failures, "\n\n".join(failures)
    assert len(ran) >= 30, ran
