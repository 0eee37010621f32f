"""Fix and replay (issue 33 item 4): an admin edits a dead letter's payload, priority, queue or
run-at, sees the diff, gives a reason, and replays it; on real PostgreSQL, through the console's
pages, the API and the CLI.

- the diff by JSON path, with the redacted keys' values never shown (old or new), and
  `[redacted]` left in place keeping the stored secret;
- the apply bound to the preview's version (409 when the job changed since), never on a
  running or pending job (409 naming why), 400 naming the field for bad input, never a 500;
- the audit row's old and new values, redacted;
- the roles over every field, on every route and face: viewers and operators get 403 for
  each field (and for fields nobody may change), admins' read-only tokens too;
- the CLI's `skiplock replay --id N --set-...` (diff, --yes, reason);
- the advisor lists the action among the operator changes that move the load.
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from console import queue as q
from console import users as users_mod
from console.advisor import causes
from console.cli import main
from console.jsonbounds import MAX_DEPTH
from console.maintenance import edit_replay as er
from console.redaction import DEFAULT_KEYS
from tests.web_fixtures import CSRF

SECRET_CARD = "4111111111111111"
SECRET_TOKEN = "tok-very-secret"
NEW_CARD = "5500000000000004"
PAYLOAD = {"customer_id": "c-17", "card_number": SECRET_CARD, "auth": {"token": SECRET_TOKEN, "scope": "charge"},
           "items": [1, 2], "note": "retry me"}
SECRETS = (SECRET_CARD, SECRET_TOKEN, NEW_CARD)
H = {"X-CSRF-Token": CSRF}
REASON = "INC-1042: customer id fixed upstream"


def failed_job(conn, payload=None, *, queue: str = "billing", kind: str = "charge_card") -> int:
    """A dead letter as a worker leaves it: enqueued, claimed, failed for good."""
    job_id = q.enqueue(conn, kind, PAYLOAD if payload is None else payload, queue=queue, max_attempts=1)
    (job,) = q.claim(conn, "w-1", queues=[queue], limit=1, lease=60)
    assert job.id == job_id
    q.fail(conn, job, ValueError(f"customer c-17 unknown (card_number={SECRET_CARD})"))
    return job_id


@pytest.fixture
def job(conn) -> int:
    q.enqueue(conn, "send_mail", {"to": "a@example.com"}, queue="mail")  # queue mail exists
    return failed_job(conn)


def row(conn, job_id: int) -> dict:
    from psycopg.rows import dict_row

    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT status, queue, priority, run_at, payload, attempts, kind, max_attempts "
                           "FROM skiplock.jobs WHERE id = %s", (job_id,)).fetchone()


def audits(conn, action: str = "edit_replay") -> list:
    return conn.execute("SELECT actor, reason, target, selection, rows, detail FROM skiplock.audit_log "
                        "WHERE action = %s ORDER BY id", (action,)).fetchall()


def edited(**changes) -> str:
    """The form's payload text: the job's payload as the form shows it, with `changes` applied."""
    shown = json.loads(er.editable_payload(PAYLOAD, DEFAULT_KEYS))
    shown.update(changes)
    return json.dumps(shown)


def assert_no_secret(text: str, where: str, secrets: tuple[str, ...] = SECRETS) -> None:
    for secret in secrets:
        assert secret not in text, f"{where} shows {secret}"


def diff_table(page: str) -> str:
    """The preview's diff table (the confirm form around it carries what the admin typed)."""
    start = page.index('id="edit-diff"')
    return page[start:page.index("</table>", start)]


# --- the diff, the redaction ---------------------------------------------------------------


