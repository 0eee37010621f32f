"""`skiplock exit-plan QUEUE [--json]`: for one queue, the advisor's signals that bear on
outgrowing PostgreSQL, the verdict, the queue's backend and dual-run state, and the numbered
steps to move it to NATS JetStream and back, each marked done, to do, to check, or if needed
(console.exitplan; docs/exit-plan.md). It reads and changes nothing.

Exit codes: 0 the plan was shown; 2 bad input (an unknown queue, named); 1 the database cannot
be read.
"""

from __future__ import annotations

import json

import click

from console import exitplan
from console.cli.common import dsn_option, friendly_errors, main_group
from console.db import connect, require_schema

MARKS = {"ok": "ok        ", "watch": "WATCH     ", "outgrowing": "OUTGROWING", "unknown": "n/a       "}
STEP_MARKS = {exitplan.DONE: "[done]     ", exitplan.TODO: "[to do]    ", exitplan.CHECK: "[check]    ",
              exitplan.IF_NEEDED: "[if needed]"}


def render(plan: exitplan.Plan) -> str:
    v = plan.verdict
    lines = [f"Exit plan for queue {plan.queue!r}", "",
             f"Backend now: {plan.backend}", "",
             f"The advisor's verdict: {v['label']}", f"  {v['headline']}", f"  {plan.advice}", ""]
    for scope, title in (("database", "Signals of the whole database (every queue of it together):"),
                         ("queue", f"Signal of queue {plan.queue} alone:")):
        lines.append(title)
        for s in (s for s in plan.signals if s["scope"] == scope):
            lines.append(f"  [{MARKS.get(s['level'], s['level'])}] {s['name']}: {s['text']}")
            if s["cause"]:
                lines.append(f"               known cause: {s['cause']}")
        lines.append("")
    lines.append("Dual run:")
    lines.extend(f"  {line}" for line in exitplan.status_lines(plan.dual_run))
    lines.append("")
    lines.append("Steps:")
    for n, step in enumerate(plan.steps, 1):
        lines.append(f"  {n}. {STEP_MARKS[step.state]} {step.title}")
        lines.extend(f"         {command}" for command in step.commands)
        if step.note:
            lines.append(f"         ({step.note})")
    return "\n".join(lines)


@main_group.command("exit-plan")
@dsn_option
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
@friendly_errors
@click.pass_obj
def exit_plan_cmd(obj, queue: str, as_json: bool) -> None:
    """The exit plan for QUEUE: the advisor's signals and verdict, the backend, the dual-run
    state, and the steps to move it to NATS JetStream (and back), with the commands."""
    config = obj.config
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        plan = exitplan.plan(conn, queue, nats_url=config.broker.nats_url,
                             timeout_ms=config.database.statement_timeout_ms)
    if as_json:
        click.echo(json.dumps(plan.to_dict(), indent=2, default=str))
    else:
        click.echo(render(plan))
