"""Roles × CSRF on every state-changing route, generated from the app's URL map.

Every rule with an unsafe method (every blueprint, present and future) is requested by every
persona, with and without the CSRF token:

- anonymous, viewer, operator, admin (signed-in sessions);
- operator and admin API tokens, and a read-only token;
- users signed in by the SSO proxy header (`web.trusted_header`), as viewer and as operator.

The least role each route needs is written down HERE, independently of the decorators, so
opening a route to a lesser role (or dropping CSRF for one kind of user) fails this test rather
than passing silently: every unsafe route needs an operator unless it is listed below. A new
admin-only route fails until it is added to ADMIN_ONLY; that is the point.

A refused request must change nothing: the audit log does not grow while refusals are made.
"""

from __future__ import annotations

import re

import pytest

from console import users as users_mod
from tests.web_fixtures import CSRF

UNSAFE = ("POST", "PUT", "PATCH", "DELETE")

# The least role for each unsafe endpoint, when it is not "operator".
ADMIN_ONLY = {
    "admin.revoke", "admin.save_user", "admin.user_action", "admin.revoke_sessions",
    "alerts.api_delete_rule", "alerts.api_save_destination", "alerts.api_save_rule",
    "alerts.delete_destination", "alerts.delete_rule", "alerts.save_destination", "alerts.save_rule",
    "health.end_backend", "health.api_end_backend",  # cancel/terminate a database session
    "editreplay.preview", "editreplay.apply", "editreplay.api_preview", "editreplay.api_apply",
}
ANY_SIGNED_IN = {"auth.logout"}
PUBLIC = {"auth.login"}  # CSRF still applies (tested in test_web_core)

SSO_HEADER = "X-Forwarded-User"
_RANK = {"viewer": 0, "operator": 1, "admin": 2}


def least_role(endpoint: str) -> str:
    if endpoint in ADMIN_ONLY:
        return "admin"
    if endpoint in ANY_SIGNED_IN:
        return "viewer"
    return "operator"


def _url(rule) -> str:
    """The rule with every argument filled by a value that names nothing that exists."""

    def fill(match: re.Match) -> str:
        converter = match.group(1) or ""
        return "987654321" if converter.startswith("int") else "matrix-nothing"

    return re.sub(r"<(?:(\w+)(?:\([^)]*\))?:)?\w+>", fill, rule.rule)


def unsafe_routes(app) -> list[tuple[str, str, str]]:
    found = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint in PUBLIC:
            continue
        for method in sorted(set(rule.methods or ()) & set(UNSAFE)):
            found.append((method, _url(rule), rule.endpoint))
    return sorted(found)


@pytest.fixture
def web_settings(web_settings):
    return {**web_settings, "web.trusted_header": SSO_HEADER}


@pytest.fixture
def tokens(conn, personas) -> dict[str, str]:
    return {
        "token-operator": users_mod.create_token(conn, "operator", "matrix"),
        "token-admin": users_mod.create_token(conn, "admin", "matrix"),
        "token-readonly": users_mod.create_token(conn, "admin", "matrix read-only", read_only=True),
    }


PERSONAS = ("anonymous", "viewer", "operator", "admin", "token-operator", "token-admin", "token-readonly",
            "sso-viewer", "sso-operator")


def expected(persona: str, path: str, endpoint: str, with_csrf: bool) -> str:
    """'allowed', or the status class of the refusal: 'csrf' (403), 'anonymous' (401 or 403),
    'role' (403)."""
    needed = least_role(endpoint)
    if persona.startswith("token-"):
        if not path.startswith("/api/"):
            return "anonymous"  # a bearer token means nothing outside /api/: no user, no CSRF
        if persona == "token-readonly":
            return "role"
        role = persona.removeprefix("token-")
        return "allowed" if _RANK[role] >= _RANK[needed] else "role"
    if not with_csrf:
        return "csrf"
    if persona == "anonymous":
        return "anonymous"
    role = persona.removeprefix("sso-")
    return "allowed" if _RANK[role] >= _RANK[needed] else "role"


def _client(persona, client_as, tokens):
    if persona.startswith("token-"):
        client = client_as(None)
        headers = {"Authorization": f"Bearer {tokens[persona]}"}
    elif persona.startswith("sso-"):
        client = client_as(None)
        headers = {SSO_HEADER: persona.removeprefix("sso-")}
    else:
        client = client_as(None if persona == "anonymous" else persona)
        headers = {}
    return client, headers


def test_every_unsafe_route_is_in_the_matrix(web_app):
    routes = unsafe_routes(web_app)
    assert len(routes) >= 30, routes
    blueprints = {endpoint.split(".")[0] for _, _, endpoint in routes}
    assert {"admin", "alerts", "deadletters", "jobs", "maintenance", "queues"} <= blueprints


@pytest.mark.parametrize("with_csrf", [True, False], ids=["with-csrf", "without-csrf"])
@pytest.mark.parametrize("persona", PERSONAS)
def test_roles_and_csrf_on_every_unsafe_route(web_app, client_as, tokens, conn, persona, with_csrf):
    audit_before = conn.execute("SELECT count(*) FROM skiplock.audit_log").fetchone()[0]
    wrong = []
    refused = 0
    for method, path, endpoint in unsafe_routes(web_app):
        client, headers = _client(persona, client_as, tokens)
        if with_csrf:
            headers = {**headers, "X-CSRF-Token": CSRF}
        response = client.open(path, method=method, headers=headers)
        status = response.status_code
        want = expected(persona, path, endpoint, with_csrf)
        where = f"{persona} {method} {path} ({'with' if with_csrf else 'without'} CSRF): {status}"
        if status >= 500:
            wrong.append(f"{where} is a server error")
        elif want == "allowed":
            if status in (401, 403):
                wrong.append(f"{where}, expected to pass the role and CSRF checks: {response.data[:160]!r}")
        else:
            refused += 1
            allowed_statuses = {"csrf": {403}, "role": {403}, "anonymous": {401, 403}}[want]
            if status not in allowed_statuses:
                wrong.append(f"{where}, expected a refusal ({want}: {sorted(allowed_statuses)})")
            elif want == "csrf" and b"CSRF" not in response.data:
                wrong.append(f"{where}: refused, but not by the CSRF check: {response.data[:160]!r}")
    assert wrong == [], "\n".join(wrong)
    if refused and not any(expected(persona, p, e, with_csrf) == "allowed" for _, p, e in unsafe_routes(web_app)):
        # Only refusals were made: nothing may have been written.
        audit_after = conn.execute("SELECT count(*) FROM skiplock.audit_log").fetchone()[0]
        assert audit_after == audit_before
