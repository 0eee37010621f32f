"""Users and API tokens (admin only): add or change a user, disable/enable, create and revoke
tokens. Every change needs a reason and is audited (422 without; console.actions.ACTIONS). The
CLI (`skiplock users ...`) does the same.

GET  /admin/users                       list users and tokens
POST /admin/users                       name, role, password (empty keeps the current one)
POST /admin/users/<name>/disable|enable
POST /admin/users/<name>/token          label, expires (e.g. 90d), read_only -> the token, shown once
POST /admin/tokens/<id>/revoke
GET  /api/v1/users (admin)
"""

from __future__ import annotations

import psycopg
from flask import (
    Blueprint,
    abort,
    flash,
    g,
    get_flashed_messages,
    jsonify,
    redirect,
    render_template,
    request,
    url_for,
)

from console import audit
from console import users as users_mod
from console.db import time_limited
from console.web import state
from console.web.actor import actor, reason_for
from console.web.api import INT, STR, api_doc, arr, obj
from console.web.auth import requires
from console.web.database import QueryTooSlow, home_conn, timeout_ms

bp = Blueprint("admin", __name__)


def _listing():
    conn = home_conn()  # users live in the home database, whatever /db/<name>/ the page is under
    try:
        with time_limited(conn, timeout_ms()):
            return {"users": users_mod.list_users(conn), "tokens": users_mod.list_tokens(conn)}
    except psycopg.errors.QueryCanceled:
        raise QueryTooSlow(timeout_ms()) from None


@bp.get("/admin/users")
@requires("admin")
def users():
    messages = get_flashed_messages(with_categories=True)
    return render_template("admin/users.html", roles=users_mod.ROLES, messages=messages, **_listing())


@bp.get("/api/v1/users")
@requires("admin")
@api_doc("Users and API tokens (never the secrets)",
         response=obj({"users": arr(obj({"name": STR, "role": STR})), "tokens": arr(obj({"id": INT}))}))
def api_users():
    return jsonify(_listing())


@bp.post("/admin/users")
@requires("admin")
def save_user():
    name = (request.form.get("name") or "").strip()
    role = request.form.get("role") or ""
    password = request.form.get("password") or None
    reason = reason_for("user_add")
    conn = home_conn()
    with conn.transaction():
        exists = users_mod.get_user(conn, users_mod.check_name(name)) is not None
        if not exists and password is None:
            raise users_mod.UserError("a new user needs a password")
        users_mod.add_user(conn, name, role, password)
        audit.record(conn, actor=actor(), action="user_update" if exists else "user_add", target=f"user:{name}",
                     selection={"user": name}, reason=reason, rows=1,
                     detail={"role": role, "password_changed": password is not None})
    flash(f"{'updated' if exists else 'created'} {name} ({role})", "good")
    return redirect(url_for("admin.users"))


@bp.post("/admin/users/<name>/<action>")
@requires("admin")
def user_action(name: str, action: str):
    conn = home_conn()
    if action in ("disable", "enable"):
        if action == "disable" and name == g.user.name:
            abort(409, "you cannot disable yourself")
        reason = reason_for(f"user_{action}")
        with conn.transaction():
            users_mod.set_disabled(conn, name, action == "disable")
            audit.record(conn, actor=actor(), action=f"user_{action}", target=f"user:{name}",
                         selection={"user": name}, reason=reason, rows=1)
        flash(f"{action}d {name}", "good")
        return redirect(url_for("admin.users"))
    if action == "token":
        label = (request.form.get("label") or "").strip()
        expires = (request.form.get("expires") or "").strip() or None
        read_only = request.form.get("read_only") in ("1", "on", "true")
        expires_in = users_mod.parse_expiry(expires)
        reason = reason_for("token_create")
        with conn.transaction():
            token = users_mod.create_token(conn, name, label, read_only=read_only, expires_in=expires_in,
                                           cap=state().config.caps.tokens_per_user)
            audit.record(conn, actor=actor(), action="token_create", target=f"user:{name}", selection={"user": name},
                         reason=reason, rows=1, detail={"label": label, "read_only": read_only, "expires": expires})
        return render_template("admin/token.html", name=name, token=token, label=label)
    abort(404, f"no action {action!r}")


@bp.post("/admin/tokens/<int:token_id>/revoke")
@requires("admin")
def revoke(token_id: int):
    reason = reason_for("token_revoke")
    conn = home_conn()
    with conn.transaction():
        if not users_mod.revoke_token(conn, token_id):
            abort(409, f"token {token_id} does not exist or is already revoked")
        audit.record(conn, actor=actor(), action="token_revoke", target=f"token:{token_id}",
                     selection={"token": token_id}, reason=reason, rows=1)
    flash(f"revoked token {token_id}", "good")
    return redirect(url_for("admin.users"))
