"""Queue commands: migrate, worker (PostgreSQL or NATS), relay, enqueue."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import click

from console import jsonbounds
from console import queue as q
from console.cli.common import dsn_option, friendly_errors, main_group
from console.db import DatabaseError, connect, migrate, require_schema
from console.queue import tasks
from console.redaction import DEFAULT_KEYS, key_set

# Said on stderr after a migrate that upgraded a schema. True of every release since 0.1.0: its
# migrations only add (tests/test_upgrade.py checks each file, and runs the previous release's
# workers and scheduler across this command).
UPGRADE_NOTE = (
    "Processes of the previous release keep working on this schema (migrations only add): "
    "restart workers, schedulers and consoles on this release in any order, at your pace. "
    "See CHANGELOG.md and docs/reliability.md, Upgrades."
)


@main_group.command("migrate")
@dsn_option
@click.option("--all", "all_databases", is_flag=True,
              help="Migrate every database of [[databases]], in order; stops at the first that fails.")
@friendly_errors
@click.pass_obj
def migrate_cmd(obj, all_databases: bool) -> None:
    """Create or update the skiplock schema (idempotent; safe to run from several processes)."""
    if all_databases and obj.database_name:
        raise click.UsageError("--all migrates every database: drop --database, or drop --all")
    targets = obj.databases if all_databases else [None]
    changed = False
    for database in targets:
        prefix = f"{database.name}: " if database is not None else ""
        dsn = database.dsn if database is not None else obj.dsn
        try:
            with connect(dsn, application_name="skiplock-migrate") as conn:
                applied = migrate(conn)
        except DatabaseError as exc:
            if database is None:
                raise
            raise click.ClickException(f"{prefix}{exc}") from None
        if applied:
            for name in applied:
                click.echo(f"{prefix}applied {name}")
            changed = changed or not applied[0].startswith("001_")  # an upgrade, not a new schema
        else:
            click.echo(f"{prefix}schema is up to date")
    if changed:
        click.echo(UPGRADE_NOTE, err=True)



def _cwd_hint(exc: ImportError) -> str:
    """The usual cause when a tasks module sits in the current directory: the `skiplock`
    command's import path does not include it (only `python -m` adds it)."""
    top = (getattr(exc, "name", None) or "").split(".")[0]
    here = Path.cwd()
    if top and isinstance(exc, ModuleNotFoundError) and ((here / f"{top}.py").is_file() or (here / top).is_dir()):
        return (f" ({top} is in the current directory, which is not on the `skiplock` command's import path: "
                f"install your application, or run it as PYTHONPATH=. skiplock ...)")
    return ""



@main_group.command("worker")
@dsn_option
@click.option("--tasks", "task_modules", required=True, help="Module(s) that register handlers, comma-separated (e.g. myapp.tasks).")
@click.option("--queues", default=None, help="Queues to work, comma-separated (default: all).")
@click.option("--concurrency", type=click.IntRange(min=1), default=None, help="Handler threads [config: worker.concurrency].")
@click.option("--async-concurrency", type=click.IntRange(min=1), default=None,
              help="Most async handlers awaited at once on the event loop [config: worker.async_concurrency].")
@click.option("--lease", type=click.FloatRange(min=0.1), default=None, help="Lease in seconds [config: worker.lease].")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Most jobs per claim [config: worker.batch_size].")
@click.option("--backend", type=click.Choice(["postgres", "nats"]), default="postgres", show_default=True,
              help="Where the jobs come from: skiplock.jobs, or NATS JetStream ([broker] nats_url; needs --queues "
                   "and the nats extra; docs/exit-plan.md).")
@friendly_errors
@click.pass_obj
def worker_cmd(obj, task_modules: str, queues: str | None, concurrency: int | None, async_concurrency: int | None,
               lease: float | None, batch_size: int | None, backend: str) -> None:
    """Run a worker process until SIGTERM/Ctrl-C (graceful) or a second signal (immediate)."""
    cfg = obj.config
    if backend == "nats":
        if not queues:
            raise click.UsageError("--backend nats needs --queues: a broker worker consumes named queues")
        from console.queue import broker

        for name in queues.split(","):
            broker.check_queue(name)
    try:
        tasks.load_modules(task_modules)
    except ImportError as exc:
        raise click.UsageError(f"--tasks: cannot import {task_modules!r}: {exc}{_cwd_hint(exc)}") from None
    if backend == "nats":
        sys.exit(_nats_worker(cfg, queues or "", concurrency, async_concurrency, lease, batch_size, _registry_dsn(obj)))
    from console.queue.worker import Worker

    worker = Worker(
        obj.dsn,
        queues=queues.split(",") if queues else None,
        concurrency=concurrency or cfg.worker.concurrency,
        async_concurrency=async_concurrency or cfg.worker.async_concurrency,
        batch_size=batch_size or cfg.worker.batch_size,
        claim_max=cfg.worker.claim_max,
        lease=lease or cfg.worker.lease,
        poll_interval=cfg.worker.poll_interval,
        shutdown_grace=cfg.worker.shutdown_grace,
        flush_interval=cfg.worker.flush_interval,
        backoff_base=cfg.queue.backoff_base,
        backoff_cap=cfg.queue.backoff_cap,
        history=cfg.queue.error_history,
        vacuum_interval=cfg.worker.vacuum_interval,
        complete_into_archive=cfg.worker.complete_into_archive,
        claim_resume_ms=cfg.worker.claim_resume_ms,
        # Fingerprints hide what viewers may not see (the defaults and web.redact_keys).
        secret_keys=DEFAULT_KEYS | key_set(cfg.web.redact_keys),
        # Per-attempt logs, redacted with the same keys before they are stored.
        log_records=cfg.worker.log_records,
        log_message_chars=cfg.worker.log_message_chars,
        log_attempt_chars=cfg.worker.log_attempt_chars,
        # The application's release, shown on the Workers page and as deploys on the timeline.
        release=cfg.worker.release,
    )
    worker.install_signal_handlers()
    sys.exit(worker.run())


