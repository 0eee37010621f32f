"""The engine: the code that runs inside the application (Skiplock's first product).

An application imports this package, directly or through `skiplock` (the documented name);
the on-call console (web, cli, scheduler, collectors, alerts, advisor, maintenance) reads the
same tables and calls these functions, but nothing here imports the console back
(tests/test_imports.py holds that). The rooms:

- `protocol`: claim, heartbeat, complete, fail, release, pause, reap, and `Job`;
- `producer`: enqueue and enqueue_many in the caller's transaction, from any handle;
- `handles`: how one statement runs on each handle (psycopg, asyncpg, SQLAlchemy, Django);
- `worker`: the worker runtime (`skiplock worker`);
- `aio`: its event loop for `async def` handlers;
- `tasks`: the handler registry (`@skiplock.task`);
- `limits`: fleet-wide concurrency and rate limits;
- `periodic`: cron and interval schedules (`@skiplock.schedule`);
- `schema`: `skiplock.migrate(conn)`, the schema from application code.

`from console import queue as q` gives the protocol and enqueue functions under one name
(`q.enqueue`, `q.claim`, ...), as when this package was one module; the worker, tasks, limits
and periodic modules are imported by name.
"""

from console.queue.producer import (
    COPY_THRESHOLD,
    NewJob,
    check_payload,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
)
from console.queue.protocol import (
    CONTROL_CHANNEL,
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_HISTORY,
    DEFAULT_LEASE,
    DEFAULT_MAX_ATTEMPTS,
    NOTIFY_CHANNEL,
    STATUSES,
    BatchFailure,
    Cancelled,
    DoNotRetry,
    InvalidJob,
    Job,
    JobTimeout,
    backoff_delay,
    claim,
    claim_cursor,
    complete,
    complete_and_claim,
    complete_logged,
    complete_many,
    error_entry,
    fail,
    get_job,
    heartbeat,
    pause,
    paused_queues,
    prune_unique_keys,
    reap,
    release,
    request_cancel,
    resume,
    set_paused,
    unique_window,
)

__all__ = [
    "CONTROL_CHANNEL", "COPY_THRESHOLD", "DEFAULT_BACKOFF_BASE", "DEFAULT_BACKOFF_CAP", "DEFAULT_HISTORY",
    "DEFAULT_LEASE", "DEFAULT_MAX_ATTEMPTS", "NOTIFY_CHANNEL", "STATUSES", "BatchFailure", "Cancelled", "DoNotRetry",
    "InvalidJob", "Job", "JobTimeout", "NewJob", "backoff_delay", "claim", "claim_cursor", "complete", "complete_and_claim",
    "complete_logged", "complete_many", "check_payload", "enqueue", "enqueue_async", "enqueue_many", "enqueue_many_async", "error_entry", "fail", "get_job", "heartbeat", "pause",
    "paused_queues", "prune_unique_keys", "reap", "release", "request_cancel", "resume", "set_paused",
    "unique_window",
]
