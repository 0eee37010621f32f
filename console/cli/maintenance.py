"""Maintenance commands: reap, archive, retention, replay, purge, pause, resume, dead-letters,
operations.

Every command is a thin face over `console.maintenance`: the same functions the scheduler and
the web console call. Operator actions are audited with the actor `cli:<os user>@<host>` (or
`NAME (cli:<os user>@<host>)` with `--actor NAME`) and the `--reason`; the actions that need a
reason (console.actions.ACTIONS: replay of more than one job, purge, pause, resume, archive,
retention) ask for one on a terminal and otherwise stop with exit code 2 before touching anything.
`replay` and `purge` refuse to run without a filter or `--all`; `--dry-run` prints the preview
(exact count, a sample, the filter as understood) and changes nothing.
Exit codes: 0 done; 1 the operation failed or was cancelled; 2 bad input (nothing touched).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from datetime import UTC, datetime

import click

from console import maintenance as m
from console.actions import bulk_action
from console.caps import Caps
from console.cli.common import (
    DURATION,
    dsn_option,
    friendly_errors,
    interactive,
    main_group,
    parse_duration,
    resolve_reason,
    who_and_why,
)
from console.db import connect, require_schema
from console.maintenance import brokerdlq, bulk
from console.maintenance import edit_replay as er
from console.maintenance.archive import check_batching
from console.maintenance.deadletters import count as count_dead
from console.maintenance.deadletters import group_hint
from console.queue import broker
from console.redaction import DEFAULT_KEYS, key_set


def _settings(obj) -> m.MaintenanceSettings:
    return m.MaintenanceSettings.from_config(obj.config)


def _stop_on_signals() -> threading.Event:
    """SIGTERM and Ctrl-C stop a maintenance loop between two batches."""
    stop = threading.Event()

    def handler(signum, frame):
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        return stop  # signals can only be handled in the main thread
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(restore)
    return stop


def _report(result: m.RunResult, verb: str) -> None:
    slowest = f"{result.slowest_batch_ms:.1f} ms" if result.slowest_batch_ms is not None else "-"
    click.echo(f"{verb} {result.rows} rows in {result.batches} batches, {result.seconds:.2f} s "
               f"(slowest batch {slowest}); maintenance run #{result.run_id}: {result.outcome}")


def _rate_option(help_text: str):
    return click.option("--rate", type=float, default=None, help=help_text)


def _check_rate(rate: float | None) -> None:
    if rate is not None and not rate > 0:
        raise click.UsageError(f"--rate must be greater than 0 rows per second (got {rate:g})")


@main_group.command("reap")
@dsn_option
@click.option("--batch-size", type=int, default=None, help="Most jobs per transaction [config: maintenance.batch_size].")
@who_and_why("reap")
@friendly_errors
@click.pass_obj
def reap_cmd(obj, batch_size: int | None, actor: str, reason: str | None) -> None:
    """Rescue running jobs whose lease expired, now (back to pending, or failed when out of attempts)."""
    s = _settings(obj)
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        result = m.reap(conn, actor=actor, reason=reason, batch_size=s.batch_size if batch_size is None else batch_size,
                        backoff_base=obj.config.queue.backoff_base, backoff_cap=obj.config.queue.backoff_cap,
                        history=s.error_history)
    _report(result, "reaped")
    click.echo(f"  back to pending: {result.detail['pending']}, dead letters: {result.detail['failed']}")


@main_group.command("archive")
@dsn_option
@click.option("--older-than", type=DURATION, default=None, help="Completed jobs finished longer ago than this, e.g. 1h, 7d [config: maintenance.archive_after].")
@click.option("--mode", type=click.Choice(["archive", "delete"]), default=None, help="Move to the archive or delete [config: maintenance.archive_mode].")
@click.option("--batch-size", type=int, default=None, help="Most jobs per transaction [config: maintenance.batch_size].")
@_rate_option("Most rows per second [config: maintenance.rate].")
@click.option("--max-batches", type=int, default=None, help="Stop after this many batches.")
@who_and_why("archive")
@friendly_errors
@click.pass_obj
def archive_cmd(obj, older_than, mode, batch_size, rate, max_batches, actor, reason) -> None:
    """Move completed jobs out of the hot table in bounded batches (Ctrl-C stops between batches)."""
    _check_rate(rate)
    s = _settings(obj)
    kwargs = s.archive_kwargs()
    kwargs.update({k: v for k, v in {"older_than": older_than, "mode": mode, "batch_size": batch_size,
                                     "rate": rate}.items() if v is not None})
    stop = _stop_on_signals()
    with connect(obj.dsn, application_name="skiplock-archive") as conn:
        require_schema(conn)
        result = m.archive_completed(conn, **kwargs, max_batches=max_batches, actor=actor, reason=reason, stop=stop)
    _report(result, "archived" if kwargs["mode"] == "archive" else "deleted")
    if result.outcome != "ok":
        sys.exit(1)


@main_group.command("retention")
@dsn_option
@click.option("--older-than", type=DURATION, default=None, help="Archived jobs finished longer ago than this [config: maintenance.archive_retention].")
@click.option("--batch-size", type=int, default=None, help="Most rows per transaction [config: maintenance.batch_size].")
@who_and_why("retention")
@friendly_errors
@click.pass_obj
def retention_cmd(obj, older_than, batch_size, actor, reason) -> None:
    """Remove old archived jobs (drop whole day partitions, batch-delete the rest)."""
    s = _settings(obj)
    kwargs = s.retention_kwargs()
    if older_than is not None:
        kwargs["retention"] = older_than
    if batch_size is not None:
        kwargs["batch_size"] = batch_size
    with connect(obj.dsn, application_name="skiplock-retention") as conn:
        require_schema(conn)
        result = m.apply_retention(conn, **kwargs, actor=actor, reason=reason, stop=_stop_on_signals())
    _report(result, "deleted")
    dropped = result.detail.get("partitions_dropped") or []
    if dropped:
        click.echo(f"  dropped {len(dropped)} partitions (~{result.detail['estimated_rows_dropped']} rows): {', '.join(dropped)}")


@main_group.command("pause")
@dsn_option
@click.argument("queue")
@click.option("--create", is_flag=True,
              help="Pause QUEUE even though no queue has that name yet (before its first job). "
                   "Without it an unknown name is refused as a typo.")
@who_and_why("pause")
@friendly_errors
@click.pass_obj
def pause_cmd(obj, queue: str, create: bool, actor: str, reason: str | None) -> None:
    """Stop workers claiming from QUEUE (its jobs wait; running ones finish)."""
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        m.pause_queue(conn, queue, actor=actor, reason=reason, create=create,
                       cap=obj.config.caps.paused_queues)
    click.echo(f"queue {queue!r} paused" + (" (a new queue: none had that name)" if create else ""))


@main_group.command("resume")
@dsn_option
@click.argument("queue")
@who_and_why("resume")
@friendly_errors
@click.pass_obj
def resume_cmd(obj, queue: str, actor: str, reason: str | None) -> None:
    """Let workers claim from QUEUE again."""
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        m.resume_queue(conn, queue, actor=actor, reason=reason, create=False)
    click.echo(f"queue {queue!r} resumed")


# --- dead letters ---------------------------------------------------------------------------


def _time_arg(option: str, text: str | None) -> str | None:
    """--failed-since/--failed-before: an ISO time, or a duration meaning "that long ago"."""
    if text is None:
        return None
    try:
        return (datetime.now(UTC) - parse_duration(text)).isoformat()
    except ValueError:
        pass
    try:
        datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise click.UsageError(f"{option}: {text!r} is neither a time (2026-11-30T03:00Z) nor a duration ago (90s, 15m, 1h, 7d)") from None
    return text


def _selection(ids, queue, kind, group, failed_since, failed_before, payload, select_all) -> m.Selection:
    data = {
        "ids": [int(i) for chunk in ids for i in str(chunk).split(",") if i.strip()] if ids else None,
        "queue": queue,
        "kind": kind,
        "fingerprint": group,
        "failed_since": _time_arg("--failed-since", failed_since),
        "failed_before": _time_arg("--failed-before", failed_before),
        "payload": payload,
        "all": True if select_all else None,
    }
    if not any(v is not None for v in data.values()):
        raise click.UsageError("say which dead letters: --id, --queue, --kind, --group, --failed-since, "
                               "--failed-before, --payload, or --all for every one")
    return m.Selection.from_dict(data)


def _selection_options(func):
    options = [
        click.option("--id", "ids", multiple=True, help="A job id (repeat, or comma-separate, for several)."),
        click.option("--queue", default=None, help="Only this queue."),
        click.option("--kind", default=None, help="Only this kind."),
        click.option("--group", default=None, metavar="FINGERPRINT", help="Only this error group (see `skiplock dead-letters`)."),
        click.option("--failed-since", default=None, metavar="T", help="Failed at or after T (ISO time, or a duration ago: 2h)."),
        click.option("--failed-before", default=None, metavar="T", help="Failed before T (ISO time, or a duration ago)."),
        click.option("--payload", default=None, metavar="JSON", help="Payload contains this JSON object (@>)."),
        click.option("--all", "select_all", is_flag=True, help="Every dead letter (required when no filter is given)."),
        click.option("--dry-run", is_flag=True, help="Print the preview (count, sample, filter) and change nothing."),
        click.option("--batch-size", type=int, default=None, help="Jobs per transaction [config: maintenance.batch_size]."),
        _rate_option("Most jobs per second [config: maintenance.bulk_rate]."),
        click.option("--sample", type=click.IntRange(0, 100), default=5, show_default=True, help="Rows shown by the preview."),
        click.option("--backend", type=click.Choice(broker.BACKENDS), default=None,
                     help="Where the dead letters are: postgres (skiplock.jobs) or nats (the queue's dead-letter "
                          "stream). Default: the --queue's backend, postgres without --queue."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _print_preview(preview: m.Preview, action: str) -> None:
    click.echo(f"{preview.total} dead letters to {action}: {preview.description}")
    for row in preview.sample:
        error = (row["last_error"] or "").splitlines()[0][:80] if row["last_error"] else ""
        click.echo(f"  #{row['id']:<10} {row['queue']:<12} {row['kind']:<16} failed {row['finished_at']:%Y-%m-%d %H:%M:%S} "
                   f"after {row['attempts']} attempts  {error}")
    if preview.total > len(preview.sample) and preview.sample:
        click.echo(f"  ... and {preview.total - len(preview.sample)} more")


def _bulk(obj, action: str, purge_mode: str, ids, queue, kind, group, failed_since, failed_before, payload,
          select_all, dry_run, actor, reason, batch_size, rate, sample, backend) -> None:
    _check_rate(rate)
    selection = _selection(ids, queue, kind, group, failed_since, failed_before, payload, select_all)
    # Which row of the table: one id is a single replay (reason optional), anything else needs one.
    kind_of = bulk_action(action, selection.to_dict())
    if backend == "nats":
        brokerdlq.broker_selection(selection)  # refuse a selection the broker cannot serve before anything
    if not dry_run and not interactive():
        reason = resolve_reason(kind_of, reason)  # refuse before connecting; a terminal is asked after the preview
    s = _settings(obj)
    batch_size = s.batch_size if batch_size is None else batch_size
    rate = s.bulk_rate if rate is None else rate
    check_batching(batch_size, rate)  # refuse before printing anything
    dsn = obj.dsn
    with connect(dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        if backend is None and queue is not None:
            backend = broker.backend_of(conn, selection.queue)
        if backend == "nats":
            _broker_bulk(obj, conn, action, purge_mode, selection, kind_of, dry_run=dry_run, actor=actor,
                         reason=reason, batch_size=batch_size, rate=rate, sample=sample)
            return
        preview = m.preview(conn, selection, sample=sample)
        _print_preview(preview, action)
        if preview.total == 0 and group:
            # A message copied from a page is not its group's fingerprint: name the nearest ones.
            click.echo(f"no dead letter is in error group {group!r}{group_hint(conn, group)}")
        if dry_run:
            click.echo("dry run: nothing changed")
            return
        reason = resolve_reason(kind_of, reason)
        # Bound to what was just printed: no job that failed after the preview is touched, and
        # a selection that changed in between is refused (exit 2: preview again).
        op_id = m.start(conn, action, selection, actor=actor, reason=reason, rate=rate,
                        batch_size=batch_size, purge_mode=purge_mode, preview=preview.bound(),
                        caps=Caps.from_config(obj.config))
        click.echo(f"operation #{op_id}: {action} of {m.progress(conn, op_id)['total']} jobs started")
        _follow(conn, dsn, op_id, s.error_history, actor)


def _broker_bulk(obj, conn, action: str, purge_mode: str, selection: m.Selection, kind_of: str, *, dry_run: bool,
                 actor: str, reason: str | None, batch_size: int, rate: float | None, sample: int) -> None:
    """Replay or purge a broker queue's dead letters (console.maintenance.brokerdlq): the same
    preview, reason and audit rows; it runs here, synchronously, bounded by the preview's scan."""
    if purge_mode == "archive":
        raise click.UsageError("--to-archive: a broker queue's dead letters have no archive (they are messages of a "
                               "stream); a purge deletes them")
    sel = brokerdlq.broker_selection(selection)
    nats_url, timeout = obj.config.broker.nats_url, obj.config.broker.publish_timeout
    try:
        preview = brokerdlq.preview(nats_url, sel, sample=sample, timeout=timeout)
    except brokerdlq.BrokerUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{preview.total} dead letters to {action}: {preview.description}")
    for row in preview.sample:
        error = (row["last_error"] or "").splitlines()[0][:80] if row["last_error"] else ""
        failed = f"{row['failed_at']:%Y-%m-%d %H:%M:%S}" if row["failed_at"] else "?"
        click.echo(f"  #{row['id'] if row['id'] is not None else '?':<10} {sel.queue:<12} {row['kind'] or '?':<16} "
                   f"failed {failed} after {row['attempts']} attempts  {error}  (seq {row['seq']})")
    if preview.total > len(preview.sample) and preview.sample:
        click.echo(f"  ... and {preview.total - len(preview.sample)} more")
    if preview.more:
        click.echo(f"  the stream holds more messages than the {brokerdlq.SCAN:,} read (up to sequence "
                   f"{preview.max_seq}): this run does those; run it again for the rest")
    left = count_dead(conn, m.Selection(queue=sel.queue))
    if left:
        click.echo(f"  note: {left} dead letter{'s' if left != 1 else ''} of queue {sel.queue!r} are in skiplock.jobs "
                   "(from before its move to nats): --backend postgres replays or purges those")
    if dry_run:
        click.echo("dry run: nothing changed")
        return
    reason = resolve_reason(kind_of, reason)
    try:
        result = brokerdlq.run(conn, nats_url, action, sel, actor=actor, reason=reason, preview=preview.bound(),
                               batch_size=min(batch_size, 10_000), rate=rate, timeout=timeout)
    except brokerdlq.BrokerUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    verb = "replayed (published to the job stream, then deleted)" if action == "replay" else "purged (deleted)"
    click.echo(f"{result.done} of {result.total} dead letters {verb} in {result.batches} batches, "
               f"{result.seconds:.2f} s" + (f"; {result.gone} were gone already" if result.gone else "")
               + f" (audit rows {', '.join(str(i) for i in result.audit_ids)})")


