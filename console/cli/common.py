"""What every command shares: the `skiplock` group, --dsn/--config/--database, error reporting,
and `--reason`/`--actor` (`who_and_why`) for every command that acts.

A command that acts on one database reads `obj.dsn`: the database `--database NAME` picks from
`[[databases]]` (the first when not given), or the one `--dsn` / DATABASE_URL names. A command
that acts on all of them (`migrate --all`, `scheduler`, `collect`) reads `obj.databases`."""

from __future__ import annotations

import functools
import logging
import re
import sys
from datetime import timedelta

import click

from console.actions import ACTIONS, ReasonRequired, cli_actor, require_reason
from console.caps import CapReached
from console.config import Config, ConfigError, load_config
from console.databases import Database, load_databases, select
from console.db import DatabaseError, resolve_dsn
from console.timefmt import MAX_SPAN_DAYS


class Context:
    def __init__(self, dsn: str | None, config_path: str | None, database: str | None = None):
        self._dsn = dsn
        self._config_path = config_path
        self._config: Config | None = None
        self.database_name = database

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self._config_path)
        return self._config

    @property
    def databases(self) -> list[Database]:
        """Every configured database, in config order (ConfigError/DatabaseError when none or both ways)."""
        return load_databases(self.config, self._dsn)

    @property
    def database(self) -> Database:
        """The database this command acts on: `--database NAME`, else the first (or only) one."""
        return select(self.databases, self.database_name)

    @property
    def dsn(self) -> str:
        if self.config.tables.get("databases") or self.database_name:
            return self.database.dsn
        return resolve_dsn(self._dsn, self.config)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--dsn", envvar="DATABASE_URL", help="PostgreSQL connection string [env: DATABASE_URL].")
@click.option("--config", "config_path", envvar="SKIPLOCK_CONFIG", type=click.Path(dir_okay=False),
              help="TOML configuration file [env: SKIPLOCK_CONFIG].")
@click.option("--database", "database", default=None, metavar="NAME",
              help="Which of the configured [[databases]] a command acts on (default: the first).")
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail to stderr.")
@click.version_option(package_name="skiplock", prog_name="skiplock", message="%(prog)s %(version)s",
                      help="Print the installed release (CHANGELOG.md) and exit.")
@click.pass_context
def main_group(ctx: click.Context, dsn: str | None, config_path: str | None, database: str | None,
               verbose: bool) -> None:
    """Skiplock: a PostgreSQL job queue and the console that keeps it healthy."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.DEBUG if verbose else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
    ctx.obj = Context(dsn, config_path, database)


def dsn_option(func):
    """Lets `--dsn` and `--database` also follow the subcommand (`skiplock migrate --dsn ...`,
    `skiplock reap --database east`)."""

    @click.option("--dsn", "sub_dsn", envvar=None, default=None, help="PostgreSQL connection string [env: DATABASE_URL].")
    @click.option("--database", "sub_database", default=None, metavar="NAME",
                  help="Which of the configured [[databases]] to act on (default: the first).")
    @functools.wraps(func)
    def wrapper(*args, sub_dsn=None, sub_database=None, **kwargs):
        ctx = click.get_current_context()
        if sub_dsn:
            ctx.obj._dsn = sub_dsn
        if sub_database:
            ctx.obj.database_name = sub_database
        return func(*args, **kwargs)

    return wrapper


def friendly_errors(func):
    """Turn the errors a user can fix into one-line messages and exit code 2 (1 for runtime)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            raise click.UsageError(f"configuration: {exc}") from None
        except DatabaseError as exc:
            raise click.ClickException(str(exc)) from None
        except CapReached as exc:  # refused, nothing written: like bad input, the user can act on it
            raise click.UsageError(str(exc)) from None
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None

    return wrapper


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(text: str) -> timedelta:
    """'90s', '15m', '1h', '7d' (a bare number is seconds) -> timedelta; ValueError otherwise."""
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a duration (use e.g. 90s, 15m, 1h, 7d)")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds > MAX_SPAN_DAYS * 86400:  # also keeps timedelta and "now - span" from overflowing
        raise ValueError(f"{text!r} is too long (at most {MAX_SPAN_DAYS}d)")
    return timedelta(seconds=seconds)


class DurationType(click.ParamType):
    name = "DURATION"

    def convert(self, value, param, ctx):
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = DurationType()


# --- who and why ----------------------------------------------------------------------------
# Every command that acts takes `--reason` and `--actor` through `who_and_why(action)`; the
# table of which actions need a reason is console.actions.ACTIONS.


def who_and_why(action: str | None = None):
    """Add `--reason TEXT` and `--actor NAME` to a command; the command receives `actor` (see
    console.actions.cli_actor) and `reason`. With `action`, a reason the table requires is
    asked for when stdin is a terminal, else the command ends with exit code 2 naming
    --reason before touching anything. Without `action` (the command decides, e.g. replay by
    its selection), it calls `resolve_reason(action, reason)` itself."""

    def decorate(func):
        @click.option("--reason", default=None, metavar="TEXT",
                      help="Why (kept in the audit log)." + (" Required." if action and ACTIONS[action].reason else ""))
        @click.option("--actor", "actor_override", default=None, metavar="NAME",
                      help="Who, for automation (recorded as 'NAME (cli:<os user>@<host>)').")
        @functools.wraps(func)
        def wrapper(*args, reason=None, actor_override=None, **kwargs):
            try:
                actor = cli_actor(actor_override)
            except ValueError as exc:
                raise click.UsageError(str(exc)) from None
            if action is not None:
                reason = resolve_reason(action, reason)
            return func(*args, actor=actor, reason=reason, **kwargs)

        return wrapper

    return decorate


def interactive() -> bool:
    """Is a person at a terminal to be asked (stdin is a TTY)?"""
    return sys.stdin.isatty()


def resolve_reason(action: str, reason: str | None) -> str | None:
    """The reason for `action`: as given; prompted for on a terminal when the table requires
    one and none was given; otherwise exit code 2 with a message naming --reason."""
    try:
        return require_reason(action, reason)
    except ReasonRequired as exc:
        if exc.given:  # a reason was given, too short to say anything: say what is missing
            raise click.UsageError(f"--{exc}") from None
        if not interactive():
            raise click.UsageError(f"{ACTIONS[action].what.lower()} needs a reason for the audit log: "
                                   "pass --reason TEXT (or run it on a terminal to be asked)") from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    while True:
        answer = click.prompt(f"Reason ({ACTIONS[action].what.lower()}; kept in the audit log)", default="",
                              show_default=False)
        try:
            return require_reason(action, answer)
        except ReasonRequired as exc:
            click.echo(str(exc) if exc.given else "a reason is required here", err=True)
        except ValueError as exc:
            click.echo(str(exc), err=True)