def test_the_form_and_the_preview_show_the_diff_by_json_path_and_never_a_secret(client_as, conn, job):
    admin = client_as("admin")
    page = admin.get(f"/jobs/{job}/edit-replay")
    assert page.status_code == 200
    body = page.get_data(as_text=True)
    assert_no_secret(body, "the form")
    assert "[redacted]" in body and "c-17" in body and 'name="payload"' in body
    # The job page offers it to an admin only.
    assert 'id="fix-and-replay"' in admin.get(f"/jobs/{job}").get_data(as_text=True)
    for who in ("viewer", "operator"):
        assert 'id="fix-and-replay"' not in client_as(who).get(f"/jobs/{job}").get_data(as_text=True)

    payload = edited(customer_id="c-42", card_number=NEW_CARD, items=[1, 2, 3])
    payload = json.loads(payload)
    del payload["note"]
    payload["auth"]["scope"] = "refund"  # the token stays [redacted]: kept
    answer = admin.post(f"/jobs/{job}/edit-replay/preview", data={"payload": json.dumps(payload), "priority": "5",
                                                                 "queue": "mail", "run_at": ""}, headers=H)
    assert answer.status_code == 200, answer.get_data(as_text=True)[:400]
    text = answer.get_data(as_text=True)
    # The stored secrets are nowhere; the new one is only in the fields the admin typed it into.
    assert_no_secret(text, "the preview page", (SECRET_CARD, SECRET_TOKEN))
    assert_no_secret(diff_table(text), "the diff")
    assert "[redacted]" in diff_table(text) and "$.customer_id" in diff_table(text)
    assert 'id="edit-diff"' in text and 'name="version"' in text and 'name="reason"' in text
    # htmx gets the same preview as a fragment alone (the page includes it).
    fragment = admin.post(f"/jobs/{job}/edit-replay/preview", data={"payload": json.dumps(payload), "priority": "5"},
                          headers={**H, "HX-Request": "true"}).get_data(as_text=True)
    assert "<html" not in fragment and 'id="edit-replay-confirm"' in fragment
    assert_no_secret(diff_table(fragment), "the htmx diff")

    api = admin.post(f"/api/v1/jobs/{job}/edit-replay/preview",
                     json={"payload": payload, "priority": 5, "queue": "mail"}, headers=H)
    assert api.status_code == 200, api.get_data(as_text=True)
    data = api.get_json()
    assert_no_secret(api.get_data(as_text=True), "the API's preview")
    assert data["changes"] == [
        {"field": "payload", "path": "$.auth.scope", "change": "changed", "old": "charge", "new": "refund"},
        {"field": "payload", "path": "$.card_number", "change": "changed", "old": "[redacted]", "new": "[redacted]"},
        {"field": "payload", "path": "$.customer_id", "change": "changed", "old": "c-17", "new": "c-42"},
        {"field": "payload", "path": "$.items[2]", "change": "added", "old": None, "new": 3},
        {"field": "payload", "path": "$.note", "change": "removed", "old": "retry me", "new": None},
        {"field": "priority", "path": None, "change": "changed", "old": 0, "new": 5},
        {"field": "queue", "path": None, "change": "changed", "old": "billing", "new": "mail"},
    ]
    assert data["confirm"] == {"version": data["version"]} and len(data["version"]) == 64
    assert row(conn, job)["status"] == "failed" and audits(conn) == []  # a preview changes nothing


def test_an_added_subtree_is_shown_redacted_inside(client_as, conn, job):
    payload = {**PAYLOAD, "card_number": "[redacted]", "auth": {"token": "[redacted]", "scope": "charge"},
               "billing": {"password": "hunter2-secret", "note": "token=abc-secret-xyz"}}
    data = client_as("admin").post(f"/api/v1/jobs/{job}/edit-replay/preview", json={"payload": payload},
                                   headers=H).get_json()
    [change] = data["changes"]
    assert change["path"] == "$.billing" and change["change"] == "added"
    assert change["new"] == {"password": "[redacted]", "note": "token=[redacted]"}


