"""`skiplock check`: the advisor's checklist on the command line, for people, cron and CI.

Exit status: 0 when no check fails (warnings and "not available" do not fail the run unless
`--strict`), 1 when at least one check fails or the database cannot be checked (unreachable,
not migrated), 2 for bad usage (an unknown check name).
"""

from __future__ import annotations

import json
import sys

import click

from console.advisor import checks as advisor_checks
from console.cli.common import dsn_option, friendly_errors, main_group
from console.databases import select
from console.db import connect

MARKS = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "unknown": "n/a "}


def render_text(report: advisor_checks.Report, *, verbose: bool) -> str:
    lines = [f"Skiplock advisor: database {report.database}"]
    if report.results and report.results[0].area.startswith("External queue"):
        lines = [f"Skiplock advisor: {report.results[0].area}, database {report.database}"]
    area = None
    for result in report.results:
        if result.area != area:
            area = result.area
            lines.append("")
            lines.append(f"{area}")
        lines.append(f"  [{MARKS[result.status]}] {result.id}: {result.summary}")
        if verbose or result.status in ("warn", "fail"):
            lines.extend(f"           {line}" for line in result.evidence)
            if result.remedy and result.status != "ok":
                lines.append(f"           what to do: {result.remedy}")
                lines.append(f"           see {result.docs}")
    counts = report.counts
    lines.append("")
    lines.append(f"{counts['fail']} failing, {counts['warn']} warning, {counts['ok']} ok, {counts['unknown']} not available")
    return "\n".join(lines)


@main_group.command("check")
@dsn_option
@click.option("--format", "output", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Human-readable text or one JSON document.")
@click.option("--only", multiple=True, metavar="CHECK",
              help="Run only this check (repeatable). Ids: " + ", ".join(advisor_checks.check_ids()) + ".")
@click.option("--strict", is_flag=True, help="Also exit 1 when a check warns or is not available.")
@click.option("--all-evidence", is_flag=True, help="Show the evidence of passing checks too (text format).")
@click.option("--external", "external_name", metavar="NAME", default=None,
              help="Run the table-as-queue checks on the [[external_queues]] entry NAME instead of Skiplock's own "
                   "checklist (for teams whose queue is PGQueuer, Procrastinate or their own table).")
@friendly_errors
@click.pass_obj
def check_cmd(obj, output: str, only: tuple[str, ...], strict: bool, all_evidence: bool, external_name: str | None) -> None:
    """Evaluate the production checklist against the live database.

    Exits 0 when nothing fails and 1 when a check fails, so it can gate a deploy or page from cron.
    """
    config = obj.config
    if external_name is not None:
        report = _external_report(obj, external_name)
    else:
        with connect(obj.dsn, application_name="skiplock-advisor") as conn:
            try:
                report = advisor_checks.run_checks(conn, config, only=only or None)
            except advisor_checks.UnknownCheck as exc:
                raise click.UsageError(str(exc)) from None
    if output == "json":
        click.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        click.echo(render_text(report, verbose=all_evidence))
    bad = report.failed or (strict and report.worst != "ok")
    sys.exit(1 if bad else 0)


def _external_report(obj, name: str) -> advisor_checks.Report:
    """The external checks of one entry (validated first: a bad entry exits 1 with its error)."""
    from console.advisor.external import run_external
    from console.external import adapters, validate

    found = {a.name: a for a in adapters(obj.config)}
    if name not in found:
        known = ", ".join(sorted(found)) or "none in the config file"
        raise click.UsageError(f"no [[external_queues]] entry named {name!r} (known: {known})")
    adapter = found[name]
    home = obj.dsn
    if adapter.entry.database and not adapter.entry.dsn:  # read in the database that watches it
        home = select(obj.databases, adapter.entry.database).dsn
    with connect(adapter.entry.dsn or home, application_name="skiplock-advisor") as conn:
        validate(conn, adapter, obj.config.database.statement_timeout_ms)
        if not adapter.entry.dsn:
            return run_external(conn, adapter, obj.config)
        with connect(home, application_name="skiplock-advisor") as console:  # its samples are the console's
            return run_external(conn, adapter, obj.config, console=console)
