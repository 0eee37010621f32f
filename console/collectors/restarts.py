"""Scheduler restarts: how many scheduler processes started in the last 15 minutes in place of
one that died (crashed, was SIGKILLed or OOM-killed) on the same host.

Every scheduler process, leader or standby, has its own row in `skiplock.scheduler_nodes`
(the id carries host and pid), written on each election tick and marked stopped when it stops
cleanly. A restart is a process that never said it stopped, is no longer seen, and was
followed by a new process on its host (`sql/scheduler.sql`, `restarts`, says exactly what
counts). A supervisor that
restarts a crashing scheduler hides the crash from everyone else; this sample makes it visible
to the default alert `scheduler_restarts` and to the Maintenance page.
"""

from __future__ import annotations

from collections.abc import Iterable

from console.collectors.base import Context
from console.samples import Sample

RESTART_WINDOW_S = 900.0  # "restarted N times in 15 min"


def collect(ctx: Context) -> Iterable[Sample]:
    rows = ctx.rows("scheduler", "restarts", {"window_seconds": RESTART_WINDOW_S})
    return [Sample("scheduler_restarts", {}, float(len(rows)))]
