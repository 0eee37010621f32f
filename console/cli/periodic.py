"""`skiplock periodic list|pause|resume|run`: the periodic (cron) schedules from the shell.

A thin face over console.periodic: the same functions the Periodic page and its API call,
audited with the actor `cli:<os user>@<host>` and `--reason` (optional for these actions, as on
the page: console.actions keeps the table of which actions require one). The schedules are the
ones a running scheduler declared (skiplock.periodic); this command does not read the config's
[[periodic]] entries itself. Exit codes: 0 done; 2 bad input or no such schedule (nothing changed).
"""

from __future__ import annotations

import json

import click

from console.actions import clean_reason
from console.cli.common import dsn_option, friendly_errors, main_group, who_and_why
from console.db import connect, require_schema
from console.queue import periodic
from console.timefmt import duration


@main_group.group("periodic")
def periodic_group() -> None:
    """Periodic (cron) schedules: list them, pause, resume, run one now (docs/queue.md)."""


def _state(row: dict) -> str:
    if row["paused"]:
        return f"paused by {row['paused_by'] or '?'}"
    return "late" if row["late"] else "active"


def _ago(row: dict, key: str, now) -> str:
    at = row.get(key)
    if at is None:
        return "never" if key == "last_success_at" else "-"
    seconds = (now - at).total_seconds()
    return f"{duration(abs(seconds))} {'ago' if seconds >= 0 else 'from now'}"


@periodic_group.command("list")
@dsn_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@friendly_errors
@click.pass_obj
def list_cmd(obj, as_json: bool) -> None:
    """Every schedule: in words, its last run and outcome, last success, next run, missed slots, state."""
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        rows = periodic.list_schedules(conn)
    if as_json:
        click.echo(json.dumps({"schedules": rows}, default=str, indent=2))
        return
    if not rows:
        click.echo("no periodic schedules: declare one with [[periodic]] in the config file and start a scheduler")
        return
    click.echo(f"{'NAME':<20} {'SCHEDULE':<24} {'JOB':<24} {'LAST RUN':<16} {'OUTCOME':<10} {'LAST SUCCESS':<16} "
               f"{'NEXT RUN':<16} {'MISSED':>6}  STATE")
    for r in rows:
        now = r["now"]
        next_run = "paused" if r["paused"] else _ago(r, "next_slot", now)
        click.echo(f"{r['name']:<20} {r['schedule']:<24} {(r['kind'] + ' on ' + r['queue'])[:24]:<24} "
                   f"{_ago(r, 'last_run_at', now):<16} {r['last_run_status'] or '-':<10} "
                   f"{_ago(r, 'last_success_at', now):<16} {next_run:<16} {r['missed']:>6}  {_state(r)}")


def _act(obj, name: str, action: str, actor: str, reason: str | None) -> int | None:
    reason = clean_reason(reason)
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        try:
            if action == "run":
                return periodic.run_now(conn, name, actor=actor, reason=reason)
            periodic.set_paused(conn, name, action == "pause", actor=actor, reason=reason)
        except periodic.PeriodicError as exc:
            raise click.UsageError(str(exc)) from None
    return None


@periodic_group.command("pause")
@dsn_option
@click.argument("name")
@who_and_why()
@friendly_errors
@click.pass_obj
def pause_cmd(obj, name: str, actor: str, reason: str | None) -> None:
    """Pause schedule NAME: its slots are counted as missed, not enqueued, until it is resumed."""
    _act(obj, name, "pause", actor, reason)
    click.echo(f"periodic {name!r} paused: its slots are skipped (counted as missed) until `skiplock periodic resume {name}`")


@periodic_group.command("resume")
@dsn_option
@click.argument("name")
@who_and_why()
@friendly_errors
@click.pass_obj
def resume_cmd(obj, name: str, actor: str, reason: str | None) -> None:
    """Resume schedule NAME from its next slot."""
    _act(obj, name, "resume", actor, reason)
    click.echo(f"periodic {name!r} resumed from its next slot")


@periodic_group.command("run")
@dsn_option
@click.argument("name")
@who_and_why()
@friendly_errors
@click.pass_obj
def run_cmd(obj, name: str, actor: str, reason: str | None) -> None:
    """Enqueue schedule NAME's job now, outside its slots (a manual run)."""
    job_id = _act(obj, name, "run", actor, reason)
    click.echo(f"periodic {name!r}: job {job_id} enqueued")
