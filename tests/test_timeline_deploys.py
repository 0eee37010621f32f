"""Deploys on the incident timeline (issue 33, item 2: "deploys or version changes seen in
workers' reports"), on a real PostgreSQL with real worker processes: each registers Skiplock's
version and its `[worker] release` ($SKIPLOCK_WORKER_RELEASE, migration 024). A worker that
starts on another release than the worker before it on overlapping queues is one deploy event,
in order, with both releases, linked to its row; a restart on the same release is none; a worker
of another fleet (queues that do not overlap) is compared with nothing; a worker of an earlier
release (NULL version and release, as 0.1.0 registers) is no deploy, breaks nothing, and is
not what the next worker is compared with. The Workers page and its API show what each runs.
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import quote

from console import timeline
from tests.workers import wait_for

A, B = "2026.12.03-a", "2026.12.03-b"


def db_now(conn):
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def start(workers, conn, release: str | None, queues: str) -> str:
    """A real worker on `queues` with `release` (None: unset); its registry id once registered."""
    env = {"SKIPLOCK_WORKER_RELEASE": release} if release is not None else {}
    proc = workers.start("--queues", queues, env=env)
    row = wait_for(lambda: conn.execute("SELECT id, version, release FROM skiplock.workers WHERE pid = %s",
                                        (proc.pid,)).fetchone(), timeout=30, what=f"worker on {queues} registered")
    return row[0]


def old_worker(conn, name: str, queues: list[str]) -> None:
    """A worker of the previous release registers: it names its columns, never version or release."""
    conn.execute("INSERT INTO skiplock.workers (id, host, pid, queues, concurrency) VALUES (%s, 'old-host', 4242, %s, 4)",
                 (name, queues))


def test_a_new_release_is_one_deploy_a_restart_or_an_old_worker_none(dsn, conn, workers, client_as):
    since = db_now(conn)
    first = start(workers, conn, A, "default,mail")
    restart = start(workers, conn, A, "default,mail")           # same release: a restart, no deploy
    deployed = start(workers, conn, B, "mail")                  # overlaps: release a -> b
    other_fleet = start(workers, conn, "billing-7", "billing")  # no overlap: nothing to compare with
    old_worker(conn, "old-worker-0.1.0", ["mail"])              # NULL: no deploy, no error
    after_old = start(workers, conn, B, "mail,default")         # compared with `deployed`, not the NULL row
    until = db_now(conn)

    rows = dict(conn.execute("SELECT id, release FROM skiplock.workers").fetchall())
    assert rows[first] == A and rows[deployed] == B and rows["old-worker-0.1.0"] is None
    assert conn.execute("SELECT version FROM skiplock.workers WHERE id = %s", (first,)).fetchone()[0]

    data = client_as("viewer").get("/api/v1/timeline", query_string={"from": since.isoformat(),
                                                                     "to": until.isoformat()}).get_json()
    events = data["events"]
    assert data["unavailable"] == {}
    deploys = [e for e in events if e["kind"] == "deploy"]
    assert len(deploys) == 1, [e["summary"] for e in events]
    [deploy] = deploys
    assert deploy["summary"] == f"deploy: release {A} → {B} (worker {deployed} on mail)"
    assert deploy["data"]["previous_id"] == restart and deploy["data"]["previous_release"] == A
    assert deploy["data"]["release"] == B
    assert deploy["path"] == "/workers#worker-" + quote(deployed, safe="")
    assert data["counts"]["deploy"] == 1

    # In order: after the restart's start, with the new worker's start, before the next one's.
    starts = {e["data"]["id"]: events.index(e) for e in events if e["kind"] == "worker" and e["data"]["what"] == "start"}
    assert set(starts) >= {first, restart, deployed, other_fleet, "old-worker-0.1.0", after_old}
    assert starts[restart] < events.index(deploy) < starts[deployed] < starts[after_old]
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)

    # The postmortem draft names it in the summary and has its row.
    text = client_as("viewer").get("/timeline.md", query_string={"from": since.isoformat(),
                                                                 "to": until.isoformat()}).get_data(as_text=True)
    summary = text[text.index("## Summary"):text.index("## Timeline")]
    assert "- Deploys (1):" in summary and f"release {A} → {B} (worker {deployed} on mail)" in summary
    table = text[text.index("## Timeline"):text.index("## Impact")]
    [row] = [line for line in table.splitlines() if "| Deploy |" in line]
    assert f"release {A} → {B}" in row and f"(http://localhost/workers#worker-{quote(deployed, safe='')})" in row
    html = client_as("viewer").get("/timeline", query_string={"from": since.isoformat(),
                                                              "to": until.isoformat()}).get_data(as_text=True)
    assert html.count('data-event="deploy"') == 1

    # The Workers page and its API say what each runs; the old worker's row says it did not report.
    listing = {w["id"]: w for w in client_as("viewer").get("/api/v1/workers").get_json()["workers"]}
    assert listing[deployed]["release"] == B and listing[deployed]["version"]
    assert listing["old-worker-0.1.0"]["release"] is None and listing["old-worker-0.1.0"]["version"] is None
    page = client_as("viewer").get("/workers").get_data(as_text=True)
    assert f"release <code>{B}</code> · skiplock {listing[deployed]['version']}" in page
    assert "version not reported" in page


def registered(conn, name: str, at, version: str | None, release: str | None, queues: list[str] | None = None):
    conn.execute("INSERT INTO skiplock.workers (id, host, pid, queues, concurrency, started_at, last_seen, version, "
                 "release) VALUES (%s, 'h', 1, %s, 4, %s, %s, %s, %s)", (name, queues, at, at, version, release))


def test_a_version_change_is_a_deploy_and_each_kind_is_capped(conn):
    now = db_now(conn)
    registered(conn, "w-1", now - timedelta(minutes=50), "0.2.0", "r1")  # before the window: compared with
    registered(conn, "w-2", now - timedelta(minutes=5), "0.2.1", "r1")   # every queue: overlaps all
    registered(conn, "w-3", now - timedelta(minutes=4), "0.2.1", None, ["mail"])
    registered(conn, "w-4", now - timedelta(minutes=3), "0.2.1", None, ["mail"])
    tl = timeline.build(conn, now - timedelta(minutes=10), now, timeout_ms=2000)
    assert [e.summary for e in tl.events if e.kind == "deploy"] == [
        "deploy: skiplock 0.2.0 → 0.2.1 (worker w-2 on every queue)",
        "deploy: release r1 → (none) (worker w-3 on mail)",
    ]
    capped = timeline.build(conn, now - timedelta(minutes=10), now, timeout_ms=2000, cap=1)
    assert [e.data["id"] for e in capped.events if e.kind == "deploy"] == ["w-2"]
    assert capped.more["deploy"] == 1 and capped.counts()["deploy"] == 2
