"""Skiplock: a PostgreSQL job queue done right, and the console that keeps it healthy.

The documented import name is `skiplock` (the same API; another distribution on the package
index also installs a top-level `console`). Code written against `console` keeps working:

    import console

    @console.task("send_email")
    def send_email(job):
        ...

    with conn.transaction():
        create_order(conn)
        console.enqueue(conn, "send_email", {"order": 42})

    @console.schedule("nightly-report", cron="0 3 * * *", timezone="Europe/Berlin")
    def nightly_report(job):  # a periodic job: the scheduler enqueues it once per slot
        ...
"""

from console.queue import (
    BatchFailure,
    Cancelled,
    DoNotRetry,
    InvalidJob,
    Job,
    JobTimeout,
    NewJob,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
)
from console.queue.periodic import schedule
from console.queue.tasks import task

__all__ = ["BatchFailure", "Cancelled", "DoNotRetry", "InvalidJob", "Job", "JobTimeout", "NewJob", "enqueue", "enqueue_async", "enqueue_many",
           "enqueue_many_async", "schedule", "task"]
