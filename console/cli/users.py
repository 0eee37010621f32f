"""User commands: `skiplock users add|list|disable|enable|token|revoke|tokens|sessions`.

Every change needs `--reason` (console.actions.ACTIONS: it changes who may act) and is audited
with the actor `cli:<os user>@<host>` (or `NAME (cli:<os user>@<host>)` with `--actor NAME`)."""

from __future__ import annotations

import os
from datetime import UTC

import click

from console import audit
from console import users as users_mod
from console.cli.common import dsn_option, friendly_errors, main_group, resolve_reason, who_and_why
from console.db import connect, require_schema


def _utc(ts) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


@main_group.group("users")
def users_group() -> None:
    """Console users and API tokens."""


@users_group.command("add")
@dsn_option
@click.argument("name")
@click.option("--role", type=click.Choice(users_mod.ROLES), required=True, help="viewer reads, operator acts, admin manages.")
@click.option("--no-password", is_flag=True, help="Create without a password (sign-in only through the SSO header).")
@who_and_why("user_add")
@friendly_errors
@click.pass_obj
def add_cmd(obj, name: str, role: str, no_password: bool, actor: str, reason: str) -> None:
    """Create user NAME, or change its role (and password) if it exists.

    The password comes from $SKIPLOCK_PASSWORD, else it is prompted for (twice). A new password
    or another role ends the user's web sessions.
    """
    users_mod.check_name(name)
    password = None
    if not no_password:
        password = os.environ.get("SKIPLOCK_PASSWORD")
        if not password:
            password = click.prompt(f"Password for {name}", hide_input=True, confirmation_prompt=True)
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        with conn.transaction():
            created = users_mod.add_user(conn, name, role, password)
            audit.record(conn, actor=actor, action="user_add" if created else "user_update", target=f"user:{name}",
                         selection={"user": name}, reason=reason, rows=1,
                         detail={"role": role, "password_changed": password is not None})
    click.echo(f"{'created' if created else 'updated'} user {name} ({role})")


@users_group.command("list")
@dsn_option
@friendly_errors
@click.pass_obj
def list_cmd(obj) -> None:
    """List users with their role and state."""
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        rows = users_mod.list_users(conn)
    if not rows:
        click.echo("no users yet: skiplock users add NAME --role admin")
    for row in rows:
        state = "disabled" if row["disabled"] else "active"
        click.echo(f"{row['name']:<24} {row['role']:<9} {state:<9} tokens={row['tokens']}")


def _set_disabled(obj, name: str, disabled: bool, actor: str, reason: str) -> None:
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        with conn.transaction():
            users_mod.set_disabled(conn, name, disabled)
            audit.record(conn, actor=actor, action="user_disable" if disabled else "user_enable", target=f"user:{name}",
                         selection={"user": name}, reason=reason, rows=1)
    click.echo(f"{'disabled' if disabled else 'enabled'} {name}")


@users_group.command("disable")
@dsn_option
@click.argument("name")
@who_and_why("user_disable")
@friendly_errors
@click.pass_obj
def disable_cmd(obj, name: str, actor: str, reason: str) -> None:
    """Disable NAME: its web sessions end and its tokens stop working at the next request."""
    _set_disabled(obj, name, True, actor, reason)


@users_group.command("enable")
@dsn_option
@click.argument("name")
@who_and_why("user_enable")
@friendly_errors
@click.pass_obj
def enable_cmd(obj, name: str, actor: str, reason: str) -> None:
    """Enable NAME again."""
    _set_disabled(obj, name, False, actor, reason)


@users_group.command("token")
@dsn_option
@click.argument("name")
@click.option("--label", default="", help="What the token is for (shown in the token list).")
@click.option("--read-only", is_flag=True, help="The token may only read: every POST/PUT/PATCH/DELETE gets 403.")
@click.option("--expires", default=None, metavar="DURATION",
              help="The token stops working this long from now (e.g. 90d, 12h); default: never.")
