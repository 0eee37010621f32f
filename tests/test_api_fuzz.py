"""The JSON API against its own OpenAPI document, fuzzed with Schemathesis.

A live console (tests/web_fixtures.py `live_server`, a real port) over a database seeded with
jobs in every state, dead letters in three error groups, a bulk operation, a firing and an
acknowledged alert, a silence, a webhook destination (a local receiver) with deliveries, a paused
queue, maintenance runs and audit rows. Every operation of /api/v1/openapi.json runs through the
examples, coverage and fuzzing phases (positive and negative data) with an operator API token,
and each answer must be: no 5xx, a documented status, a body matching the documented schema,
and the documented content type.

Deep and wide JSON (issue 26): every JSON request body, and every parameter or form field whose
schema says it holds JSON (`format: json`: payload filters, the `after` cursor, a selection),
also gets hostile shapes, in two ways. The fuzzing draws them (`json_text()` is the strategy of
the `json` format; the schema's `flatmap_case` hook swaps a JSON body, or one of its members,
for a value from `hostile_json()`), and `test_deep_and_wide_json_keeps_the_contract` sends every
one of a fixed set (lists and objects nested 102 to 3,000 deep, 20,000 keys, 50,000 items, 200
keys each nested 60 deep) to every such input, so none is left to the draw: a value nested past
jsonbounds' limits must be a 400 naming it, and nothing may be a 5xx or undocumented.

Bounded: at most MAX_EXAMPLES generated cases per operation in the fuzzing phase (coverage adds
its own boundary cases), derandomized, no shrinking, no deadline: 62 s of fuzzing for 39 operations on this
2-core machine under a load of 12 (docs/security.md); the hostile values are under 400 kB a
body (MAX_CONTENT_LENGTH is 1 MB) and 32 kB a query string (the server's request line).
Run: `.venv/bin/python -m pytest tests/test_api_fuzz.py`.

Excluded from fuzzing (EXCLUDED below, each with its reason); they keep their own tests.
"""

from __future__ import annotations

import base64
import json
import re
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
from hypothesis import strategies as st  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.core import NOT_SET  # noqa: E402
from schemathesis.specs.openapi import unregister_string_format  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from console.config import load_config  # noqa: E402
from console.jsonbounds import MAX_BODY_DEPTH, MAX_DEPTH  # noqa: E402

MAX_EXAMPLES = 5


# --- deep and wide JSON ------------------------------------------------------------------------

def nested(depth: int, kind: type = list, leaf: object = 1) -> object:
    """`depth` levels of lists ([[[1]]]) or objects ({"a": {"a": 1}}), built without recursion."""
    value = leaf
    for _ in range(depth):
        value = [value] if kind is list else {"a": value}
    return value


def nested_text(depth: int, kind: type = list) -> str:
    """The same as JSON text, for depths no Python json.dumps would reach."""
    return "[" * depth + "1" + "]" * depth if kind is list else '{"a":' * depth + "1" + "}" * depth


# (what it is, the value, how deep it is): for bodies and body members (sent as JSON by the client).
HOSTILE_VALUES: list[tuple[str, object, int]] = [
    ("lists nested 102 deep", nested(MAX_BODY_DEPTH + 1), MAX_BODY_DEPTH + 1),
    ("objects nested 150 deep", nested(150, dict), 150),
    ("lists nested 300 deep", nested(300), 300),
    ("an object of 20,000 keys", {f"k{i}": i for i in range(20_000)}, 1),
    ("a list of 50,000 numbers", list(range(50_000)), 1),
    ("200 keys, each objects nested 60 deep", {f"k{i}": nested(60, dict) for i in range(200)}, 61),
]
# ... and as text, for parameters and form fields that hold JSON (32 kB or less once encoded).
HOSTILE_TEXT: list[tuple[str, str, int]] = [
    ("objects nested 101 deep", nested_text(MAX_DEPTH + 1, dict), MAX_DEPTH + 1),
    ("lists nested 102 deep", nested_text(MAX_BODY_DEPTH + 1), MAX_BODY_DEPTH + 1),
    ("objects nested 1,000 deep", nested_text(1000, dict), 1000),
    ("lists nested 3,000 deep", nested_text(3000), 3000),
    ("an object of 2,000 keys", json.dumps({f"k{i}": i for i in range(2000)}), 1),
    ("50 keys, each objects nested 40 deep", json.dumps({f"k{i}": nested(40, dict) for i in range(50)}), 41),
]


