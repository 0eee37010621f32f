"""The console never writes to a source whose entry lacks `actions = true` (the default).

A real PGQueuer schema (its Queries.install, what `pgq install` runs) in the test's database, watched as 'legacy' without
`actions`, holds failed and queued jobs. Then:

- every route of the app's URL map (every blueprint, present and future) is requested with
  every method it accepts, as an admin with the CSRF token and as an admin API token, with
  form fields that would replay, purge, cancel and pause the source's jobs were its actions on
  (the confirm fields of a real preview included), and with `action` replay and purge;
- every command of `skiplock external` (taken from the click group: a new command fails until
  it has arguments here), and `skiplock check --external legacy` and `skiplock collect --once`,
  are run against it with a reason;

and the library's own tables (pgqueuer, pgqueuer_log) are byte for byte what they were. Every
unsafe route of the external blueprint answers 403 naming the opt-in (or 404/409 where it names
nothing of the source), and no answer is a 500.
"""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from console import users as users_mod
from console.cli import main
from console.cli.external import external_group
from console.config import ExternalQueue
from console.external import actions as xa
from console.external import adapter_for
from tests import external_workers as w
from tests.test_external_libraries import run_async, url
from tests.web_fixtures import CSRF

pytestmark = pytest.mark.slow
REASON = "INC-99: this must not reach the library"
LIBRARY_TABLES = ("pgqueuer", "pgqueuer_log")
OFF = ExternalQueue(name="legacy", system="pgqueuer")


@pytest.fixture
def web_settings(web_settings, tmp_path, monkeypatch):
    config = tmp_path / "skiplock.toml"
    config.write_text('[[external_queues]]\nname = "legacy"\nsystem = "pgqueuer"\n')  # no `actions`: off
    monkeypatch.setenv("SKIPLOCK_CONFIG", str(config))
    return web_settings


@pytest.fixture
def source(conn, dsn):
    """PGQueuer's schema with two held failures and a queued job; returns what a request needs."""
    run_async(w.pgqueuer_install(url(dsn)))
    run_async(w.pgqueuer_produce(url(dsn), ["flaky", "flaky", "idle"]))
    conn.execute("UPDATE pgqueuer SET status = 'failed', updated = now() WHERE entrypoint = 'flaky'")
    failed = [str(r[0]) for r in conn.execute("SELECT id FROM pgqueuer WHERE status = 'failed' ORDER BY id")]
    idle = str(conn.execute("SELECT id FROM pgqueuer WHERE entrypoint = 'idle'").fetchone()[0])
    confirm = xa.preview(conn, adapter_for(OFF), xa.Selection(queue="flaky")).bound().as_fields()  # a read: allowed
    op = conn.execute("""INSERT INTO skiplock.external_operations (source, system, action, selection, actor, state, total,
                             batch_size, keys_digest)
                         VALUES ('legacy', 'pgqueuer', 'replay', '{"queue": "flaky"}', 'seed', 'cancelled', 2, 10, %s)
                         RETURNING id""", (confirm["digest"],)).fetchone()[0]
    conn.execute("INSERT INTO skiplock.external_operation_items (operation_id, ord, key) SELECT %s, o, k "
                 "FROM unnest(%s::text[]) WITH ORDINALITY AS u(k, o)", (op, failed))
    return {"failed": failed, "idle": idle, "confirm": confirm, "op": op}


def library_state(conn) -> dict[str, str]:
    """Every row of the library's tables, as text, hashed per table."""
    return {t: conn.execute(f"SELECT count(*) || ':' || coalesce(md5(string_agg(x::text, '|' ORDER BY x::text)), '') "  # noqa: S608
                            f"FROM {t} AS x").fetchone()[0] for t in LIBRARY_TABLES}


def _url(rule, ctx) -> str:
    def fill(match: re.Match) -> str:
        converter, name = match.group(1) or "", match.group(2)
        if name == "op_id":
            return str(ctx["op"])
        if converter.startswith("int"):
            return "987654321"
        return {"name": "legacy", "queue": "flaky"}.get(name, ctx["failed"][0])

    return re.sub(r"<(?:(\w+)(?:\([^)]*\))?:)?(\w+)>", fill, rule.rule)


