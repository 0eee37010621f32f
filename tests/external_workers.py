"""Real PGQueuer and Procrastinate processes for tests/test_external_libraries.py.

    python -m tests.external_workers pgqueuer-consume DSN   # a PGQueuer QueueManager
    procrastinate --app=tests.external_workers.app worker -q fast,slow   (PROCRASTINATE_DSN set)

Both run three kinds of job: `ok` succeeds, `boom` fails for good (PGQueuer: on_failure="hold",
so it stays as status 'failed'; Procrastinate: no retry, status 'failed'), `hang` prints
HANGING and sleeps until the process is killed (so its job stays picked/doing with a heartbeat
that stops: stuck). `waiting` jobs are enqueued where no consumer listens.

`flaky` (tests/test_external_actions.py) fails for good while the file named by $FLAKY_SWITCH
exists, and otherwise succeeds, writing one row per run into the table `runs` (job id, when)
of the database it works on: what a replayed job's run leaves behind, counted.
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta

import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("PROCRASTINATE_DSN", "")))


@app.task(name="ok", queue="fast")
async def ok() -> None:
    return None


@app.task(name="boom", queue="fast")
async def boom() -> None:
    raise RuntimeError("boom")


@app.task(name="hang", queue="slow")
async def hang() -> None:
    print("HANGING", flush=True)
    await asyncio.sleep(3600)


@app.task(name="waiting", queue="idle")
async def waiting() -> None:
    return None


def flaky_switch_on() -> bool:
    path = os.environ.get("FLAKY_SWITCH")
    return bool(path) and os.path.exists(path)


async def record_run(dsn: str, job_id: int) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("INSERT INTO runs (job_id) VALUES (%s)", (job_id,))


@app.task(name="flaky", queue="flaky", pass_context=True)
async def flaky(context) -> None:
    if flaky_switch_on():
        raise RuntimeError("flaky: the switch is on")
    await record_run(os.environ["PROCRASTINATE_DSN"], context.job.id)


async def pgqueuer_consume(dsn: str) -> None:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries, QueueManager

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    qm = QueueManager(Queries(PsycopgDriver(conn)))

    @qm.entrypoint("ok")
    async def ok_job(job) -> None:
        return None

    @qm.entrypoint("boom", on_failure="hold")
    async def boom_job(job) -> None:
        raise RuntimeError("boom")

    @qm.entrypoint("hang")
    async def hang_job(job) -> None:
        print("HANGING", flush=True)
        await asyncio.sleep(3600)

    @qm.entrypoint("flaky", on_failure="hold")
    async def flaky_job(job) -> None:
        if flaky_switch_on():
            raise RuntimeError("flaky: the switch is on")
        await record_run(dsn, job.id)

    print("CONSUMING", flush=True)

    await qm.run(dequeue_timeout=timedelta(seconds=1), heartbeat_timeout=timedelta(seconds=30))


async def pgqueuer_install(dsn: str) -> None:
    """PGQueuer's schema, as `pgq install` makes it (its CLI calls this same Queries.install with
    the default, durable settings) without a Python start per test: test_external_libraries.py
    runs the CLI itself."""
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await Queries(PsycopgDriver(conn)).install()


async def pgqueuer_produce(dsn: str, entrypoints: list[str]) -> None:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await Queries(PsycopgDriver(conn)).enqueue(entrypoints, [None] * len(entrypoints), [0] * len(entrypoints))


async def pgqueuer_sizes(dsn: str) -> dict[tuple[str, str], int]:
    """What PGQueuer itself reports: Queries.queue_size(), by (entrypoint, status)."""
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        out: dict[tuple[str, str], int] = {}
        for s in await Queries(PsycopgDriver(conn)).queue_size():
            out[(s.entrypoint, s.status)] = out.get((s.entrypoint, s.status), 0) + s.count
        return out


async def procrastinate_defer(dsn: str, names: list[str]) -> None:
    with app.replace_connector(procrastinate.PsycopgConnector(conninfo=dsn)):
        async with app.open_async():
            for name in names:
                await app.tasks[name].defer_async()


async def procrastinate_queues(dsn: str) -> dict[str, dict]:
    """What Procrastinate itself reports: JobManager.list_queues_async()."""
    with app.replace_connector(procrastinate.PsycopgConnector(conninfo=dsn)):
        async with app.open_async():
            return {q["name"]: q for q in await app.job_manager.list_queues_async()}


if __name__ == "__main__":
    if sys.argv[1] == "pgqueuer-consume":
        asyncio.run(pgqueuer_consume(sys.argv[2]))