def test_apply_replays_the_job_with_the_new_values_and_audits_old_and_new_redacted(client_as, conn, job):
    admin = client_as("admin")
    payload = edited(customer_id="c-42", card_number=NEW_CARD)
    preview = admin.post(f"/api/v1/jobs/{job}/edit-replay/preview", json={"payload": json.loads(payload),
                                                                          "priority": 3}, headers=H).get_json()
    # The page's confirm form posts the typed values back with the version and the reason.
    answer = admin.post(f"/jobs/{job}/edit-replay/apply", headers=H, data={
        "payload": payload, "priority": "3", "queue": "", "run_at": "", "version": preview["version"], "reason": REASON})
    assert answer.status_code == 303 and answer.headers["Location"].endswith(f"/jobs/{job}")
    after = row(conn, job)
    assert after["status"] == "pending" and after["attempts"] == 0 and after["priority"] == 3
    assert after["payload"] == {**PAYLOAD, "customer_id": "c-42", "card_number": NEW_CARD}  # token kept
    assert after["run_at"] <= datetime.now(UTC)
    [(actor, reason, target, selection, rows, detail)] = audits(conn)
    assert (actor, reason, target, selection, rows) == ("admin", REASON, f"job:{job}", {"ids": [job]}, 1)
    assert detail["fields"] == ["payload", "priority"]
    assert detail["old"]["priority"] == 0 and detail["new"]["priority"] == 3
    assert detail["old"]["payload"]["customer_id"] == "c-17" and detail["new"]["payload"]["customer_id"] == "c-42"
    assert detail["old"]["payload"]["card_number"] == "[redacted]" == detail["new"]["payload"]["card_number"]
    assert_no_secret(json.dumps(detail), "the audit row")
    # Every face that shows the audit row or the job, to every role.
    for who in ("viewer", "operator", "admin"):
        client = client_as(who)
        for url in ("/audit", "/api/v1/audit", f"/jobs/{job}", f"/api/v1/jobs/{job}"):
            text = client.get(url).get_data(as_text=True)
            if who == "viewer" or url.startswith("/audit") or url == "/api/v1/audit":
                assert_no_secret(text, f"{url} for {who}")
        assert "edit_replay" in client.get(f"/jobs/{job}").get_data(as_text=True)  # on the job's timeline


def test_a_preview_version_is_the_apply_version_and_a_run_at_is_honoured(conn, job):
    edit = er.parse_edit({"run_at": "2030-01-02T03:04:05Z", "queue": "mail"})
    shown = er.preview(conn, job, edit, keys=DEFAULT_KEYS)
    done = er.apply(conn, job, edit, version=shown.version, actor="script", reason=REASON, keys=DEFAULT_KEYS)
    assert done["status"] == "pending" and done["queue"] == "mail"
    after = row(conn, job)
    assert after["run_at"] == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC) and after["queue"] == "mail"
    history = conn.execute("SELECT errors -> -1 FROM skiplock.jobs WHERE id = %s", (job,)).fetchone()[0]
    assert history["event"] == "edit_replay" and history["reason"] == REASON
    assert "queue, run_at" in history["message"] and SECRET_CARD not in json.dumps(history)


def test_a_redacted_placeholder_where_the_job_has_no_value_is_refused(client_as, conn, job):
    payload = {**json.loads(edited()), "password": "[redacted]"}
    r = client_as("admin").post(f"/api/v1/jobs/{job}/edit-replay/preview", json={"payload": payload}, headers=H)
    assert r.status_code == 400 and "$.password is [redacted]" in r.get_json()["error"]


def test_a_payload_too_large_to_edit_keeps_the_other_fields_editable(client_as, conn):
    job_id = failed_job(conn, {"blob": "x" * (er.MAX_PAYLOAD_BYTES + 10)})
    admin = client_as("admin")
    form = admin.get(f"/jobs/{job_id}/edit-replay").get_data(as_text=True)
    assert 'id="edit-payload-note"' in form and "larger than 256 KiB" in form and "xxxx" not in form
    fields = {"payload": "", "priority": "3", "queue": "", "run_at": ""}  # as the form sends it
    preview = admin.post(f"/jobs/{job_id}/edit-replay/preview", data=fields, headers={**H, "HX-Request": "true"})
    assert preview.status_code == 200 and 'data-field="priority"' in preview.get_data(as_text=True)
    version = er.read_job(conn, job_id)["version"] + er.edit_digest(er.parse_edit(fields, payload_is_text=True))
    done = admin.post(f"/jobs/{job_id}/edit-replay/apply", data={**fields, "version": version, "reason": REASON},
                      headers=H)
    assert done.status_code == 303
    after = row(conn, job_id)
    assert after["priority"] == 3 and after["status"] == "pending" and len(after["payload"]["blob"]) > er.MAX_PAYLOAD_BYTES


