"""`skiplock external ...`: the queues Skiplock watches but did not create ([[external_queues]]).

    skiplock external list                                   each source, its system, its actions
    skiplock external dead-letters NAME [--queue Q]          the source's dead letters, newest first
    skiplock external replay NAME (--queue Q | --key K | --all) [--dry-run] --reason TEXT
    skiplock external purge  NAME (--queue Q | --key K | --all) [--dry-run] --reason TEXT
    skiplock external cancel NAME KEY...                     waiting jobs, the library's way
    skiplock external pause|resume NAME QUEUE --reason TEXT  where the library can (BullMQ)
    skiplock external operations [--source NAME] [--cancel ID | --resume ID | --resume-abandoned]

A thin face over console.external.actions, like `skiplock replay` over console.maintenance:
the same preview (exact count, sample, the filter as understood) bound to the start, the same
reasons (console.actions: replay of more than one job, purge, pause and resume need one), the
same audit rows (naming the system and the source). A source whose entry lacks
`actions = true` is refused with exit code 2 before anything connects to it; reading
(`list`, `dead-letters`, `--dry-run`) works on every source, READ ONLY.
Exit codes: 0 done; 1 the operation failed or was cancelled; 2 bad input (nothing touched).
"""

from __future__ import annotations

import json
import sys
import threading

import click

from console.actions import bulk_action
from console.cli.common import (
    dsn_option,
    friendly_errors,
    interactive,
    main_group,
    resolve_reason,
    who_and_why,
)
from console.databases import select
from console.db import connect, require_schema
from console.external import actions as xa
from console.external import adapters
from console.maintenance.archive import check_batching
from console.maintenance.settings import MaintenanceSettings


@main_group.group("external")
def external_group() -> None:
    """Queues Skiplock watches but did not create: their dead letters, and actions on them where
    the entry says `actions = true`."""


def _adapter(obj, name: str):
    found = {a.name: a for a in adapters(obj.config)}
    if name not in found:
        known = ", ".join(sorted(found)) or "none in the config file"
        raise click.UsageError(f"no [[external_queues]] entry named {name!r} (known: {known})")
    return found[name]


def _console_dsn(obj, adapter) -> str:
    """The database whose console watches the source: its operations and audit rows live there."""
    if adapter.entry.database:
        return select(obj.databases, adapter.entry.database).dsn
    if obj.config.tables.get("databases"):
        return select(obj.databases, None).dsn
    return obj.dsn


def _sources(obj, adapter) -> dict:
    return {a.name: a for a in adapters(obj.config) if (a.entry.database or "") == (adapter.entry.database or "")}


@external_group.command("list")
@dsn_option
@friendly_errors
@click.pass_obj
def list_cmd(obj) -> None:
    """Each [[external_queues]] entry: system, table, and the actions the console may take."""
    for a in adapters(obj.config):
        schema, table = a.queue_table
        acts = ", ".join(a.actions) if a.actions else (a.read_only_reason or "none")
        click.echo(f"{a.name:<16} {a.system:<16} {schema}.{table:<24} actions: {acts}")


def _print_rows(found: list[dict], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(found, default=str, indent=2))
        return
    if not found:
        click.echo("no dead letters")
    for r in found:
        when = f"{r['failed_at']:%Y-%m-%d %H:%M:%S}" if r["failed_at"] else "-"
        error = (r["error"] or "").splitlines()[0][:80] if r["error"] else ""
        click.echo(f"  {r['key']:<40} {r['queue']:<16} failed {when}  attempts {r['attempts'] if r['attempts'] is not None else '-'}  {error}")


@external_group.command("dead-letters")
@dsn_option
@click.argument("name")
@click.option("--queue", default=None, help="Only this queue.")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@friendly_errors
@click.pass_obj
def dead_letters_cmd(obj, name: str, queue: str | None, limit: int, as_json: bool) -> None:
    """The source's dead letters, newest failure first (read only)."""
    adapter = _adapter(obj, name)
    sel = xa.Selection(queue=queue) if queue else None
    with xa.open_source(adapter, _console_dsn(obj, adapter), application_name="skiplock-cli") as src:
        _print_rows(xa.list_dead_letters(src, adapter, sel, limit=limit), as_json)


def _selection(queue, keys, select_all) -> xa.Selection:
    if not (queue or keys or select_all):
        raise click.UsageError("say which dead letters: --queue, --key (repeatable), or --all for every one")
    return xa.Selection(queue=queue, keys=tuple(k for chunk in keys for k in chunk.split(",") if k.strip()) or None,
                        all=bool(select_all))