def _registry_dsn(obj) -> str | None:
    """The database a broker worker registers in (skiplock.workers), or None when none is set:
    the broker worker needs PostgreSQL for nothing else."""
    try:
        return obj.dsn or None
    except Exception:  # noqa: BLE001 - no DATABASE_URL and no [database] dsn: it runs unregistered
        return None


def _nats_worker(cfg, queues: str, concurrency: int | None, async_concurrency: int | None, lease: float | None,
                 batch_size: int | None, dsn: str | None = None) -> int:
    try:
        from console.queue.broker.natsworker import NatsWorker, run_nats_worker
    except ImportError as exc:
        raise click.UsageError(f"--backend nats needs the nats extra (pip install 'skiplock[nats]'): {exc}") from None
    worker = NatsWorker(
        cfg.broker.nats_url,
        queues=[x for x in queues.split(",") if x],
        concurrency=concurrency or cfg.worker.concurrency,
        async_concurrency=async_concurrency or cfg.worker.async_concurrency,
        batch_size=batch_size or cfg.worker.batch_size,
        lease=lease or cfg.worker.lease,
        poll_interval=cfg.worker.poll_interval,
        shutdown_grace=cfg.worker.shutdown_grace,
        backoff_base=cfg.queue.backoff_base,
        backoff_cap=cfg.queue.backoff_cap,
        duplicate_window=cfg.broker.duplicate_window.total_seconds(),
        replicas=cfg.broker.replicas,
        dsn=dsn,
        flush_interval=cfg.worker.flush_interval,
        release=cfg.worker.release,
    )
    return run_nats_worker(worker)


@main_group.command("relay")
@dsn_option
@friendly_errors
@click.pass_obj
def relay_cmd(obj) -> None:
    """Publish the outbox of broker queues to NATS JetStream until SIGTERM/Ctrl-C: one leader per
    database, the others stand by ([broker] settings; docs/exit-plan.md)."""
    try:
        from console.queue.broker.relay import RelaySettings, run_relay
    except ImportError as exc:
        raise click.UsageError(f"the relay needs the nats extra (pip install 'skiplock[nats]'): {exc}") from None
    cfg = obj.config
    dsn = obj.dsn
    with connect(dsn, application_name="skiplock-relay") as conn:
        require_schema(conn)
    settings = RelaySettings(
        nats_url=cfg.broker.nats_url,
        batch_size=cfg.broker.relay_batch_size,
        poll_interval=cfg.broker.relay_poll_interval,
        publish_timeout=cfg.broker.publish_timeout,
        duplicate_window=cfg.broker.duplicate_window.total_seconds(),
        outbox_keep=cfg.broker.outbox_keep.total_seconds(),
        replicas=cfg.broker.replicas,
    )
    sys.exit(run_relay(dsn, settings))


@main_group.command("enqueue")
@dsn_option
@click.argument("kind")
@click.argument("payload", default="{}")
@click.option("--queue", default="default", show_default=True)
@click.option("--priority", type=int, default=0, show_default=True)
@click.option("--idempotency-key", default=None)
@click.option("--max-attempts", type=click.IntRange(min=1), default=None)
@click.option("--group", default=None, help="The job's group key (a tenant, customer or integration; a fair queue serves the groups in turn).")
@click.option("--unique-for", type=click.IntRange(min=1, max=366 * 86400), default=None, metavar="SECONDS",
              help="Uniqueness window for (KIND, --idempotency-key): a second enqueue inside it prints the first job's id.")
@friendly_errors
@click.pass_obj
def enqueue_cmd(obj, kind: str, payload: str, queue: str, priority: int, idempotency_key: str | None,
                max_attempts: int | None, group: str | None, unique_for: int | None) -> None:
    """Enqueue one job (PAYLOAD is JSON) and print its id."""
    try:
        data = jsonbounds.loads(payload, "PAYLOAD")
    except jsonbounds.TooDeep as exc:
        raise click.UsageError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise click.UsageError(f"PAYLOAD is not valid JSON: {exc}") from None
    with connect(obj.dsn, application_name="skiplock-cli", autocommit=False) as conn:
        require_schema(conn)
        try:
            job_id = q.enqueue(conn, kind, data, queue=queue, priority=priority, idempotency_key=idempotency_key,
                               max_attempts=max_attempts or obj.config.queue.max_attempts,
                               unique_for=timedelta(seconds=unique_for) if unique_for else None, group=group)
        except q.InvalidJob as exc:
            raise click.UsageError(str(exc)) from None
        conn.commit()
    click.echo(job_id)
