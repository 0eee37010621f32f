"""`skiplock demo`: a private PostgreSQL, workers, traffic and the console, until Ctrl-C."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from console.cli.common import DURATION, main_group


@main_group.command("demo")
@click.option("--port", type=int, default=8000, show_default=True, help="Port of the web console.")
@click.option("--rate", type=float, default=5.0, show_default=True, metavar="JOBS_PER_S",
              help="Jobs enqueued per second on average (keep it modest: a few cores go a long way).")
@click.option("--duration", type=DURATION, default=None, help="Stop by itself after this long (e.g. 90s, 15m); default: until Ctrl-C.")
@click.option("--seed-history", is_flag=True, help="First fill a few hours of plausible samples so the charts are not empty.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the demo keeps its PostgreSQL, logs and config [default: ./.skiplock-demo].")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True, help="Worker processes besides the reports worker.")
@click.option("--kill-every", type=DURATION, default=None,
              help="SIGKILL the reports worker this often (stuck leases for the reaper); 0 never [default: 3m, divided by --pace].")
@click.option("--pace", type=click.FloatRange(min=0.1, max=60), default=1.0, show_default=True,
              help="Play the demo's schedule this many times faster: its intervals, leases, alert durations, bursts, "
                   "idle sessions and kills (--pace 6: the half hour's incidents in five minutes).")
@click.option("--reset", is_flag=True, help="Throw away the demo's earlier data first.")
def demo_cmd(port: int, rate: float, duration, seed_history: bool, data_dir: Path | None, workers: int, kill_every,
             pace: float, reset: bool) -> None:
    """Run Skiplock on a private PostgreSQL with realistic traffic, until Ctrl-C.

    Starts a throwaway PostgreSQL cluster in its own data directory, migrates it, starts the
    scheduler, the web console, a few workers and a traffic generator, prints the URL and a
    login, and stops everything it started on Ctrl-C. Needs PostgreSQL's server binaries
    (Debian/Ubuntu: the postgresql-15 package), not a running server.
    """
    from console.demo.orchestrator import Demo, DemoError, DemoOptions

    if rate <= 0:
        raise click.BadParameter("must be greater than 0", param_hint="--rate")
    if not 1 <= port <= 65535:
        raise click.BadParameter("must be between 1 and 65535", param_hint="--port")
    kill_s = kill_every.total_seconds() if kill_every is not None else 180.0 / pace
    options = DemoOptions(
        data_dir=data_dir, port=port, rate=rate,
        duration=duration.total_seconds() if duration else None,
        seed_history=seed_history, workers=workers, kill_every=kill_s,
        first_kill_after=min(60.0 / pace, kill_s or 60.0 / pace), reset=reset, pace=pace,
    )
    demo = Demo(options, out=lambda text: click.echo(text))
    try:
        code = demo.run()
    except DemoError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)
    sys.exit(code)
