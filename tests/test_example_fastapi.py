"""The FastAPI example (examples/fastapi_shop) against the suite's PostgreSQL, through FastAPI's
TestClient: the order and its job commit in the request's transaction (the `transaction`
dependency's async SQLAlchemy session), a refused order leaves no job, and a real worker runs
the example's `async def` handler."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from console import queue as q
from tests.workers import WorkerProcs, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def client(dsn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", dsn)
    from examples.fastapi_shop.app import app

    with TestClient(app) as client:
        yield client


def jobs(conn) -> list[tuple]:
    return conn.execute("SELECT kind, queue, payload, idempotency_key FROM skiplock.jobs ORDER BY id").fetchall()


def test_an_order_and_its_job_commit_in_the_request_transaction(client, conn):
    response = client.post("/orders", json={"total": 42})
    assert response.status_code == 201, response.text
    order = response.json()["order"]
    assert conn.execute("SELECT total FROM fastapi_shop_orders WHERE id = %s", (order,)).fetchone() == (42,)
    assert jobs(conn) == [("shop.send_receipt", "mail", {"order": order}, f"receipt-{order}")]
    assert q.get_job(conn, response.json()["job"])["status"] == "pending"


def test_a_refused_order_rolls_back_with_its_job(client, conn):
    response = client.post("/orders", json={"total": 0})
    assert response.status_code == 400 and response.json() == {"detail": "total: must be positive"}
    assert conn.execute("SELECT count(*) FROM fastapi_shop_orders").fetchone()[0] == 0
    assert jobs(conn) == [], "the job outlived the rolled-back order"


def test_a_worker_runs_the_async_handler(client, conn, subprocess_env):
    order = client.post("/orders", json={"total": 7}).json()["order"]
    workers = WorkerProcs(subprocess_env)
    try:
        proc = workers.start(tasks="examples.fastapi_shop.tasks")
        wait_for(lambda: client.get(f"/orders/{order}").json()["receipt_sent"], timeout=30, what="the receipt")
        assert workers.stop(proc)[0] == 0
    finally:
        workers.stop_all()
    assert conn.execute("SELECT status, attempts FROM skiplock.jobs").fetchone() == ("completed", 1)
    assert client.get("/orders/999999").status_code == 404
