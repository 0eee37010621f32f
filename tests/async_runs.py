"""The table tests/sample_async_tasks.py's handlers note their runs in. A module of its own: a test
that imports the tasks module registers its kinds (a_scarce has a concurrency) in the test
process, and a later in-process Worker of another test file would then try to claim them."""

RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS public.async_runs (
    job_id     bigint      NOT NULL,
    attempt    integer     NOT NULL,
    worker_pid integer     NOT NULL,
    thread     text        NOT NULL,
    event      text        NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
