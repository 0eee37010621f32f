"""`skiplock backends show|cancel|terminate PID`: the price of a horizon holder or a lock blocker,
and ending it, as the Database page and POST /api/v1/health/backends/<pid>/end do
(console/holders.py).

`cancel` and `terminate` are bound to the backend's identity: `--backend-start` must be the
start time `show` (or the page, or the API) printed for that pid, so a pid reused by a new
backend is refused. Exit codes: 0 signalled, 1 refused (the console's own session, replication,
not a client, gone, the pid names another backend now), 2 bad input or no reason.
"""

from __future__ import annotations

import json

import click

from console import holders
from console.cli.common import dsn_option, friendly_errors, main_group, who_and_why
from console.db import connect, require_schema, time_limited

REFUSED = (holders.BackendRefused, holders.BackendGone, holders.BackendChanged)


@main_group.group("backends")
def backends_group() -> None:
    """A holder's or a blocker's price, and ending it (pg_cancel_backend / pg_terminate_backend)."""


@backends_group.command("show")
@dsn_option
@click.argument("pid", type=click.IntRange(min=1, max=2**31 - 1))
@click.option("--json", "as_json", is_flag=True, help="Print identity and price as JSON.")
@friendly_errors
@click.pass_obj
def show_cmd(obj, pid: int, as_json: bool) -> None:
    """Who backend PID is (with the --backend-start that binds an action) and what it has cost
    since its transaction started."""
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        with time_limited(conn, obj.config.database.statement_timeout_ms):
            found = holders.backends(conn, [pid], own_pids=[conn.info.backend_pid]).get(pid)
            if found is None or not found["this_database"]:
                raise click.ClickException(f"no backend with pid {pid} in database {conn.info.dbname!r}")
            cost = holders.price(conn, found["xact_start"] or found["backend_start"])
    if as_json:
        click.echo(json.dumps(holders.jsonable({"backend": found, "price": cost}), default=str, indent=2))
        return
    click.echo(f"pid {pid}  {found['application_name'] or '-'}  {found['usename']}  {found['state']}  "
               f"({found['backend_type']})")
    click.echo(f"  --backend-start {found['backend_start'].isoformat()}")
    if found["refused"]:
        click.echo(f"  not endable: {found['refused']}")
    for line in describe(cost):
        click.echo(f"  {line}")


def describe(cost: dict | None) -> list[str]:
    """The price in a few lines of text."""
    if cost is None:
        return ["no transaction: nothing held"]
    lines = [f"held for {cost['held_s']:.0f} s (since {cost['since'].isoformat()})"]
    dead = cost["dead_tuples"]
    lines.append(f"dead rows since: {dead['total']:.0f}" if dead["total"] is not None else f"dead rows: {dead['note']}")
    for name, unit in (("throughput", "jobs/s"), ("claim_latency", "s")):
        fig = cost[name]
        label = name.replace("_", " ")
        if fig.get("note"):
            lines.append(f"{label}: {fig['note']}")
        else:
            change = f" ({fig['change'] * 100:+.0f} %)" if fig["change"] is not None else ""
            lines.append(f"{label}: {fig['before']:.4g} {unit} before, {fig['now']:.4g} {unit} since{change}")
    return lines


def _end(obj, mode: str, pid: int, backend_start: str, actor: str, reason: str | None) -> None:
    started = holders.parse_backend_start(backend_start)
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        try:
            result = holders.end_backend(conn, pid, started, mode, actor=actor, reason=reason,
                                         own_pids=[conn.info.backend_pid],
                                         timeout_ms=obj.config.database.statement_timeout_ms)
        except REFUSED as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"{result['message']} (audit entry {result['audit_id']})")


HELP = {
    "cancel": "Cancel the running query of backend PID (pg_cancel_backend); an idle transaction stays open.",
    "terminate": "Terminate backend PID (pg_terminate_backend): its session ends, its transaction rolls back.",
}


def _command(mode: str):
    action = holders.MODES[mode][0]

    @backends_group.command(mode, help=HELP[mode])
    @dsn_option
    @click.argument("pid", type=click.IntRange(min=1, max=2**31 - 1))
    @click.option("--backend-start", required=True, metavar="TIME",
                  help="The backend's start time as `skiplock backends show PID` prints it (binds the action to it).")
    @who_and_why(action)
    @friendly_errors
    @click.pass_obj
    def command(obj, pid: int, backend_start: str, actor: str, reason: str | None) -> None:
        _end(obj, mode, pid, backend_start, actor, reason)

    return command


cancel_cmd = _command("cancel")
terminate_cmd = _command("terminate")