# --- bound to the preview; never a running or pending job --------------------------------------


def test_apply_refuses_values_other_than_the_previewed_ones(client_as, conn, job):
    """A preview binds the edit too: previewing priority 4 is no key to priority 9, nor to a
    payload change sent beside it."""
    admin = client_as("admin")
    version = admin.post(f"/api/v1/jobs/{job}/edit-replay/preview", json={"priority": 4}, headers=H).get_json()["version"]
    before = row(conn, job)
    for body in ({"priority": 9}, {"priority": 4, "queue": "billing", "payload": {"order": 1}}):
        for url, send in ((f"/api/v1/jobs/{job}/edit-replay/apply", {"json": {**body, "version": version, "reason": REASON}}),
                          (f"/jobs/{job}/edit-replay/apply", {"data": {**{k: json.dumps(v) if k == "payload" else str(v)
                                                                           for k, v in body.items()},
                                                                        "version": version, "reason": REASON}})):
            r = admin.post(url, headers=H, **send)
            assert r.status_code == 409, (url, body, r.get_data(as_text=True)[:300])
            assert "not the ones previewed" in html.unescape(r.get_data(as_text=True))
    assert row(conn, job) == before and audits(conn) == []
    ok = admin.post(f"/api/v1/jobs/{job}/edit-replay/apply", json={"priority": 4, "version": version, "reason": REASON},
                    headers=H)
    assert ok.status_code == 200 and row(conn, job)["priority"] == 4


def test_apply_refuses_a_job_that_changed_since_the_preview(client_as, conn, job):
    admin = client_as("admin")
    version = admin.post(f"/api/v1/jobs/{job}/edit-replay/preview", json={"priority": 4}, headers=H).get_json()["version"]
    # Someone replays it, it runs and fails again: a failed job once more, but not the previewed one.
    conn.execute("UPDATE skiplock.jobs SET attempts = attempts + 1, finished_at = now() WHERE id = %s", (job,))
    before = row(conn, job)
    for url, send in ((f"/api/v1/jobs/{job}/edit-replay/apply", {"json": {"priority": 4, "version": version,
                                                                          "reason": REASON}}),
                      (f"/jobs/{job}/edit-replay/apply", {"data": {"priority": "4", "version": version,
                                                                   "reason": REASON}})):
        r = admin.post(url, headers=H, **send)
        assert r.status_code == 409, r.get_data(as_text=True)
        assert "changed since the preview" in r.get_data(as_text=True)
    assert row(conn, job) == before and audits(conn) == []
    # Applied once with a fresh preview; the same version a second time finds a pending job.
    fresh = admin.post(f"/api/v1/jobs/{job}/edit-replay/preview", json={"priority": 4}, headers=H).get_json()["version"]
    ok = admin.post(f"/api/v1/jobs/{job}/edit-replay/apply", json={"priority": 4, "version": fresh, "reason": REASON},
                    headers=H)
    assert ok.status_code == 200 and ok.get_json()["status"] == "pending"
    again = admin.post(f"/api/v1/jobs/{job}/edit-replay/apply", json={"priority": 4, "version": fresh, "reason": REASON},
                       headers=H)
    assert again.status_code == 409 and "is pending" in again.get_json()["error"]
    assert len(audits(conn)) == 1
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE id = %s", (job,)).fetchone()[0] == 1  # same row