def _follow(conn, dsn: str, op_id: int, history: int, actor: str) -> None:
    """Run the operation in a thread, print its progress; Ctrl-C/SIGTERM cancels it."""
    stop = _stop_on_signals()
    errors: list[BaseException] = []

    def target():
        try:
            bulk.run(dsn, op_id, history=history)
        except BaseException as exc:  # recorded on the operation row too
            errors.append(exc)

    thread = threading.Thread(target=target, name=f"skiplock-bulk-{op_id}", daemon=True)
    thread.start()
    last = None
    cancelled = False
    while thread.is_alive():
        thread.join(0.5)
        if stop.is_set() and not cancelled:
            cancelled = True
            click.echo("cancelling (stops after the current batch) ...")
            m.cancel(conn, op_id, actor=actor, reason="interrupted from the command line")
        p = m.progress(conn, op_id)
        if p["done"] != last:
            last = p["done"]
            click.echo(f"  {p['done']}/{p['total']} ({p['percent']}%)")
    final = m.progress(conn, op_id)
    click.echo(f"operation #{op_id}: {final['state']}, {final['done']} of {final['total']} jobs"
               + (f" ({final['error']})" if final["error"] else ""))
    if final["state"] != "done":
        sys.exit(1)


@main_group.command("replay")
@dsn_option
@_selection_options
@click.option("--set-payload", default=None, metavar="JSON",
              help="Fix and replay one job (--id N): its new payload. [redacted] at a sensitive key keeps the stored value.")
