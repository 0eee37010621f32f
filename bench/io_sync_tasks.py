"""The threaded twin of bench/io_tasks.py: the same 50 ms wait, in a handler thread."""

import time

import skiplock

WAIT = 0.05


@skiplock.task("io")
def io(job: skiplock.Job) -> None:
    time.sleep(WAIT)
