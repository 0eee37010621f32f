"""Skiplock's public API: enqueue jobs in your transaction, and declare their handlers.

    import skiplock

    @skiplock.task("send_email")
    def send_email(job: skiplock.Job) -> None:
        ...

    @skiplock.task("fetch_invoice", timeout=30)    # awaited on the worker's event loop
    async def fetch_invoice(job: skiplock.Job) -> None:
        ...

    with conn.transaction():                      # psycopg; SQLAlchemy and Django alike
        create_order(conn)
        skiplock.enqueue(conn, "send_email", {"order": 42})

    await skiplock.enqueue_async(session, "send_email", {"order": 42})   # async handles

Import this name, not `console`: the distribution installs its implementation as the package
`console`, a top-level name another distribution on the package index also uses. Everything an
application needs is here, typed (`py.typed`), and documented in docs/api.md; `console.*`
modules are the implementation and may move.
"""

from console.queue.periodic import schedule
from console.queue.producer import NewJob, enqueue, enqueue_async, enqueue_many, enqueue_many_async
from console.queue.protocol import BatchFailure, Cancelled, DoNotRetry, InvalidJob, Job, JobTimeout
from console.queue.schema import migrate
from console.queue.tasks import task

__all__ = [
    "BatchFailure",
    "Cancelled",
    "DoNotRetry",
    "InvalidJob",
    "Job",
    "JobTimeout",
    "NewJob",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "migrate",
    "schedule",
    "task",
]