def _bulk_options(func):
    options = [
        click.argument("name"),
        click.option("--queue", default=None, help="Only this queue."),
        click.option("--key", "keys", multiple=True, help="A job key (repeat, or comma-separate, for several)."),
        click.option("--all", "select_all", is_flag=True, help="Every dead letter of the source."),
        click.option("--dry-run", is_flag=True, help="Print the preview (count, sample, filter) and change nothing."),
        click.option("--batch-size", type=int, default=None, help="Jobs per transaction [config: maintenance.batch_size]."),
        click.option("--rate", type=float, default=None, help="Most jobs per second [config: maintenance.bulk_rate]."),
        click.option("--sample", type=click.IntRange(0, 100), default=5, show_default=True, help="Rows shown by the preview."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _bulk(obj, action: str, name, queue, keys, select_all, dry_run, batch_size, rate, sample, actor, reason) -> None:
    adapter = _adapter(obj, name)
    selection = _selection(queue, keys, select_all)
    kind_of = bulk_action(action, {"ids": list(selection.keys)} if selection.keys and not queue else {"queue": queue})
    if not dry_run:
        xa.require_action(adapter, action)  # before anything connects
        if not interactive():
            reason = resolve_reason(kind_of, reason)
    settings = MaintenanceSettings.from_config(obj.config)
    batch_size = settings.batch_size if batch_size is None else batch_size
    rate = settings.bulk_rate if rate is None else rate
    if rate is not None and not rate > 0:
        raise click.UsageError(f"--rate must be greater than 0 jobs per second (got {rate:g})")
    check_batching(batch_size, rate)
    console_dsn = _console_dsn(obj, adapter)
    with connect(console_dsn, application_name="skiplock-cli") as console:
        require_schema(console)
        src = console if not adapter.entry.dsn else xa.open_source(adapter, console_dsn, application_name="skiplock-cli")
        try:
            preview = xa.preview(src, adapter, selection, sample=sample)
            more = "more than " if preview.too_many else ""
            click.echo(f"{more}{preview.total} dead letters of {adapter.name} ({adapter.system}) to {action}: {preview.description}")
            _print_rows(preview.sample, False)
            if preview.total > len(preview.sample) and preview.sample:
                click.echo(f"  ... and {preview.total - len(preview.sample)} more")
            if dry_run:
                click.echo("dry run: nothing changed")
                return
            click.echo(f"how: {adapter.offered[action]}")
            reason = resolve_reason(kind_of, reason)
            op_id = xa.start(console, src, adapter, action, selection, actor=actor, reason=reason, rate=rate,
                             batch_size=batch_size, preview=preview.bound(), database_name=adapter.entry.database or None)
        finally:
            if src is not console:
                src.close()
        click.echo(f"operation #{op_id}: {action} of {xa.progress(console, op_id)['total']} jobs started")
        _follow(console, console_dsn, op_id, _sources(obj, adapter), actor)


def _follow(console, console_dsn: str, op_id: int, sources: dict, actor: str) -> None:
    """Run the operation in a thread and print its progress; Ctrl-C/SIGTERM cancels it."""
    from console.cli.maintenance import _stop_on_signals

    stop = _stop_on_signals()
    errors: list[BaseException] = []

    def target():
        try:
            xa.run(console_dsn, op_id, sources)
        except BaseException as exc:  # recorded on the operation row too
            errors.append(exc)

    thread = threading.Thread(target=target, name=f"skiplock-external-{op_id}", daemon=True)
    thread.start()
    last, cancelled = None, False
    while thread.is_alive():
        thread.join(0.5)
        if stop.is_set() and not cancelled:
            cancelled = True
            click.echo("cancelling (stops after the current batch) ...")
            xa.cancel(console, op_id, actor=actor, reason="interrupted from the command line")
        p = xa.progress(console, op_id)
        if p["worked"] != last:
            last = p["worked"]
            click.echo(f"  {p['worked']}/{p['total']} ({p['percent']}%)")
    final = xa.progress(console, op_id)
    click.echo(f"operation #{op_id}: {final['state']}, {final['done']} of {final['total']} jobs changed, "
               f"{final['skipped']} no longer dead letters" + (f" ({final['error']})" if final["error"] else ""))
    if final["state"] != "done":
        sys.exit(1)


@external_group.command("replay")
@dsn_option
@_bulk_options
@who_and_why()
@friendly_errors
@click.pass_obj
def replay_cmd(obj, actor, reason, **options) -> None:
    """Replay dead letters of an external queue the library's way (previewed, batched, audited)."""
    _bulk(obj, "replay", actor=actor, reason=reason, **options)


@external_group.command("purge")
@dsn_option
@_bulk_options
@who_and_why()
@friendly_errors
@click.pass_obj
def purge_cmd(obj, actor, reason, **options) -> None:
    """Purge dead letters of an external queue the library's way (previewed, batched, audited)."""
    _bulk(obj, "purge", actor=actor, reason=reason, **options)


@external_group.command("cancel")
@dsn_option
@click.argument("name")
@click.argument("keys", nargs=-1, required=True)
@who_and_why("cancel_job")
@friendly_errors
@click.pass_obj
def cancel_cmd(obj, name: str, keys: tuple[str, ...], actor: str, reason: str | None) -> None:
    """Cancel waiting jobs of an external queue (by key) the library's way."""
    adapter = _adapter(obj, name)
    xa.require_action(adapter, "cancel")
    console_dsn = _console_dsn(obj, adapter)
    with connect(console_dsn, application_name="skiplock-cli") as console:
        require_schema(console)
        with xa.open_source(adapter, console_dsn, application_name="skiplock-cli") as src:
            out = xa.cancel_jobs(console, src, adapter, list(keys), actor=actor, reason=reason)
    click.echo(f"cancelled {out.changed} of {out.asked} jobs ({adapter.offered['cancel']})")


def _pause(obj, name: str, queue: str, paused: bool, actor: str, reason: str | None) -> None:
    adapter = _adapter(obj, name)
    xa.require_action(adapter, "pause" if paused else "resume")
    console_dsn = _console_dsn(obj, adapter)
    with connect(console_dsn, application_name="skiplock-cli") as console:
        require_schema(console)
        with xa.open_source(adapter, console_dsn, application_name="skiplock-cli") as src:
            xa.set_paused(console, src, adapter, queue, paused, actor=actor, reason=reason)
    click.echo(f"queue {queue!r} of {adapter.name} ({adapter.system}) {'paused' if paused else 'resumed'}")


@external_group.command("pause")
@dsn_option
@click.argument("name")
@click.argument("queue")
@who_and_why("pause")
@friendly_errors
@click.pass_obj
def pause_cmd(obj, name: str, queue: str, actor: str, reason: str | None) -> None:
    """Pause QUEUE of an external source, where its library has a pause (BullMQ)."""
    _pause(obj, name, queue, True, actor, reason)


@external_group.command("resume")
@dsn_option
@click.argument("name")
@click.argument("queue")
@who_and_why("resume")
@friendly_errors
@click.pass_obj
def resume_cmd(obj, name: str, queue: str, actor: str, reason: str | None) -> None:
    """Resume QUEUE of an external source."""
    _pause(obj, name, queue, False, actor, reason)


@external_group.command("operations")
@dsn_option
@click.option("--source", default=None, metavar="NAME", help="Only this source's operations.")
@click.option("--cancel", "cancel_id", type=int, default=None, help="Ask operation ID to stop between batches.")
@click.option("--resume", "resume_id", type=int, default=None, help="Resume cancelled/failed operation ID and run it here.")
@click.option("--resume-abandoned", is_flag=True, help="Finish operations whose process died.")
@click.option("--limit", type=click.IntRange(1, 500), default=10, show_default=True)
@who_and_why("operation_cancel")
@friendly_errors
@click.pass_obj
def operations_cmd(obj, source, cancel_id, resume_id, resume_abandoned, limit, actor, reason) -> None:
    """List recent replays and purges of external queues; cancel or resume one."""
    sources = {a.name: a for a in adapters(obj.config, obj.database.name if obj.config.tables.get("databases") else None)}
    with connect(obj.dsn, application_name="skiplock-cli") as console:
        require_schema(console)
        if cancel_id is not None:
            p = xa.cancel(console, cancel_id, actor=actor, reason=reason)
            click.echo(f"operation #{cancel_id}: {'cancelled' if p['state'] == 'cancelled' else 'cancel requested'}")
            return
        if resume_id is not None:
            op = xa.progress(console, resume_id)
            adapter = sources.get(op["source"])
            if adapter is None:
                raise click.UsageError(f"operation #{resume_id}'s source {op['source']!r} is not in [[external_queues]]")
            reason = resolve_reason("operation_resume", reason)
            xa.resume(console, resume_id, actor=actor, reason=reason, adapter=adapter)
            _follow(console, obj.dsn, resume_id, sources, actor)
            return
        if resume_abandoned:
            done = xa.resume_abandoned(obj.dsn, sources)
            click.echo(f"resumed: {', '.join(f'#{i}' for i in done) or 'none'}")
            return
        for op in xa.recent(console, source=source, limit=limit):
            click.echo(f"#{op['id']:<6} {op['action']:<7} {op['state']:<10} {op['source']} ({op['system']}) "
                       f"{op['done']}+{op['skipped']} skipped/{op['total']} ({op['percent']}%) by {op['actor']} "
                       f"at {op['created_at']:%Y-%m-%d %H:%M:%S}  {json.dumps(op['selection'])}")
