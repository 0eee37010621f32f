"""The alert-rule form's `when` guard (issue 17): saved from the page it is the rule's guard,
shown again when editing; a bad or half-filled guard is refused with a message naming it."""

from __future__ import annotations

import html as html_lib

from tests.web_fixtures import CSRF

BASE = {"csrf_token": CSRF, "name": "mail_age", "metric": "queue_age_seconds", "labels": "queue=mail", "op": ">",
        "threshold": "60", "for": "1m", "severity": "warning", "enabled_present": "1", "enabled": "on",
        "reason": "guard test"}  # saving a rule needs a reason (docs/maintenance.md)


def rules(admin) -> dict:
    return {r["name"]: r for r in admin.get("/api/v1/alerts/rules").get_json()["rules"]}


def test_a_rule_saved_from_the_form_with_a_guard_has_it(client_as, conn):
    admin = client_as("admin")
    resp = admin.post("/alerts/rules", data={**BASE, "when_metric": "queue_depth", "when_labels": "queue=mail",
                                             "when_op": ">", "when_threshold": "0"})
    assert resp.status_code == 302
    rule = rules(admin)["mail_age"]
    assert rule["when"] == {"metric": "queue_depth", "labels": {"queue": "mail"}, "op": ">", "threshold": 0.0}
    assert "while queue_depth" in rule["condition"]
    [(stored,)] = conn.execute("SELECT guard FROM skiplock.alert_rules WHERE name = 'mail_age'").fetchall()
    assert stored["metric"] == "queue_depth"
    # editing shows the guard again, so saving the form unchanged keeps it
    page = html_lib.unescape(admin.get("/alerts/rules?edit=mail_age").get_data(as_text=True))
    guard = page.split('name="when_metric"')[1].split("</fieldset>")[0]
    assert "<option selected>queue_depth</option>" in guard
    assert 'name="when_labels" value="queue=mail"' in guard and 'name="when_threshold" value="0.0"' in guard
    # and a rule saved without one has none
    assert admin.post("/alerts/rules", data={**BASE, "name": "plain", "when_metric": ""}).status_code == 302
    assert rules(admin)["plain"].get("when") is None


def test_a_bad_guard_is_refused_with_a_message(client_as, conn):
    admin = client_as("admin")
    for guard, message in [
        ({"when_metric": "queue_depth", "when_op": ">", "when_threshold": "lots"}, "when.threshold"),
        ({"when_metric": "nope", "when_op": ">", "when_threshold": "1"}, "when: unknown metric 'nope'"),
        ({"when_metric": "queue_depth", "when_labels": "host=a", "when_op": ">", "when_threshold": "1"},
         "when.labels: metric queue_depth has no label 'host'"),
        ({"when_metric": "queue_depth", "when_op": ">", "when_threshold": ""}, "when: threshold is required"),
        ({"when_metric": "", "when_op": ">", "when_threshold": "5"}, "when: metric is required"),
    ]:
        resp = admin.post("/alerts/rules", data={**BASE, **guard})
        page = html_lib.unescape(resp.get_data(as_text=True))
        assert resp.status_code == 400, guard
        error = page.split('class="error" role="alert">')[1].split("</p>")[0]
        assert "alert rule 'mail_age' (from the UI)" in error and message in error, (guard, error)
        assert f'value="{guard["when_threshold"]}"' in page  # the form keeps what was typed
    assert conn.execute("SELECT count(*) FROM skiplock.alert_rules").fetchone()[0] == 0
