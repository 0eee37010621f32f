"""One model per collection cycle (console/web/cycle.py, issue 31 item 2): every viewer of the
overview, its fragments, its API and /metrics shares the model built from the newest cycle;
a new sample, an alert evaluation, an audited operator action or a silence makes the next one;
an unchanged poll is answered 304; a crowd arriving at a new cycle waits for one build, or is
shown the previous model while it builds; a model of one database is never shown for another."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from console.web import cycle
from console.web import overview as overview_module
from tests.oncall_data import store_history
from tests.web_fixtures import CSRF

VERDICT = "/overview/_verdict"


@pytest.fixture(autouse=True)
def one_bucket(monkeypatch):
    """One clock bucket for the whole test: only what the test changes makes a new model."""
    monkeypatch.setattr(cycle, "BUCKET_SECONDS", 10**9)


def builds(web_app) -> int:
    found = web_app.extensions["skiplock"].extra.get("cycle_cache")
    return found.built if found else 0


def test_every_viewer_of_one_generation_shares_one_model(conn, web_app, client_as):
    store_history(conn, failing="billing")
    answers = []
    for role in ("viewer", "operator", "admin"):
        client = client_as(role)
        answers.append(client.get("/api/v1/overview").get_json())
        assert client.get(VERDICT).status_code == 200
    assert builds(web_app) == 2  # the API's model and the verdict fragment's, once each
    assert answers[0] == answers[1] == answers[2]
    assert answers[0]["verdict"]["state"] == "failing"


def test_a_new_sample_an_audited_action_an_evaluation_or_a_silence_makes_a_new_model(conn, web_app, client_as):
    store_history(conn, failing=None)
    client = client_as("operator")
    assert client.get("/api/v1/overview").get_json()["verdict"]["state"] == "healthy"
    assert client.get("/api/v1/overview").get_json()["verdict"]["state"] == "healthy"
    assert builds(web_app) == 1

    # newer samples: the failing queue is shown at once
    store_history(conn, failing="billing", minutes=5, now=datetime.now(UTC) + timedelta(seconds=1))
    data = client.get("/api/v1/overview").get_json()
    assert data["verdict"]["state"] == "failing" and builds(web_app) == 2

    # an operator's pause (audited) shows in the queues table on the next request
    resp = client.post("/api/v1/queues/billing/pause", json={"reason": "INC-7: the payment provider is down"},
                       headers={"X-CSRF-Token": CSRF})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    rows = {r["queue"]: r for r in client.get("/api/v1/overview").get_json()["queues"]}
    assert rows["billing"]["paused"] is True and builds(web_app) == 3

    # an alert evaluation (stamps the alerts it keeps)
    conn.execute("""INSERT INTO skiplock.alerts (rule, labels, state, state_since, value, evaluated_at, fired_at)
                    VALUES ('workers_zero', '{}', 'firing', now(), 0, now() + interval '2 seconds', now())""")
    alerts = client.get("/api/v1/overview").get_json()["alerts"]
    assert [a["rule"] for a in alerts] == ["workers_zero"] and builds(web_app) == 4

    # a silence made by a script, not through the console
    conn.execute("""INSERT INTO skiplock.alert_silences (rule, labels, ends_at, created_by, reason)
                    VALUES ('workers_zero', '{}', now() + interval '1 hour', 'script', 'deploy window')""")
    alerts = client.get("/api/v1/overview").get_json()["alerts"]
    assert alerts[0]["silence"] and builds(web_app) == 5


def test_an_unchanged_poll_is_answered_304_with_no_body_and_a_changed_one_200(conn, client_as):
    store_history(conn, failing=None)
    viewer = client_as("viewer")
    first = viewer.get(VERDICT, headers={"HX-Request": "true", "X-Skiplock-Poll": "1"})
    tag = first.headers["ETag"]
    assert first.status_code == 200 and 'data-verdict="healthy"' in first.get_data(as_text=True)
    again = viewer.get(VERDICT, headers={"HX-Request": "true", "X-Skiplock-Poll": "1", "If-None-Match": tag})
    assert again.status_code == 304 and again.get_data() == b"" and again.headers["ETag"] == tag
    # pages are still never stored by the browser: the script keeps the tag (static/skiplock.js)
    assert again.headers["Cache-Control"] == "no-store"
    # the tag is this viewer's: another's request with it gets the whole fragment
    other = client_as("operator").get(VERDICT, headers={"HX-Request": "true", "If-None-Match": tag})
    assert other.status_code == 200 and other.headers["ETag"] != tag
    # the JSON twin too
    api = viewer.get("/api/v1/overview")
    assert viewer.get("/api/v1/overview", headers={"If-None-Match": api.headers["ETag"]}).status_code == 304

    store_history(conn, failing="billing", minutes=5, now=datetime.now(UTC) + timedelta(seconds=1))
    changed = viewer.get(VERDICT, headers={"HX-Request": "true", "X-Skiplock-Poll": "1", "If-None-Match": tag})
    assert changed.status_code == 200 and changed.headers["ETag"] != tag
    assert 'data-verdict="failing"' in changed.get_data(as_text=True)


def renders(web_app) -> int:
    found = web_app.extensions["skiplock"].extra.get("render_cache")
    return found.built if found else 0


def test_a_polled_fragment_is_rendered_once_per_generation_for_every_viewer_of_a_role(conn, web_app, client_as):
    """Sixty viewers' first polls after a new cycle all send the same fragment: it is rendered
    once per generation, URL and role, and each viewer still gets its own ETag."""
    store_history(conn, failing=None)
    poll = {"HX-Request": "true", "X-Skiplock-Poll": "1"}
    viewers = [client_as("viewer") for _ in range(3)]
    answers = [v.get(VERDICT, headers=poll) for v in viewers]
    assert {a.status_code for a in answers} == {200}
    assert len({a.get_data() for a in answers}) == 1 and 'data-verdict="healthy"' in answers[0].get_data(as_text=True)
    assert len({a.headers["ETag"] for a in answers}) == 3
    assert renders(web_app) == 1
    # another role renders its own; another URL (a window) too
    assert client_as("operator").get(VERDICT, headers=poll).get_data() == answers[0].get_data()
    assert viewers[0].get(VERDICT + "?window=6h", headers=poll).status_code == 200
    assert renders(web_app) == 3

    # a new generation: rendered again, once, and what it says is the new model's
    store_history(conn, failing="billing", minutes=5, now=datetime.now(UTC) + timedelta(seconds=1))
    changed = [v.get(VERDICT, headers={**poll, "If-None-Match": a.headers["ETag"]})
               for v, a in zip(viewers, answers, strict=True)]
    assert {c.status_code for c in changed} == {200}
    assert all('data-verdict="failing"' in c.get_data(as_text=True) for c in changed)
    assert renders(web_app) == 4


@pytest.fixture
def small_pool(web_settings):
    return {**web_settings, "database.pool_size": 2}


def test_a_crowd_arriving_at_a_new_cycle_waits_for_one_build(small_pool, conn, client_as, monkeypatch):
    from console.web import create_app

    store_history(conn, failing="billing")
    web_app = create_app(small_pool)
    built = overview_module.overview_data
    started = threading.Event()

    def slow_build(*args, **kwargs):
        started.set()
        # Longer than web.db_wait (2 s): with a pool of 2, eight viewers that held their
        # connections while waiting for this build would be answered 503.
        time.sleep(2.5)
        return built(*args, **kwargs)

    monkeypatch.setattr(overview_module, "overview_data", slow_build)
    viewer = client_as("viewer")
    clients = []
    for _ in range(8):
        client = web_app.test_client()
        with client.session_transaction() as session:
            session["csrf"], session["sid"] = CSRF, viewer.session_token
        clients.append(client)
    answers: list = [None] * len(clients)

    def ask(n: int) -> None:
        resp = clients[n].get("/api/v1/overview")
        answers[n] = resp.get_json() if resp.status_code == 200 else resp.status_code

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a viewer never got the overview"
    try:
        assert started.is_set()
        assert builds(web_app) == 1
        assert all(isinstance(a, dict) and a["verdict"]["state"] == "failing" for a in answers), answers
    finally:
        web_app.extensions["skiplock"].close()


def test_metrics_read_the_newest_cycle_once_per_generation(conn, web_app, client_as):
    store_history(conn, failing="billing", minutes=2)
    conn.execute("INSERT INTO skiplock.collection_runs (started_at, finished_at, duration_ms) "
                 "SELECT max(collected_at), max(collected_at), 1 FROM skiplock.samples")
    client = client_as(None)  # development mode: /metrics is open
    bodies = [client.get("/metrics") for _ in range(3)]
    assert all(b.status_code == 200 for b in bodies), bodies[0].get_data(as_text=True)[:300]
    assert bodies[0].get_data() == bodies[1].get_data() == bodies[2].get_data()
    assert b'skiplock_queue_depth{' in bodies[0].get_data()
    assert builds(web_app) == 2  # the samples of the one database, and the body


# --- the cache itself -------------------------------------------------------------------------

def generation(n: int, database: str = "main") -> cycle.Generation:
    return cycle.Generation(database, False, (n,))


def test_while_the_next_model_builds_the_previous_one_is_shown():
    cache = cycle.CycleCache()
    assert cache.get(("overview",), generation(1), lambda: "cycle 1") == ("cycle 1", generation(1))
    release = threading.Event()
    building = threading.Event()

    def slow() -> str:
        building.set()
        assert release.wait(10)
        return "cycle 2"

    result: list = []
    builder = threading.Thread(target=lambda: result.append(cache.get(("overview",), generation(2), slow)))
    builder.start()
    assert building.wait(10)
    # a viewer arriving meanwhile: the previous model, with the generation it shows (its ETag)
    assert cache.get(("overview",), generation(2), lambda: pytest.fail("built twice")) == ("cycle 1", generation(1))
    release.set()
    builder.join(10)
    assert result == [("cycle 2", generation(2))]
    assert cache.get(("overview",), generation(2), lambda: pytest.fail("built twice")) == ("cycle 2", generation(2))
    assert cache.built == 2


def test_a_model_of_one_database_is_never_shown_for_another():
    cache = cycle.CycleCache()
    cache.get(("overview",), generation(1, "eu"), lambda: "eu's model")
    release = threading.Event()
    thread = threading.Thread(target=cache.get, args=(("overview",), generation(1, "us"),
                                                      lambda: release.wait(10) and "us's model"))
    thread.start()
    time.sleep(0.1)
    # us's first model is building: a second viewer of us waits for it, never gets eu's
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(cache.get(("overview",), generation(1, "us"),
                                                                   lambda: "built by the waiter")))
    waiter.start()
    time.sleep(0.1)
    release.set()
    thread.join(10)
    waiter.join(10)
    assert got == [("us's model", generation(1, "us"))]
    assert cache.get(("overview",), generation(1, "eu"), lambda: "again") == ("eu's model", generation(1, "eu"))


def test_a_model_with_a_failed_panel_or_a_failed_build_is_not_kept():
    cache = cycle.CycleCache()
    assert cache.get(("x",), generation(1), lambda: "timed out", keep=lambda v: False)[0] == "timed out"
    assert cache.get(("x",), generation(1), lambda: "fine")[0] == "fine"  # tried again
    with pytest.raises(RuntimeError):
        cache.get(("y",), generation(1), lambda: (_ for _ in ()).throw(RuntimeError("lost the connection")))
    assert cache.get(("y",), generation(1), lambda: "answered")[0] == "answered"


def test_a_previous_model_older_than_the_stale_limit_is_not_shown():
    cache = cycle.CycleCache(stale_seconds=0.05)
    cache.get(("overview",), generation(1), lambda: "cycle 1")
    time.sleep(0.1)
    release = threading.Event()
    thread = threading.Thread(target=cache.get, args=(("overview",), generation(2),
                                                      lambda: release.wait(10) and "cycle 2"))
    thread.start()
    time.sleep(0.1)
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(cache.get(("overview",), generation(2), lambda: "own")))
    waiter.start()
    time.sleep(0.1)
    release.set()
    thread.join(10)
    waiter.join(10)
    assert got == [("cycle 2", generation(2))]