@click.option("--set-priority", default=None, metavar="P", help="Fix and replay one job: its new priority.")
@click.option("--set-queue", default=None, metavar="Q", help="Fix and replay one job: its new queue (one that exists).")
@click.option("--set-run-at", default=None, metavar="TS", help="Fix and replay one job: when it runs (ISO 8601; default now).")
@click.option("--yes", is_flag=True, help="Fix and replay: apply after printing the diff, without asking.")
@who_and_why()
@friendly_errors
@click.pass_obj
def replay_cmd(obj, set_payload, set_priority, set_queue, set_run_at, yes, **options) -> None:
    """Return dead letters to pending with a fresh attempt budget (previewed, batched, audited).

    With --set-payload/--set-priority/--set-queue/--set-run-at and one --id: fix and replay
    that job (the diff is printed, redacted; a reason is required; asks before applying unless
    --yes)."""
    edits = {"payload": set_payload, "priority": set_priority, "queue": set_queue, "run_at": set_run_at}
    if any(v is not None for v in edits.values()):
        _edit_replay(obj, {k: v for k, v in edits.items() if v is not None}, yes=yes, **options)
        return
    if yes:
        raise click.UsageError("--yes goes with the --set-... options (fix and replay); a replay prints its preview "
                               "and runs")
    _bulk(obj, "replay", "delete", **options)


