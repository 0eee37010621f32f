"""A handler that logs one INFO record and returns: contender `:logging` of bench/worker_ab.py.
With per-attempt logs the worker keeps the record with the attempt and completes the job with
it (console.queue.protocol.complete_logged); the application's own handler writes to /dev/null."""

import logging
import os

import console

logging.basicConfig(level=logging.INFO, stream=open(os.devnull, "w"))  # noqa: SIM115 (the process's lifetime)
log = logging.getLogger("bench.noop")


@console.task("noop")
def noop(job):
    log.info("job %s done", job.id)
