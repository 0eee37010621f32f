"""The overview's model stored once per cycle by the scheduler's leader (console/web/cycle_store.py,
issue 31 target 2): a web process with a stored model builds nothing and answers what it would
have built; a stored model is shown only for the marks, settings and database it was built for,
and only while it is young; its body is JSON that no data can turn into markup."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import Markup

from console import scheduler
from console.config import load_config
from console.db import connect
from console.web import cycle, cycle_store
from console.web import overview as overview_module
from console.web.database import Panel
from console.web.listing import Page
from tests.oncall_data import store_history
from tests.web_fixtures import CSRF

VERDICT = "/overview/_verdict"
FRAGMENTS = (VERDICT, "/overview/_figures", "/overview/_queues")
POLL = {"HX-Request": "true", "X-Skiplock-Poll": "1"}


@pytest.fixture(autouse=True)
def one_bucket(monkeypatch):
    """A stored model stays young for the whole test unless the test ages it."""
    monkeypatch.setattr(cycle, "BUCKET_SECONDS", 3600)


def counts(app) -> tuple[int, int]:
    """(models built, stored models read) by this app's process."""
    found = app.extensions["skiplock"].extra.get("cycle_cache")
    return (found.built, found.loaded) if found else (0, 0)


def store(conn, app, database: str | None = None) -> dict[str, float]:
    st = app.extensions["skiplock"]
    return cycle_store.refresh(conn, st.config, database or st.databases.home.name, overview_module.STORED)




def without_bucket_times(api: dict) -> dict:
    """The API's answer with each series point's time left out: the charts' buckets start at the
    build's "now" (a window back from it), which two builds a moment apart do not share."""
    for figure in api["figures"]:
        for line in figure["series"]:
            line["points"] = [value for _, value in line["points"]]
    return api


def test_a_web_process_with_a_stored_model_builds_nothing(conn, web_app, client_as):
    store_history(conn, failing="billing")
    assert list(store(conn, web_app)) == ["overview:1h"]
    viewer, operator = client_as("viewer"), client_as("operator")
    for client in (viewer, operator):
        for path in FRAGMENTS:
            assert client.get(path, headers=POLL).status_code == 200
        assert "<svg" in client.get("/overview/_figures", headers=POLL).get_data(as_text=True)  # drawn, not escaped
        assert client.get("/overview").status_code == 200
        data = client.get("/api/v1/overview").get_json()
        assert data["verdict"]["state"] == "failing"
        assert "chart" not in data["figures"][0]  # the API's model has no drawings
    assert counts(web_app) == (0, 1)  # one read of the stored model, no build, for every role


def test_a_stored_model_answers_what_the_process_would_have_built(conn, web_app, client_as, monkeypatch):
    # More queues and alerts than the overview lists: the stored model keeps only those it lists
    monkeypatch.setattr(overview_module, "OVERVIEW_ROWS", 1)
    store_history(conn, failing="billing")
    for rule in ("workers_zero", "queue_age", "dead_letter_growth"):
        conn.execute("""INSERT INTO skiplock.alerts (rule, labels, state, state_since, value, evaluated_at, fired_at)
                        VALUES (%s, '{}', 'firing', now(), 1, now(), now())""", (rule,))
    viewer = client_as("viewer")
    built_api = viewer.get("/api/v1/overview").get_json()
    built_queues = viewer.get("/overview/_queues", headers=POLL).get_data(as_text=True)
    built_verdict = viewer.get(VERDICT, headers=POLL).get_data(as_text=True)
    assert counts(web_app) == (3, 0)
    store(conn, web_app)
    stored_api = viewer.get("/api/v1/overview").get_json()
    stored_queues = viewer.get("/overview/_queues", headers=POLL).get_data(as_text=True)
    stored_verdict = viewer.get(VERDICT, headers=POLL).get_data(as_text=True)
    assert counts(web_app) == (3, 1)
    assert stored_verdict == built_verdict
    assert built_api["queues_total"] > 1 and built_api["alerts_total"] == 3  # the counts of what was left out
    assert 'data-more="2"' in stored_verdict
    assert without_bucket_times(stored_api) == without_bucket_times(built_api)
    assert stored_queues == built_queues


