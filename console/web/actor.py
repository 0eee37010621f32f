"""Who is acting and why, for the web's state-changing routes.

    conn = get_conn()
    reason = reason_for("pause")        # ReasonRequired (HTTP 422) when the table needs one
    pause_queue(conn, name, actor=actor(), reason=reason)

`actor()` is the signed-in console user's name, or for an API token `<owner> (token <label>)`
(`#<id>` when it has no label), so the audit log says which script acted. `reason_for(action)`
reads `reason` from the form, a JSON body, or (for DELETE) the query string, and checks it
against console.actions.ACTIONS. console/web/errors.py turns ReasonRequired into 422 for pages,
htmx and the API alike.
"""

from __future__ import annotations

from typing import Any

from flask import g, request

from console import users as users_mod
from console.actions import require_reason
from console.web.database import home_conn


def actor() -> str:
    """The audit log's actor for this request (see the module docstring)."""
    cached = g.get("skiplock_actor")
    if cached:
        return cached
    user = g.user
    name = user.name
    if user.via == "token":
        token = request.headers.get("Authorization", "").partition(" ")[2].strip()
        label = users_mod.token_label(home_conn(), token) or "?"
        name = f"{user.name} (token {label})"
    g.skiplock_actor = name
    return name


def raw_reason(data: dict[str, Any] | None = None) -> Any:
    """The `reason` the request carries: `data` (an already-read form/JSON), the JSON body,
    the form, or for DELETE the query string."""
    if data is not None and "reason" in data:
        return data.get("reason")
    body = request.get_json(silent=True) if request.is_json else None
    if isinstance(body, dict) and "reason" in body:
        return body.get("reason")
    if "reason" in request.form:
        return request.form.get("reason")
    if request.method == "DELETE":
        return request.args.get("reason")
    return None


def reason_for(action: str, data: dict[str, Any] | None = None) -> str | None:
    """The request's reason for `action`, cleaned; ReasonRequired (422) when the table needs
    one and it is missing, ValueError (400) when it is not a string or too long."""
    value = raw_reason(data)
    if value is not None and not isinstance(value, str):
        raise ValueError("reason: must be a string")
    return require_reason(action, value)
