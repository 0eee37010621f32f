"""User commands: `skiplock users add|list|disable|enable|token|revoke`.

Every change needs `--reason` (console.actions.ACTIONS: it changes who may act) and is audited
with the actor `cli:<os user>@<host>` (or `NAME (cli:<os user>@<host>)` with `--actor NAME`)."""

from __future__ import annotations

import os

import click

from console import audit
from console import users as users_mod
from console.cli.common import dsn_option, friendly_errors, main_group, who_and_why
from console.db import connect, require_schema


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

    The password comes from $SKIPLOCK_PASSWORD, else it is prompted for (twice).
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
    """Disable NAME: its sessions and tokens stop working at the next request."""
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
@who_and_why("token_create")
@friendly_errors
@click.pass_obj
def token_cmd(obj, name: str, label: str, actor: str, reason: str) -> None:
    """Create an API token for NAME and print it (the only time it is shown)."""
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        with conn.transaction():
            token = users_mod.create_token(conn, name, label)
            audit.record(conn, actor=actor, action="token_create", target=f"user:{name}", selection={"user": name},
                         reason=reason, rows=1, detail={"label": label})
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
    """List API tokens (ids, owners, labels; never the secrets)."""
    with connect(obj.dsn, application_name="skiplock-cli") as conn:
        require_schema(conn)
        rows = users_mod.list_tokens(conn, name)
    for row in rows:
        state = f"revoked {row['revoked_at']:%Y-%m-%d}" if row["revoked_at"] else "live"
        click.echo(f"{row['id']:>5} {row['user_name']:<24} {state:<18} {row['label']}")
