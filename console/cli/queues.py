"""`skiplock queues list`, `skiplock queues show`,
`skiplock queues set NAME [--concurrency N] [--rate N/s|N/m] [--group-concurrency N]
[--group-weight GROUP=W ...] [--clear]`, `skiplock queues backend NAME postgres|nats` and
`skiplock queues move NAME --to nats|postgres | --status`.

`list` is the Queues page in a terminal: per queue the eligible, scheduled and running jobs, the
oldest eligible job's wait, dead letters, stuck leases, limits and who paused it (console.browse's
bounded queue figures, a figure with "+" is a lower bound). `set` is a thin face over
console.queue.limits: the same function the web console and the API call, audited with the actor
`cli:<os user>@<host>` and the required `--reason`. `backend` routes a queue's new jobs to
skiplock.jobs or, through the outbox and the relay, to NATS JetStream (console.queue.broker;
docs/exit-plan.md), audited the same way ('set backend'). `move` is the exit plan's switch
(console.exitplan): the same routing, audited as 'move queue' with what the old side still held,
a no-op (exit 0, no audit row) when the queue already has that backend, and it prints the
dual-run window; `move --status` shows that window without moving. Exit codes: 0 done; 2 bad
input (nothing changed).
"""

from __future__ import annotations

import json

import click

from console import browse
from console.cli.common import dsn_option, friendly_errors, main_group, resolve_reason, who_and_why
from console.db import connect, require_schema
from console.queue import broker, limits


@main_group.group("queues")
def queues_group() -> None:
    """Queues: list them, their limits (docs/queue.md), their backend and moves (docs/exit-plan.md)."""


def _weights(weights: dict[str, int]) -> str:
    return ", ".join(f"{group}={weight}" for group, weight in sorted(weights.items())) or "-"


def _describe(row: dict) -> str:
    bits = []
    if row.get("concurrency") is not None:
        bits.append(f"concurrency {row['concurrency']}")
    if row.get("rate") is not None:
        bits.append(f"rate {row['rate']} (burst {row['burst']:g})")
    if row.get("group_concurrency") is not None:
        bits.append(f"fair, {row['group_concurrency']} per group")
    if row.get("group_weights"):
        bits.append(f"weights ({_weights(row['group_weights'])})")
    return ", ".join(bits) or "no limits"


@queues_group.command("set")
@dsn_option
@click.argument("name")
@click.option("--concurrency", default=None, metavar="N", help="At most N jobs of the queue run at once, fleet-wide.")
@click.option("--rate", default=None, metavar="N/s|N/m", help="At most N claims per second or minute (burst: a second's worth, at least 1).")
@click.option("--group-concurrency", default=None, metavar="N",
              help="A fair queue: at most N jobs of one group (enqueue(..., group=...)) run at once, fleet-wide.")
@click.option("--group-weight", "group_weight", multiple=True, metavar="GROUP=W",
              help="A fair queue's weighted round-robin: GROUP gets W turns (1 to 100) for every turn of a "
                   "weight-1 group, within the same per-group limit; W=1 removes the weight. Repeatable.")
@click.option("--clear", is_flag=True, help="Remove the queue's limits and weights (then set the ones given, if any).")
@who_and_why("limit_change")
@friendly_errors
@click.pass_obj
def set_cmd(obj, name: str, concurrency: str | None, rate: str | None, group_concurrency: str | None,
            group_weight: tuple[str, ...], clear: bool, actor: str, reason: str) -> None:
    """Set, change or clear the limits of queue NAME (a limit not given keeps its value)."""
    # Validate before connecting: a typo is a usage error even with the database down.
    limits.parse_concurrency(concurrency)
    limits.parse_rate(rate)
    limits.parse_group_concurrency(group_concurrency)
    weights = limits.parse_group_weight_args(group_weight)
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        result = limits.set_limits(conn, name, concurrency=concurrency, rate=rate,
                                   group_concurrency=group_concurrency, group_weights=weights, clear=clear,
                                   actor=actor, reason=reason)
    click.echo(f"queue {name!r}: {_describe(result['after'])} (was: {_describe(result['before'])})")
    if "group_weights" in result:
        def show(w: dict) -> str:
            return ", ".join(f"{g}={n}" for g, n in sorted(w.items())) or "every group 1"
        click.echo(f"group weights: {show(result['group_weights']['after'])} (was: {show(result['group_weights']['before'])})")


@queues_group.command("list")
@dsn_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@friendly_errors
@click.pass_obj
def list_cmd(obj, as_json: bool) -> None:
    """Every queue: depth (eligible, scheduled, running), oldest wait, dead letters, limits, paused."""
    from console.timefmt import duration

    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        rows = browse.queue_figures(conn)
        limited = {r["queue"]: r for r in limits.queue_limits(conn)}
    for row in rows:
        lim = limited.get(row["queue"])
        row["limits"] = None if lim is None else {
            k: lim[k] for k in ("concurrency", "rate", "burst", "group_concurrency", "group_weights", "running", "tokens")}
    if as_json:
        click.echo(json.dumps({"queues": rows}, default=str, indent=2))
        return
    if not rows:
        click.echo("no queues: no job has been enqueued, and no queue was paused or limited")
        return
    click.echo(f"{'QUEUE':<24} {'ELIGIBLE':>9} {'SCHEDULED':>9} {'RUNNING':>8} {'OLDEST':>10} {'DEAD':>7} {'STUCK':>6}  "
               "LIMITS · PAUSED")
    for r in rows:
        more = "+" if r["pending_capped"] else ""
        notes = [_describe(r["limits"]) if r["limits"] else "no limits"]
        if r["paused"]:
            notes.append(f"paused by {r['paused_by'] or '?'}" + (f" at {r['paused_at']:%Y-%m-%d %H:%M} UTC" if r["paused_at"] else ""))
        oldest = duration(r["age_seconds"]) if r["eligible"] else "-"
        click.echo(f"{r['queue']:<24} {str(r['eligible']) + more:>9} {str(r['scheduled']) + more:>9} {r['running']:>8} "
                   f"{oldest:>10} {str(r['failed']) + ('+' if r['failed_capped'] else ''):>7} {r['stuck']:>6}  "
                   + " · ".join(notes))