def test_two_admins_applying_at_once_replay_the_job_once(dsn, conn, job, monkeypatch):
    """Both previewed the same version; bob presses Apply while alice's apply is between its
    checks and its update. The row lock makes bob wait, then he finds a pending job (409). One
    row, one audit entry, one history entry: nothing lost, nothing done twice."""
    import threading
    import time

    import psycopg

    edit = er.parse_edit({"priority": 8})
    version = er.preview(conn, job, edit, keys=DEFAULT_KEYS).version
    alice_checked, results = threading.Event(), {}
    check_state = er.check_state

    def slow_for_alice(found, version=None):
        check_state(found, version)
        if threading.current_thread().name == "alice" and version is not None:
            alice_checked.set()
            time.sleep(0.5)  # holding whatever the apply holds between its checks and its update

    monkeypatch.setattr(er, "check_state", slow_for_alice)

    def press(who: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as mine:
            try:
                results[who] = er.apply(mine, job, edit, version=version, actor=who, reason=REASON, keys=DEFAULT_KEYS)
            except er.EditConflict as exc:
                results[who] = exc

    alice = threading.Thread(target=press, args=("alice",), name="alice")
    alice.start()
    assert alice_checked.wait(10)
    bob = threading.Thread(target=press, args=("bob",), name="bob")
    bob.start()
    for t in (alice, bob):
        t.join(30)
    assert isinstance(results["alice"], dict) and results["alice"]["status"] == "pending"
    assert isinstance(results["bob"], er.EditConflict) and "is pending" in str(results["bob"])
    assert [a[0] for a in audits(conn)] == ["alice"]
    assert conn.execute("SELECT count(*), sum(jsonb_array_length(jsonb_path_query_array(errors, "
                        "'$[*] ? (@.event == \"edit_replay\")'))) FROM skiplock.jobs WHERE id = %s",
                        (job,)).fetchone() == (1, 1)


@pytest.mark.parametrize("state", ["running", "pending", "completed"])
def test_never_a_running_pending_or_completed_job(client_as, conn, state):
    job_id = q.enqueue(conn, "charge_card", PAYLOAD, queue="billing")
    if state != "pending":
        (claimed,) = q.claim(conn, "w-9", queues=["billing"], limit=1, lease=60)
        if state == "completed":
            q.complete(conn, claimed)
    # A version from when the job was failed is no key to it now.
    version = conn.execute("SELECT md5('x') || md5('y')").fetchone()[0]
    before = row(conn, job_id)
    admin = client_as("admin")
    answers = [admin.get(f"/jobs/{job_id}/edit-replay"),
               admin.post(f"/jobs/{job_id}/edit-replay/preview", data={"priority": "9"}, headers=H),
               admin.post(f"/jobs/{job_id}/edit-replay/apply", data={"priority": "9", "version": version,
                                                                       "reason": REASON}, headers=H),
               admin.post(f"/api/v1/jobs/{job_id}/edit-replay/preview", json={"priority": 9}, headers=H),
               admin.post(f"/api/v1/jobs/{job_id}/edit-replay/apply", json={"priority": 9, "version": version,
                                                                             "reason": REASON}, headers=H)]
    for r in answers:
        assert r.status_code == 409, (r.request.path, r.status_code, r.get_data(as_text=True)[:300])
        assert f"is {state}" in r.get_data(as_text=True) and "only to a failed job" in r.get_data(as_text=True)
    assert row(conn, job_id) == before and audits(conn) == []
    assert 'id="fix-and-replay"' not in admin.get(f"/jobs/{job_id}").get_data(as_text=True)


def test_no_such_job_is_a_404(client_as):
    admin = client_as("admin")
    assert admin.get("/jobs/987654321/edit-replay").status_code == 404
    assert admin.post("/api/v1/jobs/987654321/edit-replay/preview", json={"priority": 1}, headers=H).status_code == 404


# --- bad input: 400 naming the problem, never a 500 --------------------------------------------

DEEP = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
BAD_FORM = [
    ({"payload": '{"customer_id": '}, "payload: not valid JSON"),
    ({"payload": DEEP}, f"payload: JSON nested deeper than {MAX_DEPTH} levels"),
    ({"payload": '{"a": NaN}'}, "payload: NaN and Infinity are not JSON"),
    ({"run_at": "next tuesday"}, "run_at: 'next tuesday' is not a date-time"),
    ({"run_at": "99999-01-01"}, "run_at:"),
    ({"priority": "40000"}, "priority: must be a whole number between -32768 and 32767"),
    ({"priority": "high"}, "priority: must be a whole number"),
    ({"queue": "bilingg"}, "queue: there is no queue 'bilingg'"),
    ({"priority": "0"}, "nothing to change"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_FORM, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD_FORM)])
