"""On-call ergonomics (issue 17) through the test client: the read-only console over every
unsafe route of the URL map, search by job id / queue / error text, idle queues that stay
listed, and overview panels that agree with the verdict and with the alert rules in force."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import pytest

from console import queue as q
from console import samples
from console import users as users_mod
from console.alerts.rules import save_rule
from console.maintenance import archive_completed
from console.samples import Sample
from tests.maintenance_data import add_completed
from tests.oncall_data import make_dead_letters, store_history
from tests.test_security_matrix import _url
from tests.web_fixtures import CSRF

UNSAFE = ("POST", "PUT", "PATCH", "DELETE")
STILL_OPEN = {"auth.login", "auth.logout"}


# --- read-only mode -------------------------------------------------------------------------

@pytest.fixture
def read_only_settings(web_settings):
    web_settings["web.read_only"] = True
    return web_settings


def every_unsafe_route(app) -> list[tuple[str, str, str]]:
    """(method, path, endpoint) for every unsafe method of every rule, present and future."""
    return sorted((method, _url(rule), rule.endpoint) for rule in app.url_map.iter_rules()
                  for method in sorted(set(rule.methods or ()) & set(UNSAFE)))


def test_read_only_refuses_every_unsafe_route_but_sign_in_and_out(read_only_settings, web_app, client_as, conn):
    make_dead_letters(conn, smtp=1, card=1)
    token = users_mod.create_token(conn, "admin", "ro-mode")
    routes = every_unsafe_route(web_app)
    assert len(routes) >= 30
    audit_before = conn.execute("SELECT count(*) FROM skiplock.audit_log").fetchone()[0]
    wrong = []
    for method, path, endpoint in routes:
        if endpoint in STILL_OPEN:
            continue
        for who, client, headers in (("admin session", client_as("admin"), {"X-CSRF-Token": CSRF}),
                                     ("admin token", client_as(None), {"Authorization": f"Bearer {token}"})):
            response = client.open(path, method=method, headers=headers)
            body = response.get_data(as_text=True)
            if response.status_code != 403 or "the console is read-only" not in body:
                wrong.append(f"{who} {method} {path}: {response.status_code} {body[:120]!r}")
    assert wrong == []
    assert conn.execute("SELECT count(*) FROM skiplock.audit_log").fetchone()[0] == audit_before
    # the API says so as JSON
    refused = client_as(None).post("/api/v1/queues/mail/pause", headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == 403 and "read-only" in refused.get_json()["error"]
    # signing out still works, and reading too
    admin = client_as("admin")
    assert admin.get("/queues").status_code == 200
    assert admin.post("/logout", data={"csrf_token": CSRF}).status_code == 302


def test_read_only_hides_every_action_and_says_so(read_only_settings, client_as, conn):
    dead = make_dead_letters(conn, smtp=1, card=1, queue_card="billing")
    admin = client_as("admin")
    for url in ("/queues", "/deadletters", f"/jobs/{dead['card'][0]}", "/overview", "/alerts"):
        html = admin.get(url).get_data(as_text=True)
        assert "Read-only console" in html, url
        main = html.split("<main>", 1)[1]
        assert not re.search(r'<form[^>]*method="post"|hx-post=', main, flags=re.I), url
    assert admin.get(f"/api/v1/jobs/{dead['card'][0]}").get_json()["allowed"] == []


def test_without_read_only_the_actions_are_there(client_as, conn):
    make_dead_letters(conn, smtp=1, card=1, queue_card="billing")
    html = client_as("operator").get("/queues").get_data(as_text=True)
    assert "Read-only console" not in html and ">Pause</button>" in html


# --- search ---------------------------------------------------------------------------------

def test_search_jumps_to_a_job_a_queue_or_an_error_group(client_as, conn):
    dead = make_dead_letters(conn, smtp=2, card=1, queue_smtp="mail", queue_card="billing")
    viewer = client_as("viewer")
    job = dead["card"][0]
    for text in (str(job), f"%23{job}"):  # 42 or #42
        found = viewer.get(f"/search?q={text}")
        assert found.status_code == 302 and found.headers["Location"].endswith(f"/jobs/{job}"), text
    assert viewer.get("/search?q=mail").headers["Location"].endswith("/queues/mail")
    group = viewer.get("/search?q=card declined")
    assert group.status_code == 302 and "/deadletters/jobs?fingerprint=" in group.headers["Location"]
    followed = viewer.get(group.headers["Location"]).get_data(as_text=True)
    assert "card declined" in followed
    # several matches: a page that lists them by type
    listed = viewer.get("/search?q=i")  # queue "billing", queue "mail", and both error texts
    html = listed.get_data(as_text=True)
    assert listed.status_code == 200 and "<h2>Queues</h2>" in html and "<h2>Error groups</h2>" in html
    api = viewer.get("/api/v1/search?q=i").get_json()
    assert api["target"] is None
    assert {m["label"] for m in api["matches"] if m["type"] == "queue"} == {"billing", "mail"}
    assert viewer.get("/api/v1/search?q=nothing-like-this").get_json() == {
        "q": "nothing-like-this", "target": None, "matches": [], "unavailable": [], "window": 50_000}
    assert "Nothing matches" in viewer.get("/search?q=nothing-like-this").get_data(as_text=True)


def test_search_finds_an_archived_job(client_as, conn):
    [old] = add_completed(conn, 1, age=timedelta(hours=3))
    archive_completed(conn, older_than=timedelta(hours=1), batch_size=10, pause_ms=0)
    assert conn.execute("SELECT count(*) FROM skiplock.jobs WHERE id = %s", (old,)).fetchone()[0] == 0
    data = client_as("viewer").get(f"/api/v1/search?q={old}").get_json()
    assert data["target"].endswith(f"/jobs/{old}") and "archive" in data["matches"][0]["detail"]


def test_search_input_is_checked(client_as):
    viewer = client_as("viewer")
    for url in ("/search?q=" + "x" * 201, "/api/v1/search?q=" + "x" * 201):
        response = viewer.get(url)
        assert response.status_code == 400, url
        assert "q: at most 200 characters (got 201)" in response.get_data(as_text=True), url
    for url in ("/api/v1/search", "/api/v1/search?q=%20%20"):  # blank: nothing to find
        assert viewer.get(url).get_json()["matches"] == [], url
    assert viewer.get("/search").status_code == 200
    assert viewer.get("/search?q=" + "x" * 200).status_code == 200
    assert "at most 200 characters" in viewer.get("/api/v1/search?q=" + "x" * 201).get_json()["error"]
    assert viewer.get("/api/v1/search?q=" + "9" * 30).status_code == 200  # not a bigint: not a job id
    assert client_as(None).get("/api/v1/search?q=1").status_code == 401


# --- idle queues ----------------------------------------------------------------------------

def test_an_emptied_queue_stays_listed_with_idle_since(client_as, conn):
    now = datetime.now(UTC)
    busy_until = now - timedelta(hours=2)
    for minutes in range(30, -1, -10):  # "reports" had work until two hours ago, then none
        at = busy_until - timedelta(minutes=minutes)
        samples.store(conn, [Sample("queue_depth", {"queue": "reports", "state": "eligible"}, 5)], at=at)
    for minutes in (60, 30, 1):
        samples.store(conn, [Sample("queue_depth", {"queue": "reports", "state": "eligible"}, 0)],
                      at=now - timedelta(minutes=minutes))
    q.enqueue(conn, "charge_card", {}, queue="billing")
    viewer = client_as("viewer")
    rows = {r["queue"]: r for r in viewer.get("/api/v1/queues").get_json()["queues"]}
    assert set(rows) == {"billing", "reports"}
    assert rows["reports"]["idle"] is True and rows["billing"]["idle"] is False
    since = datetime.fromisoformat(rows["reports"]["idle_since"])
    assert abs((since - busy_until).total_seconds()) < 2
    html = viewer.get("/queues").get_data(as_text=True)
    assert re.search(r'data-idle-since="[^"]+">idle since <time[^>]*>2 h ago</time>', html)
    assert viewer.get("/queues/reports").status_code == 200  # its page too, though it has no job
    overview = {r["queue"]: r for r in viewer.get("/api/v1/overview").get_json()["queues"]}
    assert overview["reports"]["idle"] is True
    assert datetime.fromisoformat(overview["reports"]["idle_since"]) == since
    assert "idle since" in viewer.get("/overview/_queues").get_data(as_text=True)


# --- verdict and panels agree ---------------------------------------------------------------

class Panels(HTMLParser):
    """Every element of the overview with data-figure / data-queue / data-panel, and its class."""

    def __init__(self):
        super().__init__()
        self.found: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class") or ""
        if "data-figure" in a:
            self.found[a["data-figure"]] = cls
        if "data-queue" in a:
            self.found[f"queue:{a['data-queue']}"] = cls
        if "data-panel" in a:
            self.found[a["data-panel"]] = cls


def panels_of(html: str) -> dict[str, str]:
    parser = Panels()
    parser.feed(html)
    return parser.found


def check_agreement(client) -> dict:
    data = client.get("/api/v1/overview").get_json()
    panels = panels_of(client.get("/overview").get_data(as_text=True))
    orphans = []
    for why in data["verdict"]["why"]:
        cls = panels.get(why["panel"])
        if cls is None:
            orphans.append(f"{why['text']!r}: no panel {why['panel']!r} on the overview")
        elif why["panel"].startswith(("queue:",)) or why["panel"] in {f["key"] for f in data["figures"]}:
            if why["level"] not in cls.split():
                orphans.append(f"{why['text']!r}: panel {why['panel']!r} is {cls!r}, not {why['level']}")
    assert orphans == []
    assert data["verdict"]["reasons"] == [w["text"] for w in data["verdict"]["why"]]
    return data


def age_samples(conn, ages: dict[str, float]) -> None:
    rows = [Sample("queue_age_seconds", {"queue": name}, age) for name, age in ages.items()]
    rows += [Sample("queue_depth", {"queue": name, "state": "eligible"}, 3) for name in ages]
    rows += [Sample("workers_live", {}, 2), Sample("throughput", {"outcome": "completed"}, 5.0)]
    samples.store(conn, rows)


def test_a_queue_age_rule_at_30_s_colours_the_panel_and_its_text(client_as, conn):
    save_rule(conn, {"name": "queue_age", "metric": "queue_age_seconds", "op": ">", "threshold": 30, "for": "30s",
                     "severity": "critical", "summary": "queue {queue} waits {value}s"}, actor="test")
    viewer = client_as("viewer")
    age_samples(conn, {"calm": 20, "slow": 28})
    data = check_agreement(viewer)
    fig = next(f for f in data["figures"] if f["key"] == "age")
    # amber from 27 s (30 s less the 10 % hysteresis, where a firing alert would resolve), red past 30 s
    assert fig["level"] == "warn" and fig["note"] == "amber at 27 s · red at 30 s (alert rules)"
    assert data["verdict"]["state"] == "degraded"
    assert [w["panel"] for w in data["verdict"]["why"]] == ["age"]
    html = viewer.get("/overview").get_data(as_text=True)
    assert "red at 30 s" in html and "red at 5 min" not in html
    rows = {r["queue"]: r["level"] for r in data["queues"]}
    assert rows == {"calm": "good", "slow": "warn"}

    age_samples(conn, {"calm": 20, "slow": 45})
    data = check_agreement(viewer)
    assert next(f for f in data["figures"] if f["key"] == "age")["level"] == "bad"
    assert data["verdict"]["state"] == "failing"
    assert data["verdict"]["why"][0] == {"text": "queue slow: the oldest job has waited 45 s", "level": "bad", "panel": "age"}


def test_the_default_rules_colour_a_failing_history_and_every_reason_has_its_panel(client_as, conn):
    store_history(conn, failing="billing", minutes=5)
    samples.store(conn, [Sample("table_dead_tuples", {"table": "jobs"}, 421),
                         Sample("table_autovacuum_threshold", {"table": "jobs"}, 50),
                         Sample("table_dead_ratio", {"table": "jobs"}, 0.9),
                         Sample("table_autovacuum_behind", {"table": "jobs"}, 0),
                         Sample("stuck_leases", {"queue": "mail"}, 2)])
    data = check_agreement(client_as("viewer"))
    panels = {w["panel"] for w in data["verdict"]["why"]}
    assert {"age", "failures", "dead_letters", "queue:mail"} <= panels
    assert "dead_tuples" not in panels  # 421 dead rows with vacuum keeping up is not news
    assert not any("dead rows" in r for r in data["verdict"]["reasons"])
    assert next(f for f in data["figures"] if f["key"] == "dead_tuples")["level"] == "good"