def test_an_unchanged_poll_of_a_stored_model_is_304_until_the_next_cycle(conn, web_app, client_as):
    store_history(conn, failing=None)
    store(conn, web_app)
    viewer = client_as("viewer")
    tag = viewer.get(VERDICT, headers=POLL).headers["ETag"]
    assert viewer.get(VERDICT, headers={**POLL, "If-None-Match": tag}).status_code == 304
    # the next cycle: new samples, and the leader stores their model
    store_history(conn, failing="billing", minutes=5, now=datetime.now(UTC) + timedelta(seconds=1))
    store(conn, web_app)
    changed = viewer.get(VERDICT, headers={**POLL, "If-None-Match": tag})
    assert changed.status_code == 200 and 'data-verdict="failing"' in changed.get_data(as_text=True)
    assert counts(web_app) == (0, 2)


def test_while_the_leader_builds_the_next_model_the_previous_one_is_shown(conn, web_app, client_as):
    store_history(conn, failing=None)
    store(conn, web_app)
    viewer = client_as("viewer")
    tag = viewer.get(VERDICT, headers=POLL).headers["ETag"]
    # a new cycle's samples, its model not stored yet: the previous model, still a 304
    store_history(conn, failing="billing", minutes=5, now=datetime.now(UTC) + timedelta(seconds=1))
    assert viewer.get(VERDICT, headers={**POLL, "If-None-Match": tag}).status_code == 304
    assert counts(web_app) == (0, 1)
    # but not once it is older than a clock bucket: then the process builds the newest
    conn.execute("UPDATE skiplock.cycle_models SET built_at = built_at - interval '2 hours'")
    fresh = viewer.get(VERDICT, headers={**POLL, "If-None-Match": tag})
    assert fresh.status_code == 200 and 'data-verdict="failing"' in fresh.get_data(as_text=True)
    assert counts(web_app) == (1, 1)


def test_a_stale_stored_model_is_not_shown_as_current(conn, web_app, client_as):
    store_history(conn, failing=None)
    store(conn, web_app)
    # the scheduler stopped an hour ago: its last model is not shown, the process builds its own
    conn.execute("UPDATE skiplock.cycle_models SET built_at = built_at - interval '2 hours'")
    viewer = client_as("viewer")
    assert viewer.get("/api/v1/overview").status_code == 200
    assert counts(web_app) == (1, 0)


def test_a_model_stored_before_a_change_is_not_shown_after_it(conn, web_app, client_as):
    store_history(conn, failing=None)
    store(conn, web_app)
    operator = client_as("operator")
    resp = operator.post("/api/v1/queues/billing/pause", json={"reason": "INC-9"}, headers={"X-CSRF-Token": CSRF})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    rows = {r["queue"]: r for r in operator.get("/api/v1/overview").get_json()["queues"]}
    assert rows["billing"]["paused"] is True
    assert counts(web_app) == (1, 0)  # the pause moved the audited mark: built here, at once


def test_a_model_stored_with_other_settings_is_not_shown(conn, web_app, client_as):
    store_history(conn, failing=None)
    # the scheduler hides another key in alert links than this web process does
    other = load_config(env={}, overrides={"web.redact_keys": "password,iban"})
    cycle_store.refresh(conn, other, web_app.extensions["skiplock"].databases.home.name, overview_module.STORED)
    assert client_as("viewer").get("/api/v1/overview").status_code == 200
    assert counts(web_app) == (1, 0)


@pytest.fixture
def second_dsn(make_database):
    return make_database()


@pytest.fixture
def web_app(request, web_settings, tmp_path, monkeypatch):
    """This module's app: over two databases (east, this test's; west, `second_dsn`) when the
    test asks for `second_dsn`."""
    from console.web import create_app

    if "second_dsn" in request.fixturenames:
        monkeypatch.delenv("DATABASE_URL", raising=False)
        path = tmp_path / "skiplock.toml"
        path.write_text('[web]\nsecret_key = "k"\nproduction = false\ndb_wait = 2.0\n'
                        f'[[databases]]\nname = "east"\ndsn = "{web_settings["database.dsn"]}"\n'
                        f'[[databases]]\nname = "west"\ndsn = "{request.getfixturevalue("second_dsn")}"\n',
                        encoding="utf-8")
        app = create_app(load_config(str(path), env={}))
    else:
        app = create_app(web_settings)
    yield app
    app.extensions["skiplock"].close()