def _edit_replay(obj, fields: dict[str, str], *, yes: bool, ids, queue, kind, group, failed_since, failed_before,
                 payload, select_all, dry_run, actor, reason, batch_size, rate, sample, backend) -> None:
    """`skiplock replay --id N --set-...`: console.maintenance.edit_replay, as the console's page does it."""
    if backend == "nats":
        raise click.UsageError("the --set-... options fix and replay a dead letter of skiplock.jobs; a broker "
                               "queue's dead letters are replayed as they are")
    job_ids = [i for chunk in ids for i in str(chunk).split(",") if i.strip()]
    others = {"--queue": queue, "--kind": kind, "--group": group, "--failed-since": failed_since,
              "--failed-before": failed_before, "--payload": payload, "--all": select_all or None,
              "--batch-size": batch_size, "--rate": rate}
    given = [name for name, value in others.items() if value is not None]
    if len(job_ids) != 1 or given:
        raise click.UsageError("the --set-... options fix and replay one job: give exactly one --id"
                               + (f" and no {', '.join(given)}" if given else ""))
    if not job_ids[0].strip().isdigit():
        raise click.UsageError(f"--id: {job_ids[0]!r} is not a job id")
    job_id = int(job_ids[0])
    edit = er.parse_edit(fields, payload_is_text=True)  # InvalidEdit: exit 2 naming the field
    if not dry_run and not interactive():
        reason = resolve_reason("edit_replay", reason)  # refuse before connecting
    keys = DEFAULT_KEYS | key_set(obj.config.web.redact_keys)
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        try:
            shown = er.preview(conn, job_id, edit, keys=keys)
        except er.JobNotFound as exc:
            raise click.UsageError(str(exc)) from None
        except er.EditConflict as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"fix and replay job {job_id} ({shown.job['kind']} in {shown.job['queue']}), "
                   f"{len(shown.changes)} change{'s' if len(shown.changes) != 1 else ''}:")
        for change in shown.changes:
            where = change["path"] or ""
            old = "" if change["old"] is None else json.dumps(change["old"], ensure_ascii=False, default=str)
            new = "" if change["new"] is None else json.dumps(change["new"], ensure_ascii=False, default=str)
            click.echo(f"  {change['field']:<8} {where:<24} {change['change']:<8} {old} -> {new}")
        if shown.more:
            click.echo(f"  ... and {shown.more} more changes")
        if dry_run:
            click.echo("dry run: nothing changed")
            return
        if not yes:
            if not interactive():
                raise click.UsageError("pass --yes to apply (nothing changed: the diff above is what would be done)")
            click.confirm(f"Apply and replay job {job_id}?", abort=True)
        reason = resolve_reason("edit_replay", reason)
        try:
            done = er.apply(conn, job_id, edit, version=shown.version, actor=actor, reason=reason, keys=keys,
                            history=_settings(obj).error_history)
        except er.EditConflict as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"job {job_id} edited ({', '.join(done['fields'])}) and replayed: {done['status']} in queue "
               f"{done['queue']} (audit row {done['audit_id']})")