def hostile_json() -> st.SearchStrategy:
    """Deep or wide JSON values, of every shape above and between (for the fuzzing's draws)."""
    depth = st.integers(min_value=MAX_DEPTH - 2, max_value=300)
    width = st.integers(min_value=100, max_value=20_000)
    return st.one_of(
        st.sampled_from([value for _, value, _ in HOSTILE_VALUES]),
        depth.map(nested), depth.map(lambda d: nested(d, dict)),
        width.map(lambda w: {f"k{i}": i for i in range(w)}), width.map(lambda w: list(range(w))),
    )


def json_text() -> st.SearchStrategy[str]:
    """The `json` string format: ordinary small JSON objects (so filters and cursors are also
    exercised as meant), and deep or wide JSON text."""
    small = st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=8), st.booleans()),
                            max_size=4).map(json.dumps)
    deep = st.integers(min_value=MAX_DEPTH - 2, max_value=3000)
    return st.one_of(small, st.sampled_from([text for _, text, _ in HOSTILE_TEXT]),
                     deep.map(nested_text), deep.map(lambda d: nested_text(d, dict)))


def base64url(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.fixture
def json_format():
    """The `json` and `json-base64url` string formats generate json_text() (encoded for the
    second) while a test runs (a global registry)."""
    schemathesis.openapi.format("json", json_text())
    schemathesis.openapi.format("json-base64url", json_text().map(base64url))
    yield
    unregister_string_format("json")
    unregister_string_format("json-base64url")


def swap_in_hostile_json(context, case):
    """The schema's flatmap_case hook: a JSON body drawn by Schemathesis, or one of its members,
    may become deep or wide JSON (form bodies and the rest keep what was drawn)."""
    if case.media_type != "application/json" or case.body is NOT_SET:
        return st.just(case)

    def whole(value):
        hostile = case.derive(keep_auth=True)
        object.__setattr__(hostile, "body", value)
        return hostile

    def member(pair):
        key, value = pair
        hostile = case.derive(keep_auth=True)
        object.__setattr__(hostile, "body", {**case.body, key: value})
        return hostile

    options = [st.just(case), hostile_json().map(whole)]
    if isinstance(case.body, dict) and case.body:
        options.append(st.tuples(st.sampled_from(sorted(case.body)), hostile_json()).map(member))
    return st.one_of(options)

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
def api_schema(fuzz_api, json_format):
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
    loaded.hook("flatmap_case")(swap_in_hostile_json)
    return loaded


CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, content_type_conformance]
SETTINGS = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=False,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking: bounded time


# Every operation's examples, coverage and fuzzing phases in one test: 224-229 s with two suites
# side by side (load 9-15), and past the suite's 300 s once (R1, 2026-12-04), with each request
# still answered. Its own deadline, so a hang still fails.
@pytest.mark.timeout(900)
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


JSON_FORMATS = ("json", "json-base64url")


def json_inputs(document: dict) -> list[tuple[str, str, str, str]]:
    """(method, path, where, name) of every input that takes JSON: a JSON body ("body", ""),
    and each parameter or form field whose schema has `format: json` or `json-base64url`
    (`where` is then "query", "form", or "query-base64url")."""
    found = []
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            if (method.upper(), path) in EXCLUDED:
                continue
            content = (op.get("requestBody") or {}).get("content", {})
            if "application/json" in content:
                found.append((method.upper(), path, "body", ""))
            for param in op.get("parameters", []):
                fmt = param.get("schema", {}).get("format")
                if fmt in JSON_FORMATS:
                    where = param["in"] + ("-base64url" if fmt == "json-base64url" else "")
                    found.append((method.upper(), path, where, param["name"]))
            form = content.get("application/x-www-form-urlencoded", {}).get("schema", {}).get("properties", {})
            found += [(method.upper(), path, "form", name) for name, schema in form.items()
                      if schema.get("format") in JSON_FORMATS]
    return found