@who_and_why("token_create")
@friendly_errors
@click.pass_obj
def token_cmd(obj, name: str, label: str, read_only: bool, expires: str | None, actor: str, reason: str) -> None:
    """Create an API token for NAME and print it (the only time it is shown)."""
    expires_in = users_mod.parse_expiry(expires)
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        with conn.transaction():
            token = users_mod.create_token(conn, name, label, read_only=read_only, expires_in=expires_in,
                                           cap=obj.config.caps.tokens_per_user)
            audit.record(conn, actor=actor, action="token_create", target=f"user:{name}", selection={"user": name},
                         reason=reason, rows=1, detail={"label": label, "read_only": read_only, "expires": expires})
    click.echo(token)


@users_group.command("revoke")
@dsn_option
@click.argument("token_id", type=int)
@who_and_why("token_revoke")
@friendly_errors
@click.pass_obj
def revoke_cmd(obj, token_id: int, actor: str, reason: str) -> None:
    """Revoke the API token with id TOKEN_ID (see `skiplock users tokens`)."""
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        with conn.transaction():
            if not users_mod.revoke_token(conn, token_id):
                raise click.UsageError(f"no live token with id {token_id}")
            audit.record(conn, actor=actor, action="token_revoke", target=f"token:{token_id}",
                         selection={"token": token_id}, reason=reason, rows=1)
    click.echo(f"revoked token {token_id}")


@users_group.command("tokens")
@dsn_option
@click.argument("name", required=False)
@friendly_errors
@click.pass_obj
def tokens_cmd(obj, name: str | None) -> None:
    """List API tokens (ids, owners, state, scope, expiry, labels; never the secrets)."""
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        rows = users_mod.list_tokens(conn, name)
    for row in rows:
        if row["revoked_at"]:
            state = f"revoked {row['revoked_at']:%Y-%m-%d}"
        elif row["expired"]:
            state = "expired"
        else:
            state = "live"
        scope = "read-only" if row["read_only"] else "read-write"
        expires = f"expires {_utc(row['expires_at'])}" if row["expires_at"] else "never expires"
        click.echo(f"{row['id']:>5} {row['user_name']:<24} {state:<18} {scope:<10} {expires:<26} {row['label']}")


def _session_limits(obj) -> users_mod.SessionLimits:
    web = obj.config.web
    return users_mod.SessionLimits(web.session_idle.total_seconds(), web.session_max.total_seconds(),
                                   obj.config.caps.sessions_per_user)


@users_group.command("sessions")
@dsn_option
@click.argument("name")
@click.option("--revoke", "revoke", is_flag=False, flag_value="all", default=None, metavar="[ID_PREFIX]",
              help="End NAME's live sessions: all of them, or the one whose id starts with ID_PREFIX.")
@who_and_why()
@friendly_errors
@click.pass_obj
def sessions_cmd(obj, name: str, revoke: str | None, actor: str, reason: str | None) -> None:
    """List NAME's web sessions (newest first), or end them with --revoke.

    Ids are the first 12 hex digits of the session's SHA-256 (the cookie's token is never stored).
    """
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        if revoke is not None:
            reason = resolve_reason("sessions_revoke", reason)
            with conn.transaction():
                ended = users_mod.end_user_sessions(conn, name, None if revoke == "all" else revoke)
                if revoke != "all" and not ended:
                    raise click.UsageError(f"no live session of {name} has an id starting with {revoke}")
                audit.record(conn, actor=actor, action="sessions_revoke", target=f"user:{name}",
                             selection={"user": name, "session": None if revoke == "all" else revoke},
                             reason=reason, rows=len(ended), detail={"sessions": [sid[:12] for sid in ended]})
            click.echo(f"ended {len(ended)} session{'s' if len(ended) != 1 else ''} of {name}")
            return
        rows = users_mod.list_sessions(conn, name, _session_limits(obj))
    if not rows:
        click.echo(f"{name} has no sessions")
    for row in rows:
        click.echo(f"{row['id'][:12]}  {row['state']:<8} signed in {_utc(row['created_at'])}  "
                   f"last seen {_utc(row['last_seen_at'])}  {row['ip']:<15} {row['user_agent'][:60]}")