def test_a_stored_model_of_one_database_never_serves_another(conn, second_dsn, web_app, client_as):
    now = datetime.now(UTC).replace(microsecond=0)
    # The same marks in both (the newest sample at the same instant, nothing evaluated, audited
    # or silenced) and the same stored id: only the database tells the two models apart.
    store_history(conn, failing="billing", now=now)
    with connect(second_dsn) as west:
        store_history(west, failing=None, now=now)
        assert list(store(west, web_app, "west")) == ["overview:1h"]
    store(conn, web_app, "east")
    ids = conn.execute("SELECT id FROM skiplock.cycle_models").fetchall()
    with connect(second_dsn) as west:
        assert west.execute("SELECT id FROM skiplock.cycle_models").fetchall() == ids
    viewer = client_as("viewer")
    assert viewer.get("/api/v1/overview").get_json()["verdict"]["state"] == "failing"
    assert viewer.get("/db/west/api/v1/overview").get_json()["verdict"]["state"] == "healthy"
    assert viewer.get("/db/east/api/v1/overview").get_json()["verdict"]["state"] == "failing"
    assert counts(web_app) == (0, 2)


def test_the_leader_stores_the_model_after_each_cycle(dsn, conn, client_as, web_app):
    store_history(conn, failing=None)
    s = scheduler.Scheduler(dsn, load_config(env={}))
    try:
        s.elect()
        assert s.run_job("collect") is True
        first = conn.execute("SELECT id, measured FROM skiplock.cycle_models WHERE name = 'overview:1h'").fetchone()
        assert first is not None
        assert s.run_job("collect") is True
        second = conn.execute("SELECT id, measured FROM skiplock.cycle_models WHERE name = 'overview:1h'").fetchone()
        assert second[0] > first[0] and second[1] > first[1]  # replaced, one row, after the newer cycle
        jobs = {j["job"]: j for j in scheduler.status(conn)["jobs"]}
        assert jobs["cycle_models"]["last_error"] is None
    finally:
        s.close()
    assert client_as("viewer").get("/api/v1/overview").status_code == 200
    assert counts(web_app) == (0, 1)


def test_the_body_is_json_that_no_data_turns_into_markup():
    model = {
        "figures": Panel(True, [{"chart": Markup("<svg/>"), "at": datetime(2026, 12, 4, tzinfo=UTC)}]),
        "alerts": Panel(True, [{"labels": {"__t": "markup", "v": "<script>alert(1)</script>"}}]),
        "shown": Page(rows=[{"queue": "a"}], total=3, page=1, limit=1, overall=3),
        "odd": {1: "an int key"},
    }
    back = cycle_store.decode(cycle_store.encode(model))
    assert back == model
    label = back["alerts"].data[0]["labels"]
    assert label == {"__t": "markup", "v": "<script>alert(1)</script>"}
    assert not isinstance(label["v"], Markup)
    assert isinstance(back["figures"].data[0]["chart"], Markup)
    with pytest.raises(TypeError):
        cycle_store.encode({"x": object()})
    with pytest.raises(ValueError):
        cycle_store.decode('{"__t": "pickle", "v": "..."}')


def test_people_signing_in_make_no_new_model(conn, web_app, client_as):
    store_history(conn, failing=None)
    store(conn, web_app)
    viewer = client_as("viewer")
    tag = viewer.get(VERDICT, headers=POLL).headers["ETag"]
    # an incident's crowd signs in: each sign-in is audited, and changes nothing a model shows
    conn.execute("INSERT INTO skiplock.audit_log (actor, action, target) VALUES ('oncall07', 'login', 'user:oncall07')")
    assert viewer.get(VERDICT, headers={**POLL, "If-None-Match": tag}).status_code == 304
    assert counts(web_app) == (0, 1)