def test_bad_input_is_a_400_naming_the_problem_on_every_face(client_as, conn, job, fields, message):
    admin = client_as("admin")
    before = row(conn, job)
    version = er.read_job(conn, job)["version"] + "0" * 32  # well formed: the input is refused first
    plain = admin.post(f"/jobs/{job}/edit-replay/preview", data=fields, headers=H)
    assert plain.status_code == 400 and message in html.unescape(plain.get_data(as_text=True))
    if "payload" in fields:  # the typed text comes back in the form
        assert 'id="edit-replay-error"' in plain.get_data(as_text=True)
    htmx = admin.post(f"/jobs/{job}/edit-replay/preview", data=fields, headers={**H, "HX-Request": "true"})
    assert htmx.status_code == 400 and message in htmx.get_data(as_text=True)
    for url in (f"/jobs/{job}/edit-replay/apply", f"/api/v1/jobs/{job}/edit-replay/apply"):
        r = admin.post(url, data={**fields, "version": version, "reason": REASON}, headers=H)
        assert r.status_code == 400 and message in html.unescape(r.get_data(as_text=True)), (url, r.get_data()[:300])
    api = admin.post(f"/api/v1/jobs/{job}/edit-replay/preview", data=fields, headers=H)
    assert api.status_code == 400 and message in api.get_json()["error"]
    assert row(conn, job) == before and audits(conn) == []


@pytest.mark.parametrize(("body", "message"), [
    ({"kind": "refund_card"}, "kind: cannot be changed"),
    ({"max_attempts": 99}, "max_attempts: cannot be changed"),
    ({"worker": "x"}, "worker: unknown field"),
    ({"payload": None}, "payload: null is not a payload"),
    ({"priority": True}, "priority: must be a whole number"),
    ({"run_at": 5}, "run_at: must be an ISO 8601"),
    ({"queue": ["mail"]}, "queue: must be a string"),
    ({"payload": {"a": "\u0000"}}, "payload: PostgreSQL's jsonb cannot hold"),
])
def test_json_bodies_are_checked_field_by_field(client_as, conn, job, body, message):
    admin = client_as("admin")
    version = er.read_job(conn, job)["version"] + "0" * 32  # well formed: the body is refused first
    for url, extra in ((f"/api/v1/jobs/{job}/edit-replay/preview", {}),
                       (f"/api/v1/jobs/{job}/edit-replay/apply", {"version": version, "reason": REASON})):
        r = admin.post(url, json={**body, **extra}, headers=H)
        assert r.status_code == 400 and message in r.get_json()["error"], (url, r.get_json())
    assert audits(conn) == [] and row(conn, job)["status"] == "failed"


def test_apply_needs_the_preview_version_and_a_reason(client_as, conn, job):
    admin = client_as("admin")
    r = admin.post(f"/api/v1/jobs/{job}/edit-replay/apply", json={"priority": 2, "reason": REASON}, headers=H)
    assert r.status_code == 400 and r.get_json()["error"].startswith("version: required")
    version = er.preview(conn, job, er.Edit(priority=2), keys=DEFAULT_KEYS).version
    for reason in (None, "", "\u200b", "ok"):
        body = {"priority": 2, "version": version, **({"reason": reason} if reason is not None else {})}
        r = admin.post(f"/api/v1/jobs/{job}/edit-replay/apply", json=body, headers=H)
        assert r.status_code == 422 and "reason" in r.get_json()["error"], (reason, r.get_json())
        r = admin.post(f"/jobs/{job}/edit-replay/apply", data=body, headers=H)
        assert r.status_code == 422
    assert audits(conn) == [] and row(conn, job)["status"] == "failed"


# --- roles over every field -------------------------------------------------------------------

FIELDS = {"payload": '{"customer_id": "c-99"}', "priority": "7", "queue": "mail", "run_at": "2030-01-01T00:00:00Z",
          # never editable, by anyone: still a 403 before a 400 for those who may not edit at all
          "kind": "refund_card", "max_attempts": "50"}


