"""The child process of tests/test_scheduler_threads.py: a real `Scheduler.run()` whose every job
runs at a short interval, so that many of its APScheduler threads run and record at the same
moments, for `seconds` seconds; then it stops itself and prints, as JSON on stdout, how many
health records each job (and hook) attempted. The parent terminates the scheduler's sessions
meanwhile and compares the counts with skiplock.scheduler_jobs.

    python -m tests.scheduler_storm DSN SECONDS
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter

from console import scheduler
from console.config import load_config

INTERVAL = 0.05  # every job, so their runs and health records overlap all the time


class CountingScheduler(scheduler.Scheduler):
    """Counts each health record it attempts (one per run of a job or a hook)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def _record(self, name, *args, **kwargs):
        with self._count_lock:
            self.records[name] += 1
        return super()._record(name, *args, **kwargs)


def main(dsn: str, seconds: float) -> int:
    fast = {f"scheduler.{key}": INTERVAL for key in (
        "collect_interval", "reap_interval", "archive_interval", "retention_interval", "periodic_interval")}
    config = load_config(env={}, overrides={**fast, "scheduler.election_interval": 0.2,
                                            "alerts.delivery_interval": INTERVAL})
    s = CountingScheduler(dsn, config)
    for spec in s.jobs:  # bulk_resume and claim_indexes run at least every 30 s otherwise
        object.__setattr__(spec, "interval", INTERVAL)
    timer = threading.Timer(seconds, s.stop)
    timer.start()
    code = s.run()
    timer.cancel()
    print(json.dumps(dict(s.records)), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
