"""`skiplock timeline [--alert N | --from T --to T] [--markdown | --json]`: the incident timeline
of one database, the same events as /timeline and GET /api/v1/timeline (console/timeline.py),
as lines, as the Markdown postmortem draft, or as JSON. The command line reads the database
itself, so nothing is redacted (as `skiplock why` and `skiplock dead-letters`).
Exit codes: 0 printed, 2 no such alert or bad input."""

from __future__ import annotations

import json

import click

from console import signals, timeline
from console.alerts import evaluate as ev
from console.alerts import rules as r
from console.browse import parse_time
from console.cli.common import dsn_option, friendly_errors, main_group
from console.db import connect, require_schema


@main_group.command("timeline")
@dsn_option
@click.option("--alert", "alert_id", default=None, type=click.IntRange(min=1), metavar="N",
              help="The window around alert N: 30 min before it fired to its resolution (or now).")
@click.option("--from", "since", default=None, metavar="TIME",
              help="ISO 8601 time or span back from now (90m, 6h); default an hour before --to.")
@click.option("--to", "until", default=None, metavar="TIME", help="ISO 8601 time or span back from now; default now.")
@click.option("--markdown", is_flag=True, help="Print the postmortem draft (Markdown).")
@click.option("--json", "as_json", is_flag=True, help="Print the events as JSON.")
@click.option("--console-url", default="", metavar="URL",
              help="The console's address, to make the draft's links absolute (default: [alerts] console_url).")
@friendly_errors
@click.pass_obj
def timeline_cmd(obj, alert_id: int | None, since: str | None, until: str | None, markdown: bool, as_json: bool,
                 console_url: str) -> None:
    """What happened in one database, oldest first: alerts, operator actions, scheduler and worker
    starts and exits, autovacuum runs, new xmin holders, lock waits, replica lag, new error groups."""
    if markdown and as_json:
        raise click.UsageError("--markdown or --json, not both")
    config = obj.config
    database = obj.database.name if (config.tables.get("databases") or obj.database_name) else "default"
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]  # one row, always
        alert, start, end = None, None, None
        if alert_id is not None:
            alert = ev.get_alert(conn, alert_id)
            if alert is None:
                raise click.UsageError(f"alert {alert_id} does not exist")
            start, end = timeline.alert_window(alert, now)
            alert = {k: alert.get(k) for k in ("id", "rule", "labels", "state", "fired_at", "resolved_at",
                                               "state_since", "value")}
        if since:
            start = parse_time(since, "from", now=now)
        if until:
            end = parse_time(until, "to", now=now)
        start, end = timeline.window(start, end, now)
        lag = [rule.threshold for rule in r.load(conn, config).rules.values()
               if rule.metric == "replica_lag_seconds" and rule.op.startswith(">")]
        tl = timeline.build(conn, start, end, timeout_ms=config.database.statement_timeout_ms, database=database,
                            alert=alert, live_within=signals.live_worker_within(config),
                            replica_lag_threshold=min(lag, default=60.0))
    base = (console_url or getattr(getattr(config, "alerts", None), "console_url", "") or "").rstrip("/")
    if markdown:
        click.echo(timeline.markdown(tl, base_url=base), nl=False)
        return
    if as_json:
        click.echo(json.dumps(tl.as_dict(), indent=2))
        return
    click.echo(f"{timeline.title_of(tl)}: {start:%Y-%m-%d %H:%M:%S} to {end:%Y-%m-%d %H:%M:%S} UTC")
    for e in tl.events:
        click.echo(f"{e.at:%Y-%m-%d %H:%M:%S}  {timeline.LABELS[e.kind]:<15}  {e.summary}")
    if not tl.events:
        click.echo("nothing recorded in the window")
    for kind, n in tl.more.items():
        click.echo(f"... and {n} more {timeline.LABELS[kind].lower()} event(s) (at most {timeline.CAP} per kind)")
    for kind, error in tl.unavailable.items():
        click.echo(f"{timeline.LABELS[kind]}: not available: {error}")
