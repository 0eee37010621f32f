"""Error-group commands: `skiplock groups list|ignore|unignore`.

`list` is the dead-letters' groups with what the console remembers of each (new, back after a
quiet period, ignored by whom); `ignore` and `unignore` are the same audited functions the web
console calls (console/errorgroups.py): an ignored group never fires the new_error_group alert.
Both need `--reason`. A fingerprint that matches no group is refused (exit 2) with the nearest
ones, as `replay --group` does.
"""

from __future__ import annotations

import json

import click

from console import errorgroups
from console import maintenance as m
from console.cli.common import dsn_option, friendly_errors, main_group, who_and_why
from console.db import connect, require_schema
from console.maintenance.deadletters import group_hint


@main_group.group("groups")
def groups_group() -> None:
    """Error groups: which are new or back, and which are ignored (see docs/alerts.md, new_error_group)."""


def _new_for(obj):
    return obj.config.scheduler.error_group_new_for


@groups_group.command("list")
@dsn_option
@click.option("--queue", default=None, help="Only this queue.")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@friendly_errors
@click.pass_obj
def list_cmd(obj, queue: str | None, limit: int, as_json: bool) -> None:
    """Error groups, largest first, each with its state (new, back, ignored)."""
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        found = m.groups(conn, queue=queue, limit=limit)
        memory = errorgroups.remembered(conn, [g["fingerprint"] for g in found])
        now = conn.execute("SELECT now()").fetchone()[0]
    rows = []
    for g in found:
        kept = memory.get(g["fingerprint"])
        rows.append({**g, "state": errorgroups.state_of(kept, now, _new_for(obj)),
                     "ignored_by": kept["ignored_by"] if kept else None,
                     "ignore_reason": kept["ignore_reason"] if kept else None})
    if as_json:
        click.echo(json.dumps(rows, default=str, indent=2))
        return
    if not rows:
        click.echo("no dead letters")
    for r in rows:
        state = {"new": "NEW", "regressed": "BACK", "ignored": f"ignored by {r['ignored_by']}"}.get(r["state"] or "", "")
        click.echo(f"{r['count']:>8}  {r['fingerprint']}  {state}".rstrip())


def _act(obj, action: str, fingerprint: str, actor: str, reason: str | None) -> dict:
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        try:
            change = errorgroups.ignore if action == "ignore" else errorgroups.unignore
            return change(conn, fingerprint, actor=actor, reason=reason)
        except errorgroups.GroupNotFound as exc:
            raise click.UsageError(str(exc) + group_hint(conn, fingerprint)) from None
        except errorgroups.GroupError as exc:
            raise click.UsageError(str(exc)) from None


@groups_group.command("ignore")
@dsn_option
@click.argument("fingerprint")
@who_and_why("error_group_ignore")
@friendly_errors
@click.pass_obj
def ignore_cmd(obj, fingerprint: str, actor: str, reason: str | None) -> None:
    """Ignore error group FINGERPRINT: it never fires new_error_group until unignored."""
    _act(obj, "ignore", fingerprint, actor, reason)
    click.echo(f"error group {fingerprint!r} ignored: it will not alert (`skiplock groups unignore` undoes it)")


@groups_group.command("unignore")
@dsn_option
@click.argument("fingerprint")
@who_and_why("error_group_unignore")
@friendly_errors
@click.pass_obj
def unignore_cmd(obj, fingerprint: str, actor: str, reason: str | None) -> None:
    """Stop ignoring error group FINGERPRINT: it alerts again the next time it is new or back."""
    _act(obj, "unignore", fingerprint, actor, reason)
    click.echo(f"error group {fingerprint!r} is no longer ignored")
