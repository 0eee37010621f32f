"""/metrics served by the web console: scrapeable without a session, behind a bearer token
when one is configured, and the newest stored cycle in the Prometheus text format."""

from prometheus_client.parser import text_string_to_metric_families

from console import queue as q
from tests.collector_helpers import cycle


def families(body: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_metrics_scrape_without_a_session(web_app, dsn, conn):
    q.enqueue(conn, "noop", queue="mail")
    cycle(dsn)
    response = web_app.test_client().get("/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain")
    assert response.headers["Cache-Control"] == "no-store"
    found = families(response.data)
    depth = {(s.labels["queue"], s.labels["state"]): s.value for s in found["skiplock_queue_depth"].samples}
    assert depth[("mail", "eligible")] == 1
    assert "skiplock_collector_duration_seconds" in found


def test_metrics_token_is_required_when_configured(web_settings, dsn):
    from console.web import create_app

    web_settings["web.metrics_token"] = "s3cret-scrape"
    app = create_app(web_settings)
    try:
        client = app.test_client()
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = client.get("/metrics", headers={"Authorization": "Bearer s3cret-scrape"})
        assert ok.status_code == 200
        assert "skiplock_collection_age_seconds" in families(ok.data)
    finally:
        app.extensions["skiplock"].close()


def test_metrics_when_the_database_is_down_answers_503(web_settings):
    from console.web import create_app

    web_settings.update({"database.dsn": "postgresql://postgres@127.0.0.1:1/nothing", "web.db_wait": 0.2})
    app = create_app(web_settings)
    try:
        response = app.test_client().get("/metrics")
        assert response.status_code == 503
        assert b"not available" in response.data
    finally:
        app.extensions["skiplock"].close()