@main_group.command("purge")
@dsn_option
@_selection_options
@click.option("--to-archive", is_flag=True, help="Move them to the archive marked purged instead of deleting them.")
@who_and_why()
@friendly_errors
@click.pass_obj
def purge_cmd(obj, to_archive: bool, **options) -> None:
    """Remove dead letters (previewed, batched, audited)."""
    _bulk(obj, "purge", "archive" if to_archive else "delete", **options)


@main_group.command("dead-letters")
@dsn_option
@click.option("--queue", default=None, help="Only this queue.")
@click.option("--kind", default=None, help="Only this kind.")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@friendly_errors
@click.pass_obj
def dead_letters_cmd(obj, queue, kind, limit, as_json) -> None:
    """Error groups: dead letters by fingerprint, largest first (use one with --group)."""
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        found = m.groups(conn, queue=queue, kind=kind, limit=limit)
    if as_json:
        click.echo(json.dumps(found, default=str, indent=2))
        return
    if not found:
        click.echo("no dead letters")
    for g in found:
        queues = ", ".join(g["queues"]) + (f" and {g['queue_count'] - len(g['queues'])} more" if g["queue_count"] > len(g["queues"]) else "")
        kinds = ", ".join(g["kinds"]) + (f" and {g['kind_count'] - len(g['kinds'])} more" if g["kind_count"] > len(g["kinds"]) else "")
        click.echo(f"{g['count']:>8}  {g['fingerprint']}\n          queues {queues}; kinds {kinds}; "
                   f"first {g['first_seen']:%Y-%m-%d %H:%M}, last {g['last_seen']:%Y-%m-%d %H:%M}")
    if found and found[0]["total_groups"] > len(found):
        click.echo(f"... and {found[0]['total_groups'] - len(found):,} more groups (a larger --limit, or --queue / --kind)")