def example_path(path: str, info: dict) -> dict:
    """Path parameters that exist in the seed, where the path names one."""
    values = {"alert_id": info["alert_id"], "op_id": 1, "job_id": info["dead"]["card"][0], "name": "billing",
              "fmt": "json", "action": "replay", "task": "reap", "silence_id": 1}
    return {name: values.get(name, "x") for name in re.findall(r"\{(\w+)\}", path)}


# How deep each JSON input may be (console/jsonbounds.py, docs/security.md "Hostile shapes").
DEPTH_LIMITS = {"body": MAX_BODY_DEPTH, "payload": MAX_DEPTH, "selection": MAX_BODY_DEPTH, "after": 1}


def test_deep_and_wide_json_keeps_the_contract(api_schema, fuzz_api, conn):
    """Every JSON input gets every hostile shape (not left to the draw): past its depth limit a
    400 naming the input; otherwise any documented answer; never a 5xx. With an admin's token,
    so the admin-only routes read their bodies instead of answering 403."""
    base, _token, info = fuzz_api
    auth = {"Authorization": f"Bearer {users_mod.create_token(conn, 'admin', 'deep-json')}"}
    document = requests.get(f"{base}/api/v1/openapi.json", headers=auth, timeout=10).json()
    inputs = json_inputs(document)
    assert {(m, p) for m, p, where, _ in inputs if where == "body"} >= {
        ("POST", "/api/v1/jobs"), ("POST", "/api/v1/alerts/silences"), ("POST", "/api/v1/alerts/rules"),
        ("POST", "/api/v1/alerts/destinations"), ("PUT", "/api/v1/queues/{name}/limits"),
        ("POST", "/api/v1/alerts/{alert_id}/ack")}, inputs
    assert {(p, n) for _, p, where, n in inputs if where != "body"} >= {
        ("/api/v1/jobs", "payload"), ("/api/v1/jobs", "after"), ("/api/v1/deadletters/jobs", "payload"),
        ("/api/v1/jobs/export.{fmt}", "payload"), ("/api/v1/deadletters/preview", "selection")}, inputs
    failures, sent = [], 0
    for method, path, where, name in inputs:
        operation = api_schema[path][method]
        params = example_path(path, info)
        if where == "body":
            shapes = [(what, value, depth, None) for what, value, depth in HOSTILE_VALUES]
            shapes += [(f"{what} as a member", {"reason": "deep and wide", **value} if isinstance(value, dict)
                        else {"reason": "deep and wide", "payload": value, "labels": value}, depth + 1, None)
                       for what, value, depth in HOSTILE_VALUES[:3]]
        else:
            shapes = [(what, None, depth, text) for what, text, depth in HOSTILE_TEXT]
        for what, value, depth, text in shapes:
            if where == "body":
                case = operation.Case(path_parameters=params, body=value, media_type="application/json")
            elif where == "form":
                case = operation.Case(path_parameters=params, media_type="application/x-www-form-urlencoded",
                                      body={"action": "replay", name: text})
            else:
                encoded = base64url(text) if where.endswith("-base64url") else text
                case = operation.Case(path_parameters=params, query={name: encoded})
            sent += 1
            try:
                response = case.call_and_validate(base_url=base, headers=auth, checks=CHECKS, timeout=30)
            except (Exception, BaseExceptionGroup) as exc:
                failures.append(f"{method} {path} {where} {name} with {what}: {exc}")
                continue
            limit = DEPTH_LIMITS["body" if where == "body" else name]
            named = "body" if where == "body" else name
            if depth > limit and (response.status_code != 400 or named not in response.json().get("error", "")):
                failures.append(f"{method} {path} {where} {name} with {what}: {response.status_code} "
                                f"{response.text[:200]} (not a 400 naming {named})")
    assert not failures, "\n".join(failures)
    assert sent >= 60, sent