@pytest.mark.parametrize("persona", ["viewer", "operator"])
@pytest.mark.parametrize("field", sorted(FIELDS))
def test_viewers_and_operators_are_refused_every_field_on_every_route(client_as, conn, job, personas, persona, field):
    version = er.read_job(conn, job)["version"]
    before, audit_before = row(conn, job), conn.execute("SELECT count(*) FROM skiplock.audit_log").fetchone()[0]
    token = users_mod.create_token(conn, persona, "roles")
    session = client_as(persona)
    form = {field: FIELDS[field], "version": version, "reason": REASON}
    body = {field: json.loads(FIELDS[field]) if field == "payload" else FIELDS[field], "version": version,
            "reason": REASON}
    answers = {
        "GET form": session.get(f"/jobs/{job}/edit-replay", query_string={field: FIELDS[field]}),
        "page preview": session.post(f"/jobs/{job}/edit-replay/preview", data=form, headers=H),
        "page preview (htmx)": session.post(f"/jobs/{job}/edit-replay/preview", data=form,
                                            headers={**H, "HX-Request": "true"}),
        "page apply": session.post(f"/jobs/{job}/edit-replay/apply", data=form, headers=H),
        "API preview (session)": session.post(f"/api/v1/jobs/{job}/edit-replay/preview", json=body, headers=H),
        "API apply (session)": session.post(f"/api/v1/jobs/{job}/edit-replay/apply", json=body, headers=H),
    }
    bearer = {"Authorization": f"Bearer {token}"}
    tokens = client_as(None)
    answers["API preview (token, JSON)"] = tokens.post(f"/api/v1/jobs/{job}/edit-replay/preview", json=body, headers=bearer)
    answers["API apply (token, JSON)"] = tokens.post(f"/api/v1/jobs/{job}/edit-replay/apply", json=body, headers=bearer)
    answers["API apply (token, form)"] = tokens.post(f"/api/v1/jobs/{job}/edit-replay/apply", data=form, headers=bearer)
    for where, r in answers.items():
        assert r.status_code == 403, f"{persona} {field} {where}: {r.status_code} {r.get_data(as_text=True)[:200]}"
        assert "this needs the admin role" in r.get_data(as_text=True), where
    assert row(conn, job) == before
    assert conn.execute("SELECT count(*) FROM skiplock.audit_log").fetchone()[0] == audit_before


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_an_admins_read_only_token_and_a_missing_csrf_token_are_refused_every_field(client_as, conn, job, personas,
                                                                                      field):
    version = er.read_job(conn, job)["version"]
    token = users_mod.create_token(conn, "admin", "read only", read_only=True)
    form = {field: FIELDS[field], "version": version, "reason": REASON}
    before = row(conn, job)
    r = client_as(None).post(f"/api/v1/jobs/{job}/edit-replay/apply", data=form,
                             headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 403 and "read-only" in r.get_json()["error"]
    for url in (f"/jobs/{job}/edit-replay/preview", f"/jobs/{job}/edit-replay/apply"):
        r = client_as("admin").post(url, data=form)  # no CSRF token
        assert r.status_code == 403 and "CSRF" in r.get_data(as_text=True)
    assert row(conn, job) == before and audits(conn) == []


@pytest.mark.parametrize("field", ["payload", "priority", "queue", "run_at"])
def test_an_admin_may_change_each_field_and_no_other(client_as, conn, job, personas, field):
    token = users_mod.create_token(conn, "admin", "fixer")
    bearer = {"Authorization": f"Bearer {token}"}
    value = json.loads(FIELDS[field]) if field == "payload" else FIELDS[field]
    api = client_as(None)
    version = api.post(f"/api/v1/jobs/{job}/edit-replay/preview", json={field: value}, headers=bearer).get_json()["version"]
    for never in ("kind", "max_attempts"):
        r = api.post(f"/api/v1/jobs/{job}/edit-replay/apply", headers=bearer,
                     json={field: value, never: FIELDS[never], "version": version, "reason": REASON})
        assert r.status_code == 400 and f"{never}: cannot be changed" in r.get_json()["error"]
    r = api.post(f"/api/v1/jobs/{job}/edit-replay/apply", json={field: value, "version": version, "reason": REASON},
                 headers=bearer)
    assert r.status_code == 200, r.get_json()
    after = row(conn, job)
    assert after["status"] == "pending" and after["kind"] == "charge_card" and after["max_attempts"] == 1
    assert r.get_json()["fields"] == [field]
    [(actor, *_rest)] = audits(conn)
    assert actor == "admin (token fixer)"


# --- the CLI ------------------------------------------------------------------------------------


def test_cli_prints_the_redacted_diff_asks_for_yes_and_a_reason(dsn, conn, job):
    runner = CliRunner()  # stdin is not a terminal
    base = ["--dsn", dsn, "replay", "--id", str(job), "--set-payload", edited(customer_id="c-42", card_number=NEW_CARD),
            "--set-priority", "6"]
    no_yes = runner.invoke(main, [*base, "--reason", REASON])
    assert no_yes.exit_code == 2 and "pass --yes to apply" in no_yes.output
    assert "$.customer_id" in no_yes.output and '"c-17" -> "c-42"' in no_yes.output and "priority" in no_yes.output
    assert_no_secret(no_yes.output, "the CLI's diff")
    no_reason = runner.invoke(main, [*base, "--yes"])
    assert no_reason.exit_code == 2 and "--reason" in no_reason.output
    dry = runner.invoke(main, [*base, "--dry-run"])
    assert dry.exit_code == 0 and "dry run: nothing changed" in dry.output
    assert row(conn, job)["status"] == "failed" and audits(conn) == []

    done = runner.invoke(main, [*base, "--yes", "--reason", REASON, "--actor", "oncall-bot"])
    assert done.exit_code == 0, done.output
    assert "edited (payload, priority) and replayed: pending" in done.output
    after = row(conn, job)
    assert after["payload"]["customer_id"] == "c-42" and after["payload"]["card_number"] == NEW_CARD
    assert after["payload"]["auth"]["token"] == SECRET_TOKEN and after["priority"] == 6
    [(actor, reason, *_rest, detail)] = audits(conn)
    assert actor.startswith("oncall-bot (cli:") and reason == REASON
    assert_no_secret(json.dumps(detail), "the CLI's audit row")
    # Now pending: refused (exit 1), nothing changed.
    again = runner.invoke(main, [*base, "--yes", "--reason", REASON])
    assert again.exit_code == 1 and "is pending" in again.output and len(audits(conn)) == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--id", "1,2", "--set-priority", "3"], "give exactly one --id"),
    (["--id", "{job}", "--queue", "billing", "--set-priority", "3"], "and no --queue"),
    (["--id", "{job}", "--set-queue", "nosuch"], "there is no queue 'nosuch'"),
    (["--id", "{job}", "--set-run-at", "soon"], "run_at: 'soon' is not a date-time"),
    (["--id", "{job}", "--set-payload", "{oops"], "payload: not valid JSON"),
    (["--id", "987654321", "--set-priority", "3"], "there is no job 987654321"),
    (["--id", "{job}", "--yes"], "--yes goes with the --set-... options"),
])
def test_cli_bad_input_is_exit_2_and_changes_nothing(dsn, conn, job, args, message):
    args = [str(job) if a == "{job}" else a for a in args]
    result = CliRunner().invoke(main, ["--dsn", dsn, "replay", *args, "--reason", REASON, "--yes"])
    assert result.exit_code == 2 and message in result.output, result.output
    assert row(conn, job)["status"] == "failed" and audits(conn) == []


# --- the advisor --------------------------------------------------------------------------------


def test_the_advisor_lists_an_edit_and_replay_among_the_operator_changes(conn, job):
    from psycopg.rows import dict_row

    assert "edit_replay" in causes.LOAD_CHANGES
    edit = er.parse_edit({"priority": 5, "queue": "mail"})
    er.apply(conn, job, edit, version=er.preview(conn, job, edit, keys=DEFAULT_KEYS).version, actor="alice",
             reason=REASON, keys=DEFAULT_KEYS)
    now = conn.execute("SELECT now()").fetchone()[0]
    with conn.cursor(row_factory=dict_row) as cur:
        found = causes.operator_changes(cur, now - timedelta(minutes=5), now + timedelta(minutes=1))
    [change] = [r for r in found if r["action"] == "edit_replay"]
    sentence = causes.change_cause(change).sentence()
    assert f"alice ran 'edit_replay' on job:{job}" in sentence and "its new queue keeps up" in sentence
