"""Skiplock: a PostgreSQL job queue done right, and the console that keeps it healthy.

Application code needs only this much:

    import console

    @console.task("send_email")
    def send_email(job):
        ...

    with conn.transaction():
        create_order(conn)
        console.enqueue(conn, "send_email", {"order": 42})
"""

from console.queue import Cancelled, DoNotRetry, Job, NewJob, enqueue, enqueue_many
from console.tasks import task

__all__ = ["Cancelled", "DoNotRetry", "Job", "NewJob", "enqueue", "enqueue_many", "task"]
