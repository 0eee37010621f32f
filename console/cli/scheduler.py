"""Collection and scheduling commands: `skiplock collect --once`, `skiplock scheduler`."""

from __future__ import annotations

import json
import sys

import click

from console.cli.common import dsn_option, friendly_errors, main_group
from console.db import DatabaseError, require_schema
from console.external import validate_all


def _format_labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


@main_group.command("collect")
@dsn_option
@click.option("--once", is_flag=True, required=True, help="Run one full collection cycle, store it, print it and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the stored samples as JSON lines instead of a table.")
@friendly_errors
@click.pass_obj
def collect_cmd(obj, once: bool, as_json: bool) -> None:
    """Run every collector once and print what was stored (for cron and debugging).

    With [[databases]] it collects every database (or the one --database names), each into its
    own samples; a database that is down is reported and the others are still collected.
    Exits 1 when a collector or a database failed (its error is printed; the others still
    stored their samples).
    """
    from console.collectors import Options, collect, collector_connection

    if not obj.config.tables.get("databases"):
        options = Options.from_config(obj.config)
        validate_all(obj.config, obj.dsn, timeout_ms=options.statement_timeout_ms, database="default")
        with collector_connection(obj.dsn, options) as conn:
            require_schema(conn)
            report = collect(conn, options, leader="cli")
        _print_report(report, as_json)
        if report.errors:
            sys.exit(1)
        return
    targets = [obj.database] if obj.database_name else obj.databases
    failed = False
    for database in targets:
        if not as_json:
            click.echo(f"== database {database.name}")
        options = Options.from_config(obj.config, database=database.name)
        try:
            validate_all(obj.config, database.dsn, timeout_ms=options.statement_timeout_ms, database=database.name)
            with collector_connection(database.dsn, options) as conn:
                require_schema(conn)
                report = collect(conn, options, leader="cli")
        except DatabaseError as exc:
            click.echo(f"database {database.name}: not collected: {exc}", err=True)
            failed = True
            continue
        _print_report(report, as_json, database.name)
        failed = failed or bool(report.errors)
    if failed:
        sys.exit(1)


def _print_report(report, as_json: bool, database: str | None = None) -> None:
    if as_json:
        for s in report.samples:
            line = {"metric": s.metric, "labels": s.labels, "value": s.value}
            if database is not None:
                line["database"] = database
            click.echo(json.dumps(line))
    else:
        width = max((len(s.metric) for s in report.samples), default=10)
        for s in report.samples:
            value = "n/a" if s.value is None else f"{s.value:.6g}"
            click.echo(f"{s.metric:<{width}}  {value:>12}  {_format_labels(s.labels)}")
        click.echo(f"stored {len(report.samples)} samples in collection run {report.run_id} ({report.duration_s * 1000:.1f} ms)")
        for name, info in report.collectors.items():
            status = f"error: {info['error']}" if info["error"] else "ok"
            click.echo(f"  {name:<12} {info['ms']:8.1f} ms  {info['samples']:4d} samples  {status}", err=bool(info["error"]))


@main_group.command("scheduler")
@dsn_option
@click.option("--collect-interval", type=click.FloatRange(min=0.1), default=None,
              help="Seconds between collection cycles [config: scheduler.collect_interval].")
@friendly_errors
@click.pass_obj
def scheduler_cmd(obj, collect_interval: float | None) -> None:
    """Run the scheduler until SIGTERM/Ctrl-C: collectors, reaper, archiver, sample retention.

    Run one or several (for failover) per database: one leads, elected with an advisory lock,
    and a standby takes over within [scheduler] election_interval seconds when it dies. With
    [[databases]] one process serves every database (or the one --database names), with an
    election per database; a database that is down does not stop the others.
    """
    from console.config import load_config
    from console.scheduler import Fleet, Scheduler

    config = obj.config
    if collect_interval is not None:
        config = load_config(config.path, overrides={"scheduler.collect_interval": collect_interval})
    # A bad [[external_queues]] entry (missing table or column, a predicate that does not
    # parse, an unknown schema version) stops start-up here, naming the entry; each entry is
    # checked in the database that watches it.
    if config.tables.get("databases"):
        targets = [obj.database] if obj.database_name else obj.databases
        for database in targets:
            validate_all(config, database.dsn, timeout_ms=config.database.statement_timeout_ms, database=database.name)
        scheduler = Fleet(targets, config)
    else:
        validate_all(config, obj.dsn, timeout_ms=config.database.statement_timeout_ms, database="default")
        scheduler = Scheduler(obj.dsn, config)
    scheduler.install_signal_handlers()
    sys.exit(scheduler.run())