def test_no_route_writes_to_a_source_whose_actions_are_off(web_app, client_as, conn, personas, source):
    before = library_state(conn)
    token = users_mod.create_token(conn, "admin", "walker")
    admin = client_as("admin")
    fields_common = {"csrf_token": CSRF, "queue": "flaky", "keys": [*source["failed"], source["idle"]], "all": "1",
                     "reason": REASON, **source["confirm"]}
    rules = sorted(web_app.url_map.iter_rules(), key=lambda r: (r.endpoint == "auth.logout", r.rule))
    seen, refused = 0, {}
    for rule in rules:
        path = _url(rule, source)
        for method in sorted(set(rule.methods or ()) - {"HEAD", "OPTIONS"}):
            for action in ("replay", "purge"):
                data = {**fields_common, "action": action}
                for client, headers in ((admin, {}), (web_app.test_client(), {"Authorization": f"Bearer {token}"})):
                    if headers and not path.startswith("/api/"):
                        continue
                    response = client.open(path, method=method, data=data if method != "GET" else None,
                                           query_string={"queue": "flaky"} if method == "GET" else None, headers=headers)
                    seen += 1
                    assert response.status_code < 500, (method, path, response.get_data(as_text=True)[:300])
                    if rule.endpoint.startswith("external.") and method != "GET":
                        refused[(rule.endpoint, action)] = response.status_code
                    assert library_state(conn) == before, f"{method} {path} ({action}) changed the library's tables"
    assert seen > 300
    unsafe = {e for e, _ in refused}
    assert unsafe == {"external.preview", "external.start", "external.cancel", "external.resume", "external.cancel_jobs",
                      "external.pause", "external.resume_queue", "external.api_preview", "external.api_start",
                      "external.api_cancel", "external.api_resume", "external.api_cancel_jobs", "external.api_pause",
                      "external.api_resume_queue"}
    for (endpoint, _), status in refused.items():
        expected = 409 if endpoint in ("external.cancel", "external.api_cancel") else 403  # cancelling an ended op
        assert status == expected, (endpoint, status)
    assert conn.execute("SELECT count(*) FROM skiplock.audit_log WHERE detail->>'external' = 'legacy' "
                        "AND action <> 'cancel'").fetchone()[0] == 0


# Arguments for every command of `skiplock external`, acting on the source (a new command fails
# `test_no_command_writes...` until it is listed here).
def external_commands(ctx) -> dict[str, list[list[str]]]:
    failed, idle, op = ctx["failed"], ctx["idle"], str(ctx["op"])
    return {
        "list": [[]],
        "dead-letters": [["legacy"], ["legacy", "--queue", "flaky", "--json"]],
        "replay": [["legacy", "--all"], ["legacy", "--queue", "flaky"], ["legacy", "--key", failed[0]],
                   ["legacy", "--all", "--dry-run"]],
        "purge": [["legacy", "--all"], ["legacy", "--key", ",".join(failed)]],
        "cancel": [["legacy", idle]],
        "pause": [["legacy", "flaky"]],
        "resume": [["legacy", "flaky"]],
        "operations": [[], ["--resume", op], ["--cancel", op], ["--resume-abandoned"]],
    }


def test_no_command_writes_to_a_source_whose_actions_are_off(conn, dsn, source, tmp_path, monkeypatch):
    config = tmp_path / "skiplock.toml"
    config.write_text('[[external_queues]]\nname = "legacy"\nsystem = "pgqueuer"\n')
    monkeypatch.setenv("SKIPLOCK_CONFIG", str(config))
    before = library_state(conn)
    commands = external_commands(source)
    assert set(commands) == set(external_group.commands), "a command of `skiplock external` has no arguments here"
    runner = CliRunner()
    runs = [(["external", name, *args], name) for name, arg_sets in commands.items() for args in arg_sets]
    runs += [(["check", "--external", "legacy"], "check"), (["collect", "--once"], "collect")]
    for argv, name in runs:
        with_reason = [*argv, "--reason", REASON] if name not in ("list", "dead-letters", "check", "collect") else argv
        result = runner.invoke(main, ["--dsn", dsn, *with_reason])
        acting = name in ("replay", "purge", "cancel", "pause", "resume") and "--dry-run" not in argv
        if acting or "--resume" in argv or "--cancel" in argv:
            assert result.exit_code == 2, (argv, result.output)
            assert any(why in result.output for why in ("actions are off", "offers no", "has already ended")), result.output
        else:  # reading (check exits 1 on a failed advisor check)
            assert result.exit_code in (0, 1), (argv, result.output)
        assert library_state(conn) == before, f"skiplock {' '.join(argv)} changed the library's tables"
    assert "2 dead letters of legacy (pgqueuer) to replay" in runner.invoke(
        main, ["--dsn", dsn, "external", "replay", "legacy", "--all", "--dry-run"]).output