@main_group.command("operations")
@dsn_option
@click.option("--cancel", "cancel_id", type=int, default=None, help="Ask operation ID to stop between batches.")
@click.option("--resume", "resume_id", type=int, default=None, help="Resume cancelled/failed operation ID and run it here.")
@click.option("--resume-abandoned", is_flag=True, help="Finish operations whose process died.")
@click.option("--limit", type=click.IntRange(1, 500), default=10, show_default=True)
@who_and_why("operation_cancel")
@friendly_errors
@click.pass_obj
def operations_cmd(obj, cancel_id, resume_id, resume_abandoned, limit, actor, reason) -> None:
    """List recent bulk replays and purges; cancel or resume one."""
    s = _settings(obj)
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        if cancel_id is not None:
            p = m.cancel(conn, cancel_id, actor=actor, reason=reason)
            click.echo(f"operation #{cancel_id}: {'cancelled' if p['state'] == 'cancelled' else 'cancel requested'}")
            return
        if resume_id is not None:
            m.resume(conn, resume_id, actor=actor, reason=reason, caps=Caps.from_config(obj.config))
            _follow(conn, obj.dsn, resume_id, s.error_history, actor)
            return
        if resume_abandoned:
            done = m.resume_abandoned(obj.dsn, history=s.error_history)
            click.echo(f"resumed: {', '.join(f'#{i}' for i in done) or 'none'}")
            return
        for op in m.recent_operations(conn, limit=limit):
            click.echo(f"#{op['id']:<6} {op['action']:<7} {op['state']:<10} {op['done']}/{op['total']} ({op['percent']}%)  "
                       f"by {op['actor']} at {op['created_at']:%Y-%m-%d %H:%M:%S}  {json.dumps(op['selection'])}")


