"""`skiplock`: the command line. One module per concern registers its commands here.

Every command takes `--dsn` (default: $DATABASE_URL) and `--config` (default:
$SKIPLOCK_CONFIG). Bad input ends with a one-line message and a non-zero exit, never a
traceback.
"""

from __future__ import annotations

import logging
import sys

import click

from console.cli import advisor  # noqa: F401  (registers check)
from console.cli import alerts  # noqa: F401  (registers the alerts group)
from console.cli import core  # noqa: F401  (registers migrate, worker, enqueue)
from console.cli import demo  # noqa: F401  (registers demo)
from console.cli import maintenance  # noqa: F401  (registers reap, archive, retention, replay, purge, pause, resume, ...)
from console.cli import scheduler  # noqa: F401  (registers collect, scheduler)
from console.cli import settings  # noqa: F401  (registers config example|show)
from console.cli import users, web  # noqa: F401  (registers users, serve)
from console.cli.common import main_group

main = main_group


def run() -> None:  # pragma: no cover - thin wrapper for `python -m console`
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    main()


__all__ = ["main", "click"]
