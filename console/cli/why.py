"""`skiplock why JOB_ID` and `skiplock why --queue NAME`: why a job (or a queue) is not running,
the same answer as the job page, the queue page and GET /api/v1/.../why (console/why.py).
Exit codes: 0 answered (whatever the answer), 2 no such job or bad input."""

from __future__ import annotations

import json

import click

from console import brokerwhy, signals, why
from console.cli.common import dsn_option, friendly_errors, main_group
from console.db import connect, require_schema
from console.queue import broker


@main_group.command("why")
@dsn_option
@click.argument("job_id", required=False, type=click.IntRange(min=1))
@click.option("--queue", default=None, metavar="NAME", help="Ask of a queue instead of a job.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON, evidence included.")
@friendly_errors
@click.pass_obj
def why_cmd(obj, job_id: int | None, queue: str | None, as_json: bool) -> None:
    """Why isn't job JOB_ID (or queue NAME) running? The verdict, then every reason with its evidence."""
    if (job_id is None) == (queue is None):
        raise click.UsageError("give a JOB_ID or --queue NAME (one of them)")
    live_within = signals.live_worker_within(obj.config)
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        answer: why.Answer | None
        if job_id is not None:
            answer = why.why_job(conn, job_id, live_within=live_within)
        elif broker.backend_of(conn, str(queue)) == "nats":  # the broker's facts, not skiplock.jobs'
            cfg = obj.config.broker
            answer = brokerwhy.why_broker_queue(conn, str(queue), nats_url=cfg.nats_url,
                                                timeout=float(cfg.publish_timeout), live_within=live_within)
        else:
            answer = why.why_queue(conn, str(queue), live_within=live_within)
    if answer is None:
        raise click.UsageError(f"there is no job {job_id} (not in the jobs table nor the archive)")
    if as_json:
        click.echo(json.dumps(answer.as_dict(), default=str, indent=2))
        return
    click.echo(answer.verdict)
    for reason in answer.reasons:
        if reason is not answer.primary:
            click.echo(f"  {'!' if reason.blocking else '-'} {reason.title}")
