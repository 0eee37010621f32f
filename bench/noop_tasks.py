"""The no-op handler the throughput benchmark's Skiplock workers run (`--tasks noop_tasks`)."""

import console


@console.task("noop")
def noop(job):
    return None
