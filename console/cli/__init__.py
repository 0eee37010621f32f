"""`skiplock`: the command line. One module per concern registers its commands here.

Every command takes `--dsn` (default: $DATABASE_URL) and `--config` (default:
$SKIPLOCK_CONFIG). Bad input ends with a one-line message and a non-zero exit, never a
traceback.
"""

from __future__ import annotations

import logging
import sys

import click

# Each module registers its commands on main_group when imported:
# advisor: check · alerts: the alerts group · backends: backends show|cancel|terminate · core: migrate, worker, relay, enqueue · demo: demo ·
# external: the external group (dead letters of [[external_queues]], their replay, purge, ...) ·
# maintenance: reap, archive, retention, replay, purge, pause, resume, dead-letters, operations ·
# groups: groups list|ignore|unignore · periodic: periodic list|pause|resume|run · prometheus: prometheus rules|dashboard ·
# exitplan: exit-plan QUEUE · queues: queues list|set|show|backend|move · why: why JOB_ID | why --queue NAME ·
# timeline: timeline [--alert N] [--markdown|--json] ·
# scheduler: collect, scheduler · settings: config example|show · users: users · web: serve
from console.cli import (  # noqa: F401
    advisor,
    alerts,
    backends,
    core,
    demo,
    exitplan,
    external,
    groups,
    maintenance,
    periodic,
    prometheus,
    queues,
    scheduler,
    settings,
    timeline,
    users,
    web,
    why,
)
from console.cli.common import main_group

main = main_group


def run() -> None:  # pragma: no cover - thin wrapper for `python -m console`
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    main()


__all__ = ["main", "click"]