@queues_group.command("show")
@dsn_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@friendly_errors
@click.pass_obj
def show_cmd(obj, as_json: bool) -> None:
    """The limited queues and kinds, with their running jobs and tokens now."""
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        queues = limits.queue_limits(conn)
        kinds = limits.kind_limits(conn)
    if as_json:
        click.echo(json.dumps({"queues": queues, "kinds": kinds}, default=str, indent=2))
        return
    if not queues and not kinds:
        click.echo("no limits: every queue and kind is claimed without one")
        return
    if queues:
        click.echo(f"{'QUEUE':<24} {'CONCURRENCY':>11} {'RUNNING':>8} {'RATE':>8} {'BURST':>6} {'TOKENS':>7} {'PER GROUP':>9}  WEIGHTS · SET BY")
        for r in queues:
            click.echo(f"{r['queue']:<24} {r['concurrency'] if r['concurrency'] is not None else '-':>11} {r['running']:>8} "
                       f"{r['rate'] or '-':>8} {format(r['burst'], 'g') if r['burst'] else '-':>6} "
                       f"{format(r['tokens'], '.2f') if r['tokens'] is not None else '-':>7} "
                       f"{r['group_concurrency'] or '-':>9}  {_weights(r['group_weights'])} · "
                       f"{r['set_by'] or '?'}{' (paused)' if r['paused'] else ''}")
    if kinds:
        if queues:
            click.echo("")
        click.echo(f"{'KIND':<24} {'CONCURRENCY':>11} {'RUNNING':>8}  DECLARED BY")
        for k in kinds:
            click.echo(f"{k['kind']:<24} {k['concurrency']:>11} {k['running']:>8}  {k['declared_by'] or '?'}")


@queues_group.command("backend")
@dsn_option
@click.argument("name")
@click.argument("backend", type=click.Choice(broker.BACKENDS))
@who_and_why("queue_backend")
@friendly_errors
@click.pass_obj
def backend_cmd(obj, name: str, backend: str, actor: str, reason: str) -> None:
    """Route the NEW jobs of queue NAME to BACKEND: postgres (skiplock.jobs) or nats (the outbox,
    published by `skiplock relay`, run by `skiplock worker --backend nats`). Jobs already enqueued
    stay where they are and are finished by that backend's workers (docs/exit-plan.md)."""
    if backend == "nats":
        broker.check_queue(name)  # before connecting: a name a broker cannot carry is bad input
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        result = broker.set_backend(conn, name, backend, actor=actor, reason=reason)
    click.echo(f"queue {name!r}: new jobs go to {result['after']} (was: {result['before']})")


@queues_group.command("move")
@dsn_option
@click.argument("name")
@click.option("--to", "to", type=click.Choice(broker.BACKENDS), default=None,
              help="The backend that serves the queue's new jobs from now on.")
@click.option("--status", is_flag=True, help="Show the dual-run window (what each side still holds) without moving.")
@click.option("--create", is_flag=True, help="Move a queue no job, sample or limit has named yet.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@who_and_why()
@friendly_errors
@click.pass_obj
def move_cmd(obj, name: str, to: str | None, status: bool, create: bool, as_json: bool, actor: str,
             reason: str | None) -> None:
    """Move queue NAME --to nats or --to postgres, with a dual-run window: new jobs go to the
    new backend at once, while the old side's workers finish what it already holds (the
    PostgreSQL workers the jobs in skiplock.jobs, the relay and the broker workers the outbox).
    Prints what is left and how to watch it; `--status` only shows it. Moving a queue to the
    backend it already has changes nothing and exits 0 (docs/exit-plan.md)."""
    from console import exitplan

    if status == (to is not None):
        raise click.UsageError("give either --to nats|postgres (move) or --status (show the drain)")
    if to is not None:
        broker.check_backend(name, to)  # before connecting: a name a broker cannot carry is bad input
        reason = resolve_reason("queue_move", reason)
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        if to is None:
            exitplan.known_queue(conn, name)
            state = exitplan.dual_run(conn, name)
        else:
            result = exitplan.move(conn, name, to, actor=actor, reason=reason or "", create=create)
    if to is None:
        # The broker's side of a queue served by PostgreSQL (jobs it left in its stream), read
        # after the connection is closed: nothing waits on NATS with a transaction open.
        state = exitplan.with_stream(state, obj.config.broker.nats_url, float(obj.config.broker.publish_timeout))
        click.echo(json.dumps(state, default=str, indent=2) if as_json else "\n".join(exitplan.status_lines(state)))
        return
    if as_json:
        click.echo(json.dumps(result, default=str, indent=2))
        return
    if not result["changed"]:
        click.echo(f"queue {name!r} is already served by {to}: nothing changed (no audit row)")
    else:
        where = "the outbox, published by `skiplock relay`" if to == "nats" else "skiplock.jobs"
        click.echo(f"queue {name!r}: moved to {to} (was: {result['before']}); new jobs go to {where}")
    for line in exitplan.status_lines(result["dual_run"])[1:]:
        click.echo(line)
    click.echo(f"watch the drain: skiplock queues move {name} --status   (or: skiplock exit-plan {name})")
