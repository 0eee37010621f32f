"""Handlers for the collector tests' worker processes (`--tasks tests.collector_tasks`)."""

import console


@console.task("noop")
def noop(job):
    return None


@console.task("fail_once")
def fail_once(job):
    if job.attempt == 1:
        raise RuntimeError(f"first attempt of job {job.id} fails")
