"""`skiplock demo`: it starts on a private cluster, makes real traffic, and leaves nothing behind.

The end-to-end test runs the real command as a child process (its own PostgreSQL, workers,
traffic generator, and the scheduler and web console when installed), waits until jobs are
completed, sends SIGINT like a Ctrl-C, and checks by PID and by /proc that no process it
started is left, PostgreSQL included.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest

from console.demo.orchestrator import DEMO_RELEASE
from console.demo.traffic import IDLE_APPLICATION_NAME, Shop, Traffic, TrafficOptions
from console.pgcluster import PostgresNotFound, free_port

ROOT = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _processes_mentioning(marker: str) -> list[int]:
    """PIDs whose command line or environment contains `marker` (the demo's data directory)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        for part in ("cmdline", "environ"):
            try:
                if needle in (entry / part).read_bytes():
                    found.append(int(entry.name))
                    break
            except OSError:
                continue
    return [pid for pid in found if _alive(pid)]


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            output = log.read_text() if log and log.exists() else ""
            pytest.fail(f"the demo exited with {proc.returncode} while waiting for {what}:\n{output}")
        time.sleep(0.3)
    output = log.read_text() if log and log.exists() else ""
    pytest.fail(f"timed out after {timeout}s waiting for {what}\n{output}")


def _read_state(path: Path) -> dict | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if state.get("children") and state.get("dsn") else None


def _scalar(dsn: str, statement: str, params: tuple = ()) -> int:
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
            return conn.execute(statement, params).fetchone()[0]
    except psycopg.Error:
        return 0


def _check_receiver(demo_dir: Path) -> None:
    """The demo's receiver answers a signed notification with 200 (and logs it), a forged one with 401."""
    import tomllib
    import urllib.error

    from console.alerts.transports import sign

    [hook] = tomllib.loads((demo_dir / "skiplock.toml").read_text())["webhooks"]
    body = json.dumps({"event": "firing", "alert": {"rule": "harness_check", "severity": "info", "summary": "ping"}}).encode()
    signed = urllib.request.Request(hook["url"], data=body, headers={"X-Skiplock-Signature": sign(hook["secret"], int(time.time()), body)})
    with urllib.request.urlopen(signed, timeout=10) as response:
        assert response.status == 200
    forged = urllib.request.Request(hook["url"], data=body, headers={"X-Skiplock-Signature": f"t={int(time.time())},v1=00"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(forged, timeout=10)
    assert info.value.code == 401
    _wait_for(lambda: "harness_check" in (demo_dir / "logs" / "webhooks.log").read_text(errors="replace"), 10,
              "the receiver to log the notification")


def _completed_jobs(dsn: str) -> int:
    return _scalar(dsn, "SELECT coalesce(sum(completed), 0) FROM skiplock.workers")


def _sign_in(url: str, name: str, password: str) -> urllib.request.OpenerDirector:
    """A cookie-keeping client signed in through the login form (with its CSRF token)."""
    import http.cookiejar
    import re
    import urllib.parse

    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with browser.open(url + "login", timeout=10) as response:
        form = response.read().decode()
    token = re.search(r'name="csrf_token" value="([^"]+)"', form).group(1)
    data = urllib.parse.urlencode({"csrf_token": token, "name": name, "password": password, "next": "/"}).encode()
    with browser.open(url + "login", data=data, timeout=10) as response:
        assert "/login" not in response.geturl(), "the demo's login was refused"
    return browser


def _api_completed(browser: urllib.request.OpenerDirector, url: str) -> int:
    with browser.open(url + "api/v1/workers", timeout=10) as response:
        return sum(w["completed"] for w in json.loads(response.read())["workers"])


@pytest.fixture
def demo_dir():
    # Under /tmp: as root the cluster runs as `postgres`, who cannot enter pytest's tmp_path.
    path = Path(tempfile.mkdtemp(prefix="skiplock-demo-test-", dir="/tmp"))
    path.chmod(0o755)  # mkdtemp makes it 0700; the demo would fall back to another folder
    yield path
    shutil.rmtree(path, ignore_errors=True)
    for log in path.parent.glob(f"{path.name}.*"):  # the demo's captured output (kept while it ran)
        log.unlink(missing_ok=True)


def start_demo(demo_dir: Path, *args: str, log_name: str = "out") -> tuple[subprocess.Popen, Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    log = demo_dir.parent / f"{demo_dir.name}.{log_name}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "console", "demo", "--data-dir", str(demo_dir), "--port", str(free_port()), *args],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    return proc, log


@pytest.mark.slow
def test_demo_runs_traffic_and_ctrl_c_leaves_no_process(demo_dir):
    # --pace 3: a reaper run every 30 s (its floor at pace), so the kill (just after one, while the victim holds a job) comes soon.
    proc, log = start_demo(demo_dir, "--rate", "20", "--kill-every", "4s", "--pace", "3", "--duration", "5m")
    try:
        state = _wait_for(lambda: _read_state(demo_dir / "state.json"), 60, "the demo's state file", proc, log)
        postmaster = state["postmaster_pid"]
        assert postmaster and _alive(postmaster)
        # Every component runs: none may drop out quietly (a missing command, a crash at start).
        components = {"web", "scheduler", "webhooks", "traffic", "worker-1", "worker-2", "worker-reports"}
        assert components <= set(state["children"]), f"missing: {components - set(state['children'])}"
        dsn = state["dsn"]

        # Traffic keeps enqueuing.
        def newest() -> int:
            return _scalar(dsn, "SELECT coalesce(max(id), 0) FROM skiplock.jobs")

        first = _wait_for(newest, 60, "traffic to enqueue jobs", proc, log)
        _wait_for(lambda: newest() > first, 60, "traffic to keep enqueuing", proc, log)
        # Each worker completes jobs (worker-reports, killed every few seconds, at least registers
        # on its queues and polls them).
        for name in ("worker-1", "worker-2"):
            pid = state["children"][name]
            _wait_for(lambda pid=pid: _scalar(dsn, "SELECT coalesce(sum(completed), 0) FROM skiplock.workers WHERE pid = %s", (pid,)),
                      60, f"{name} to complete jobs", proc, log)
        _wait_for(lambda: _scalar(dsn, "SELECT count(*) FROM skiplock.workers WHERE queues @> ARRAY['reports', 'search']"),
                  60, "worker-reports to register on its queues", proc, log)
        # Every worker reports the demo's release (the Workers page and the timeline's deploys read it).
        assert _scalar(dsn, "SELECT array_agg(DISTINCT release) FROM skiplock.workers") == [DEMO_RELEASE]
        # The demo's periodic sweep (every 10 s at pace 3) runs, and the worker completes it.
        _wait_for(lambda: _scalar(dsn, "SELECT count(*) FROM skiplock.periodic_runs "
                                       "WHERE name = 'stale-products-sweep' AND outcome = 'completed'"),
                  60, "a completed run of the periodic sweep", proc, log)
        # The scheduler's collectors measured the traffic: a non-zero throughput sample is stored.
        _wait_for(lambda: _scalar(dsn, "SELECT count(*) FROM skiplock.samples WHERE metric = 'throughput' AND value > 0"),
                  60, "a non-zero throughput sample", proc, log)
        # The web console answers, the login the demo printed signs in, and it shows the traffic.
        assert state.get("url"), state
        _wait_for(lambda: "Login      demo / " in log.read_text(), 60, "the demo's announcement", proc, log)
        assert "Not running:" not in log.read_text(), log.read_text()
        with urllib.request.urlopen(state["url"] + "healthz", timeout=5) as response:
            assert response.status == 200
        password = json.loads((demo_dir / "secrets.json").read_text())["password"]
        browser = _sign_in(state["url"], "demo", password)
        _wait_for(lambda: _api_completed(browser, state["url"]) > 0, 30, "completed jobs in the JSON API", proc, log)
        with browser.open(state["url"] + "overview", timeout=10) as response:
            assert response.status == 200 and "Overview" in response.read().decode()
        # The webhook receiver listens where the config points alerts, checks signatures and logs.
        _check_receiver(demo_dir)
        assert all(_alive(pid) for name, pid in state["children"].items() if name != "worker-reports"), state

        # The reports worker is killed (SIGKILL) and restarted by the demo.
        _wait_for(lambda: "chaos: killed worker-reports" in log.read_text(), 30, "the chaos kill", proc, log)
        first_victim = state["children"]["worker-reports"]
        _wait_for(lambda: not _alive(first_victim), 10, "the killed worker to be gone", proc, log)
        restarted = _wait_for(
            lambda: (s := _read_state(demo_dir / "state.json")) and s["children"]["worker-reports"] != first_victim and s,
            30, "the reports worker to restart", proc, log,
        )
        pids = set(state["children"].values()) | set(restarted["children"].values())
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise

    output = log.read_text()
    assert code == 0, output
    assert "stopped: PostgreSQL" in output
    assert not _alive(postmaster), "PostgreSQL is still running after the demo stopped"
    assert not [pid for pid in pids if _alive(pid)], f"children still running: {output}"
    # Nothing at all (grandchildren, PostgreSQL backends) still mentions the demo's directory.
    assert _processes_mentioning(str(demo_dir)) == []
    final = json.loads((demo_dir / "state.json").read_text())
    assert final["running"] is False and final["children"] == {}
    log.unlink(missing_ok=True)


@pytest.mark.slow
def test_a_killed_demo_takes_its_children_along_and_the_next_start_stops_its_postgres(demo_dir):
    proc, log = start_demo(demo_dir, "--kill-every", "0", "--rate", "2")
    try:
        state = _wait_for(lambda: _read_state(demo_dir / "state.json"), 60, "the demo's state file", proc, log)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # no chance to clean up
        proc.wait()
    # Linux's parent-death signal: the children get SIGTERM and stop (workers within their grace).
    _wait_for(lambda: not any(_alive(pid) for pid in state["children"].values()), 30, "the orphaned children to stop")
    assert _alive(state["postmaster_pid"])  # pg_ctl detaches PostgreSQL: the next start must stop it

    again, log2 = start_demo(demo_dir, "--duration", "2s", "--kill-every", "0", log_name="out2")
    assert again.wait(timeout=120) == 0, log2.read_text()
    output = log2.read_text()
    assert "stopping a PostgreSQL left running by an earlier demo" in output
    assert not _alive(state["postmaster_pid"])
    assert _processes_mentioning(str(demo_dir)) == []
    log.unlink(missing_ok=True)
    log2.unlink(missing_ok=True)


def test_demo_without_postgres_names_the_package(monkeypatch, demo_dir):
    from click.testing import CliRunner

    from console import pgcluster
    from console.cli import main

    def no_binaries():
        raise PostgresNotFound(pgcluster.INSTALL_HINT)

    # Only the search for binaries is replaced: this machine has them, a newcomer's may not.
    monkeypatch.setattr(pgcluster, "find_bindir", no_binaries)
    result = CliRunner().invoke(main, ["demo", "--data-dir", str(demo_dir), "--port", str(free_port())])
    assert result.exit_code == 1
    assert "postgresql-15" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("args, message", [
    (["--rate", "0"], "--rate"),
    (["--rate", "-2"], "--rate"),
    (["--duration", "soon"], "duration"),
    (["--port", "70000"], "--port"),
])
def test_demo_refuses_bad_options(args, message):
    from click.testing import CliRunner

    from console.cli import main

    result = CliRunner().invoke(main, ["demo", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_shop_mix_has_every_kind_and_the_three_dead_letter_causes():
    import random

    shop = Shop(random.Random(7))
    jobs = [job for _ in range(3000) for job in shop.event()]
    kinds = {job.kind for job in jobs}
    assert kinds == {"billing.charge_card", "mail.send_receipt", "webhooks.deliver", "images.thumbnail", "reports.build"}
    assert any(j.payload.get("card_last4") == "0002" for j in jobs if j.kind == "billing.charge_card")
    assert any("partner-c" in j.payload["endpoint"] for j in jobs if j.kind == "webhooks.deliver")
    assert any("customer_id" not in j.payload for j in jobs if j.kind == "reports.build")
    charges = [j for j in jobs if j.kind == "billing.charge_card"]
    assert all(j.priority == 10 and j.queue == "billing" for j in charges)
    burst = shop.burst(50)
    assert len(burst) == 50 and {j.queue for j in burst} == {"search"} and burst[0].priority < 0


def test_traffic_enqueues_at_the_rate_and_holds_an_idle_transaction(dsn, conn):
    traffic = Traffic(dsn, TrafficOptions(rate=50, duration=2.5, burst_size=20, first_burst_after=0.5,
                                          first_idle_after=0.0, idle_for=1.5, seed=1))
    seen_idle = {}

    import threading

    def watch():
        deadline = time.monotonic() + 2.5
        with psycopg.connect(dsn, autocommit=True) as watcher:
            while time.monotonic() < deadline and not seen_idle:
                row = watcher.execute(
                    "SELECT state, backend_xid IS NOT NULL, backend_xmin IS NOT NULL FROM pg_stat_activity "
                    "WHERE application_name = %s", (IDLE_APPLICATION_NAME,)).fetchone()
                if row and row[0] == "idle in transaction" and row[1]:  # after BEGIN and the query
                    seen_idle["row"] = row
                time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    counts = traffic.run()
    watcher.join()

    assert seen_idle.get("row") == ("idle in transaction", True, True)
    rows = dict(conn.execute("SELECT kind, count(*) FROM skiplock.jobs GROUP BY kind").fetchall())
    assert rows.get("search.reindex") == 20
    assert sum(rows.values()) == counts.jobs
    # ~50 jobs/s for 2.5 s (the rate swells and ebbs by a third), plus the burst of 20.
    # A loaded machine enqueues fewer (each transaction is slower), never more.
    assert 30 <= counts.jobs - 20 <= 200
    assert conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (IDLE_APPLICATION_NAME,)
    ).fetchone()[0] == 0


def test_demo_handlers_retry_transient_failures_and_dead_letter_permanent_ones(dsn, conn, subprocess_env):
    import console
    from console.queue import NewJob

    with psycopg.connect(dsn) as tx:
        ids = console.enqueue_many(tx, [
            NewJob("billing.charge_card", {"order": 1, "card_last4": "0002", "ms": 1}, queue="billing"),
            NewJob("billing.charge_card", {"order": 2, "card_last4": "4242", "ms": 1}, queue="billing"),
            NewJob("mail.send_receipt", {"order": 3, "greylisted": True, "ms": 1}, queue="mail"),
            NewJob("webhooks.deliver", {"endpoint": "https://hooks.partner-c.example/v2/notify", "ms": 1}, queue="webhooks", max_attempts=3),
            NewJob("webhooks.deliver", {"endpoint": "https://hooks.partner-b.example/events", "ms": 1}, queue="webhooks", max_attempts=3),
            NewJob("reports.build", {"report": "refunds", "ms": 1}, queue="reports", max_attempts=2),
            NewJob("reports.build", {"report": "refunds", "customer_id": 9, "ms": 1}, queue="reports", max_attempts=2),
        ])
    env = {**subprocess_env, "SKIPLOCK_QUEUE_BACKOFF_BASE": "0.05", "SKIPLOCK_WORKER_POLL_INTERVAL": "0.1"}
    worker = subprocess.Popen([sys.executable, "-m", "console", "worker", "--tasks", "console.demo.tasks"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            open_jobs = conn.execute(
                "SELECT count(*) FROM skiplock.jobs WHERE status IN ('pending', 'running')").fetchone()[0]
            if open_jobs == 0:
                break
            time.sleep(0.2)
    finally:
        worker.terminate()
        worker.wait(timeout=15)
    rows = {r[0]: r[1:] for r in conn.execute(
        "SELECT id, status, attempts, split_part(last_error, ':', 1) FROM skiplock.jobs WHERE id = ANY(%s)", (ids,))}
    declined, charged, receipt, down, flaky, broken, report = (rows[i] for i in ids)
    assert declined == ("failed", 1, "CardDeclined")
    assert charged[:2] == ("completed", 1)
    assert receipt[:2] == ("completed", 2) and receipt[2] == "SMTPTemporaryError"
    assert down == ("failed", 3, "ConnectionRefusedError")
    assert flaky[:2] == ("completed", 2)
    assert broken == ("failed", 2, "KeyError")
    assert report[:2] == ("completed", 1)
    groups = conn.execute(
        "SELECT count(DISTINCT error_fingerprint) FROM skiplock.jobs WHERE status = 'failed'").fetchone()[0]
    assert groups == 3
    # The handlers that fail log what they tried: each dead letter's page shows it per attempt.
    logged = {i: [(e["attempt"], [r["message"] for r in e["records"]]) for e in entries or []] for i, entries in
              conn.execute("SELECT id, attempt_logs FROM skiplock.jobs WHERE id = ANY(%s)", (ids,))}
    assert logged[ids[0]] == [(1, ["charging order 1, card ending 0002", "the issuer declined order 1: not retried"])]
    assert [a for a, _ in logged[ids[3]]] == [1, 2, 3] and all(
        m == [f"POST https://hooks.partner-c.example/v2/notify (attempt {a})"] for a, m in logged[ids[3]])
    assert logged[ids[5]] == [(1, ["building report refunds"]), (2, ["building report refunds"])]


def test_seed_history_fills_hours_of_catalogued_samples_that_end_at_todays_dead_letters(conn):
    from datetime import timedelta

    from console import samples
    from console.catalog import METRICS
    from console.demo.seed import history, seed_history

    conn.execute("INSERT INTO skiplock.jobs (queue, kind, status, finished_at) "
                 "SELECT 'billing', 'billing.charge_card', 'failed', now() FROM generate_series(1, 7)")
    stored = seed_history(conn, hours=0.5, step=15)
    assert stored > 80 * 120  # 120 timestamps, about a hundred series each
    metrics = {r[0] for r in conn.execute("SELECT DISTINCT metric FROM skiplock.samples")}
    assert metrics <= set(METRICS)
    assert {"queue_depth", "queue_age_seconds", "throughput", "table_dead_tuples", "xmin_horizon_age_seconds"} <= metrics
    points = samples.series(conn, "dead_letters", since=timedelta(hours=1), labels={"queue": "billing"})
    assert len(points) == 120
    assert points[0]["value"] < points[-1]["value"] == 7  # ramps up to the count held now
    search_age = [p["value"] for p in samples.series(conn, "queue_age_seconds", since=timedelta(hours=1), labels={"queue": "search"})]
    assert max(search_age) >= 30  # the bursts show
    # Every seeded series keeps its labels the same over time (one line per series in a chart).
    keys = {(s.metric, tuple(sorted(s.labels))) for _, group in history(hours=0.1) for s in group}
    assert len({m for m, _ in keys}) == len({(m, k) for m, k in keys})


def test_the_demo_config_loads_with_its_alert_rules_and_receiver(tmp_path):
    from console.config import load_config
    from console.demo.orchestrator import Demo, DemoOptions

    demo = Demo(DemoOptions(data_dir=tmp_path, port=free_port()), out=lambda _: None)
    demo.url, demo.receiver_port = "http://127.0.0.1:8000/", 9999
    demo._write_config()
    config = load_config(demo.config_path, env={})
    assert config.worker.lease == 15.0
    # Its periodic entries pass the scheduler's own checks: the sweep every 30 s at pace 1, the cron report.
    from console.queue import periodic

    entries = {e.name: e for e in periodic.load_entries(config, import_tasks=False)}
    assert entries["stale-products-sweep"].every == 30 and entries["stale-products-sweep"].queue == "default"
    assert entries["refunds-report"].cron == "*/5 * * * *" and entries["refunds-report"].kind == "reports.build"
    if demo.alerts_installed:
        from console.alerts import rules

        rules.check_config(config)  # the same validation the scheduler applies at start-up
        by_name = rules.file_rules(config.tables)
        assert by_name["queue_age"].threshold == 30
        assert rules.file_destinations(config.tables)["demo-receiver"].url == "http://127.0.0.1:9999/hook"
        assert config.alerts.console_url == "http://127.0.0.1:8000"
        assert config.alerts.allow_private_destinations  # its receiver is on loopback


def test_the_receiver_accepts_signed_notifications_and_refuses_forged_ones():
    import threading
    import urllib.error
    from http.server import ThreadingHTTPServer

    from console.demo import receiver

    receiver.Receiver.secret = "s3cret"
    server = ThreadingHTTPServer(("127.0.0.1", 0), receiver.Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    body = json.dumps({"event": "firing", "alert": {"rule": "queue_age", "severity": "critical",
                                                     "labels": {"queue": "search"}, "summary": "waited 56s"}}).encode()
    try:
        stamp = int(time.time())
        from console.alerts.transports import sign  # what the scheduler's sender puts in the header

        good = sign("s3cret", stamp, body)
        request = urllib.request.Request(url, data=body, headers={"X-Skiplock-Signature": good, "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
        forged = urllib.request.Request(url, data=body, headers={"X-Skiplock-Signature": f"t={stamp},v1=00"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(forged, timeout=5)
        assert info.value.code == 401
    finally:
        server.shutdown()
        server.server_close()
        receiver.Receiver.secret = ""
    assert receiver.describe(json.loads(body)) == "FIRING   critical queue_age{queue=search}: waited 56s"


def test_seeded_series_have_the_labels_the_collectors_give_them(dsn, conn):
    """A chart draws seeded and measured samples as one line only if their labels agree."""
    import console
    from console import collectors
    from console.demo.seed import history

    with psycopg.connect(dsn) as tx:
        console.enqueue(tx, "billing.charge_card", {"ms": 1}, queue="billing")
    measured: dict[str, set[tuple[str, ...]]] = {}
    for _ in range(2):  # rates need two cycles
        for sample in collectors.collect_once(dsn).samples:
            measured.setdefault(sample.metric, set()).add(tuple(sorted(sample.labels)))
    seeded: dict[str, set[tuple[str, ...]]] = {}
    for _, group in history(hours=0.05):
        for sample in group:
            seeded.setdefault(sample.metric, set()).add(tuple(sorted(sample.labels)))
    disagree = {m: (keys, measured[m]) for m, keys in seeded.items() if m in measured and not keys <= measured[m]}
    assert not disagree, f"seeded label keys differ from the collectors' (seeded, measured): {disagree}"
    values = {(s.metric, tuple(sorted(s.labels.items()))) for s in collectors.collect_once(dsn).samples}
    for metric, labels in (("queue_depth", {"queue": "billing", "state": "eligible", "system": "skiplock"}),
                           ("claim_latency_seconds", {"queue": "all", "source": "workers", "quantile": "p95"}),
                           ("table_dead_tuples", {"table": "jobs"}),
                           ("xmin_horizon_age_seconds", {"holder": "any"})):
        assert (metric, tuple(sorted(labels.items()))) in values, f"the collectors no longer produce {metric} {labels}"
