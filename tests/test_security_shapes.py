"""Issue 26, class 2: hostile shape, not only hostile text.

Python's json recurses once per nested level and raises RecursionError (a 500) near 1000, so
a deep value used to break every page that showed it. Now (console.jsonbounds):
- every JSON input has a depth limit and answers 400 (the CLI exits 2, enqueue from Python
  raises a ValueError) past it: payloads, request bodies of every API route, payload filters,
  page cursors, selections, the config file;
- a stored value of any shape (written by another client, or before these limits) never
  breaks a page, an API answer or an export: rendering and redaction are iterative and
  bounded (depth, items, string length), and the reader turns a value deeper than
  READ_DEPTH into a marker;
- wide values (100,000 keys, a 10 MB string) are shown in part on pages, whole in the API.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import re

import pytest
from click.testing import CliRunner

from console import audit
from console import queue as q
from console.cli import main
from console.config import ConfigError, load_config
from console.jsonbounds import MAX_BODY_DEPTH, MAX_DEPTH, READ_DEPTH, TOO_DEEP_TO_READ
from tests.web_fixtures import CSRF

H = {"X-CSRF-Token": CSRF}


def nested(depth: int, leaf=None, key: str | None = None):
    """`depth` levels: lists, or objects under `key` (iteratively: this helper must not recurse)."""
    value = {"token": "SEKRET", "n": 1} if leaf is None else leaf
    for _ in range(depth - 1):
        value = {key: value} if key else [value]
    return value


def nested_text(depth: int) -> str:
    return "[" * depth + "]" * depth


def store_raw(conn, payload_text: str, *, status: str = "failed", queue: str = "deep") -> int:
    """A job as another client (or an older version) could have written it: straight SQL."""
    return conn.execute(
        "INSERT INTO skiplock.jobs (queue, kind, payload, status, attempts, max_attempts, last_error, "
        "error_fingerprint, finished_at) VALUES (%s, 'k', %s::jsonb, %s, 1, 1, 'ValueError: boom', "
        "'ValueError: boom', CASE WHEN %s = 'failed' THEN now() END) RETURNING id",
        (queue, payload_text, status, status)).fetchone()[0]


# --- inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 500, 990, 5000])
def test_enqueue_from_python_refuses_a_payload_deeper_than_the_limit(conn, depth):
    with pytest.raises(ValueError, match=rf"payload: nested deeper than {MAX_DEPTH} levels"):
        q.enqueue(conn, "k", nested(depth))
    with pytest.raises(ValueError, match="nested deeper"):
        q.enqueue_many(conn, [q.NewJob("k", nested(depth))])
    with pytest.raises(ValueError, match="nested deeper"):  # the COPY path of large batches
        q.enqueue_many(conn, [q.NewJob("k", {})] * (q.COPY_THRESHOLD - 1) + [q.NewJob("k", nested(depth))])
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 0
    q.enqueue(conn, "k", nested(MAX_DEPTH))  # the limit itself is accepted
    q.enqueue(conn, "k", nested(MAX_DEPTH, key="a"))


def test_the_cli_refuses_a_deep_payload_with_a_message(dsn):
    result = CliRunner().invoke(main, ["--dsn", dsn, "enqueue", "k", nested_text(500)])
    assert result.exit_code == 2 and f"PAYLOAD: JSON nested deeper than {MAX_DEPTH} levels" in result.output


def test_the_enqueue_api_and_form_refuse_a_deep_payload_with_a_400(client_as, conn):
    q.enqueue(conn, "k", {}, queue="deep")  # the queue page exists
    operator = client_as("operator")
    for depth in (MAX_DEPTH + 1, 500):
        r = operator.post("/api/v1/jobs", json={"kind": "k", "reason": "deep payload test", "payload": nested(depth)},
                          headers=H)
        assert r.status_code == 400 and "nested deeper" in r.get_json()["error"], (depth, r.get_json())
    form = operator.post("/queues/deep/enqueue", data={"csrf_token": CSRF, "kind": "k", "reason": "deep payload test",
                                                       "payload": nested_text(600)})
    assert form.status_code == 400 and "payload: JSON nested deeper" in form.get_data(as_text=True)
    ok = operator.post("/api/v1/jobs", json={"kind": "k", "reason": "deep payload test", "payload": nested(MAX_DEPTH)},
                       headers=H)
    assert ok.status_code == 201
    assert conn.execute("SELECT count(*) FROM skiplock.jobs").fetchone()[0] == 2


def _unsafe_api_routes(app):
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/api/"):
            for method in sorted(set(rule.methods or ()) & {"POST", "PUT", "PATCH", "DELETE"}):
                path = re.sub(r"<(\w+:)?\w+>", "1", rule.rule)
                yield method, path


def test_every_json_body_deeper_than_the_limit_is_a_400_on_every_api_route(web_app, client_as, conn):
    admin = client_as("admin")
    body = nested_text(MAX_BODY_DEPTH + 1)
    routes = list(_unsafe_api_routes(web_app))
    assert len(routes) >= 20
    wrong = []
    for method, path in routes:
        for text in (body, "[" * 990 + "]" * 990, '{"a": ' + nested_text(5000) + "}"):
            r = admin.open(path, method=method, data=text, content_type="application/json", headers=H)
            if r.status_code != 400 or "body: JSON nested deeper" not in r.get_json()["error"]:
                wrong.append((method, path, r.status_code, r.get_data(as_text=True)[:120]))
    assert wrong == []
    # at the limit, the body is parsed and the route answers about its content instead
    r = admin.post("/api/v1/alerts/silences", json={"rule": "queue_age", "duration": "1h", "reason": "deep body test",
                                                    "labels": nested(MAX_BODY_DEPTH - 1, key="a")}, headers=H)
    assert r.status_code == 400 and "nested deeper" not in r.get_json()["error"]


@pytest.mark.parametrize("url", ["/jobs", "/api/v1/jobs", "/jobs/_count", "/jobs/export.csv", "/api/v1/jobs/export.json",
                                 "/deadletters/jobs", "/api/v1/deadletters/jobs"])
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 600])
def test_a_payload_filter_deeper_than_the_limit_is_a_400(client_as, url, depth):
    text = json.dumps({"a": 1})[:-1] + ', "b": ' + nested_text(depth - 1) + "}"
    r = client_as("operator").get(url, query_string={"payload": text})
    assert r.status_code == 400, (url, r.status_code)
    message = r.get_data(as_text=True)
    # the dead letters' filters stop at 500 characters: a deeper one is refused for its length first
    assert "payload: JSON nested deeper" in message or (depth > 200 and "payload: longer than" in message), url


def test_a_page_cursor_or_a_selection_with_a_deep_shape_is_a_400(client_as):
    cursor = base64.urlsafe_b64encode(nested_text(990).encode()).decode().rstrip("=")
    for url in ("/jobs", "/api/v1/jobs"):
        r = client_as("viewer").get(url, query_string={"after": cursor})
        assert r.status_code == 400 and "after: not a page cursor" in r.get_data(as_text=True)
    selection = '{"payload": ' + '{"a":' * 700 + "1" + "}" * 701
    for url in ("/deadletters/preview", "/api/v1/deadletters/preview"):
        r = client_as("operator").post(url, data={"csrf_token": CSRF, "action": "replay", "selection": selection})
        assert r.status_code == 400 and "selection: JSON nested deeper" in r.get_data(as_text=True), (url, r.status_code)
        r = client_as("operator").post(url, data={"csrf_token": CSRF, "action": "replay",
                                                  "selection": json.dumps({"payload": json.dumps(nested(200, key="a"))})})
        assert r.status_code == 400 and "payload: JSON nested deeper" in r.get_data(as_text=True), (url, r.status_code)


def test_a_config_file_nested_too_deep_is_a_config_error(tmp_path):
    path = tmp_path / "skiplock.toml"
    path.write_text("[web]\nredact_keys = 'a'\n# [[[[ comments and 'strings [[[' do not count\n"
                    f"[[alerts.rules]]\nname = 'x'\nlabels = {'{a = ' * 600}1{'}' * 600}\n")
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_DEPTH} levels"):
        load_config(path, env={})
    path.write_text("[web]\nredact_keys = \"a\"\nx = " + nested_text(5000) + "\n")
    with pytest.raises(ConfigError, match="nested deeper"):
        load_config(path, env={})


# --- stored values ---------------------------------------------------------------------------


STORED_VIEWS = ["/jobs", "/jobs?state=failed", "/api/v1/jobs", "/api/v1/jobs?state=failed",
                "/jobs/{id}", "/api/v1/jobs/{id}", "/deadletters/jobs", "/api/v1/deadletters/jobs",
                "/deadletters", "/search?q={id}", "/api/v1/search?q={id}"]


@pytest.mark.parametrize("role", ["viewer", "operator"])
@pytest.mark.parametrize("depth", [300, READ_DEPTH, READ_DEPTH + 1, 990, 3000])
def test_a_stored_payload_of_any_depth_breaks_no_page_api_or_export(client_as, conn, role, depth):
    # objects under "token" (hidden from viewers at the first level) or lists; the deepest as text
    job_id = store_raw(conn, json.dumps(nested(depth, key="token" if depth == 300 else None))
                       if depth <= READ_DEPTH else '{"a": ' + nested_text(depth - 1) + "}")
    client = client_as(role)
    for url in STORED_VIEWS:
        r = client.get(url.format(id=job_id), follow_redirects=True)
        assert r.status_code == 200, (url, r.status_code, r.get_data(as_text=True)[:200])
        assert "SEKRET" not in r.get_data(as_text=True) or role == "operator", url
    for url in ("/jobs/export.csv", "/api/v1/jobs/export.csv"):
        r = client.get(url)
        assert r.status_code == 200
        rows = list(csv.DictReader(io.StringIO(r.get_data(as_text=True))))
        assert [int(row["id"]) for row in rows] == [job_id]
    for url in ("/jobs/export.json", "/api/v1/jobs/export.json"):
        r = client.get(url)
        assert r.status_code == 200
        [row] = json.loads(r.get_data(as_text=True))  # the whole document, not cut mid-stream
        assert row["id"] == job_id
    payload = client.get(f"/api/v1/jobs/{job_id}").get_json()["job"]["payload"]
    text = json.dumps(payload)
    if depth > READ_DEPTH:
        assert payload == TOO_DEEP_TO_READ or TOO_DEEP_TO_READ in text
    elif depth == 300 and role == "viewer":
        assert payload == {"token": "[redacted]"}  # hidden whole, whatever it held
    else:
        assert f"nested deeper than {MAX_DEPTH} levels: not shown" in text


def test_redaction_holds_at_every_depth_it_shows(client_as, conn):
    payload = nested(MAX_DEPTH, leaf={"token": "SEKRET", "password": "SEKRET2", "ok": 1}, key="level")
    job_id = store_raw(conn, json.dumps(payload))
    for url in (f"/jobs/{job_id}", f"/api/v1/jobs/{job_id}", "/api/v1/jobs/export.json", "/jobs/export.csv"):
        text = client_as("viewer").get(url).get_data(as_text=True)
        assert "SEKRET" not in text and "[redacted]" in text, url
        assert "SEKRET2" in client_as("operator").get(url).get_data(as_text=True), url


def test_a_deep_audit_record_or_operation_selection_breaks_no_page(client_as, conn):
    audit.record(conn, actor="operator", action="replay", target="job:1", reason="deep record test",
                 selection={"payload": nested(150, key="a")}, detail={"error": "x", "deep": nested(180)})
    for role in ("viewer", "operator"):
        for url in ("/audit", "/api/v1/audit"):
            r = client_as(role).get(url)
            assert r.status_code == 200 and "not shown" in r.get_data(as_text=True), (role, url)


def test_wide_values_are_shown_in_part_on_pages_and_whole_in_the_api(client_as, conn):
    wide = {f"k{i}": i for i in range(100_000)}
    wide["note"] = "x" * (10 * 1024 * 1024)
    job_id = q.enqueue(conn, "k", wide, queue="wide")
    for role in ("viewer", "operator"):
        page = client_as(role).get(f"/jobs/{job_id}")
        html = page.get_data(as_text=True)
        assert page.status_code == 200 and len(html) < 2_000_000, len(html)
        assert "more keys not shown" in html
        for url in ("/jobs?queue=wide", "/api/v1/jobs?queue=wide"):
            listed = client_as(role).get(url)
            assert listed.status_code == 200 and len(listed.get_data()) < 100_000  # a large payload is not listed
    whole = client_as("operator").get(f"/api/v1/jobs/{job_id}").get_json()["job"]["payload"]
    assert len(whole) == 100_001 and len(whole["note"]) == 10 * 1024 * 1024
    long_string = q.enqueue(conn, "k", {"note": "y" * (10 * 1024 * 1024)}, queue="wide")
    html = client_as("viewer").get(f"/jobs/{long_string}").get_data(as_text=True)
    assert "more characters not shown" in html and len(html) < 200_000
