"""Who is asking, may they, and did the request come from our own page.

Every request passes `_guard` before its view:
1. **Identify**: `Authorization: Bearer <token>` on /api/ (scripts), else the trusted proxy
   header when `web.trusted_header` is set (SSO; the user must exist and be enabled), else the
   signed session cookie. The user's role is read from the database on every request, so
   disabling or demoting someone takes effect at once.
2. **CSRF**: a POST/PUT/PATCH/DELETE must carry the session's token in the `csrf_token` form
   field or the `X-CSRF-Token` header (htmx sends it from <body hx-headers>); otherwise 403.
   Token-authenticated API calls are exempt (no cookie, so no cross-site forgery).
3. **Role**: the view's `@requires(role)`, by default viewer for GET/HEAD and operator for
   anything else; `@public` views skip 1-3 except CSRF. No user: pages redirect to /login,
   the API and htmx get 401. Too small a role: 403.

Sign-in rate limiting is kept in the database (`skiplock.login_attempts`), so the limits hold
across every gunicorn worker: `web.login_max_per_ip` and `web.login_max_per_user` failures
within `web.login_window` seconds refuse further attempts with 429.
"""

from __future__ import annotations

import functools
import hmac
import secrets
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    Flask,
    abort,
    current_app,
    g,
    redirect,
    render_template,
    request,
    session,
    url_for,
)

from console import audit
from console import users as users_mod
from console.users import User, has_role
from console.web.database import get_conn

bp = Blueprint("auth", __name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def requires(role: str):
    """Declare the least role a view needs (viewer < operator < admin)."""
    users_mod.check_role(role)

    def decorate(view):
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            user = g.get("user")
            if user is None:
                abort(401, "sign in first")
            if not user.can(role):
                abort(403, f"this needs the {role} role; you are {user.role}")
            return view(*args, **kwargs)

        wrapper._skiplock_role = role
        return wrapper

    return decorate


def public(view):
    """No sign-in needed (health checks, the login form). CSRF still applies to its POSTs."""
    view._skiplock_public = True
    return view


def csrf_token() -> str:
    token = session.get("csrf")
    if not token:
        token = secrets.token_urlsafe(32)
        session["csrf"] = token
    return token


def _csrf_ok() -> bool:
    expected = session.get("csrf")
    sent = request.headers.get("X-CSRF-Token") or request.form.get("csrf_token")
    return bool(expected and sent) and hmac.compare_digest(str(expected), str(sent))


def _state():
    from console.web import state

    return state()


def _identify() -> User | None:
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and request.path.startswith("/api/"):
            user = users_mod.user_for_token(get_conn(), token.strip())
            if user is None:
                abort(401, "invalid or revoked API token")
            return user
    trusted = _state().config.web.trusted_header
    if trusted and request.headers.get(trusted):
        name = request.headers[trusted].strip()
        user = users_mod.active_user(get_conn(), name, via="header")
        if user is None:
            abort(403, f"user {name!r} (from the SSO proxy) is not a console user or is disabled")
        return user
    name = session.get("user")
    if name:
        user = users_mod.active_user(get_conn(), name)
        if user is None:
            session.pop("user", None)
        return user
    return None


def _guard():
    endpoint = request.endpoint
    if endpoint is None or endpoint == "static":
        return None  # 404/405 handled by Flask; static files are public
    view = current_app.view_functions[endpoint]
    is_public = getattr(view, "_skiplock_public", False)
    # Public views never touch the database for identity: /healthz must answer even when
    # the sessions' users cannot be looked up.
    g.user = None if is_public else _identify()
    user: User | None = g.user
    if request.method not in SAFE_METHODS and not (user and user.via == "token") and not _csrf_ok():
        abort(403, "missing or invalid CSRF token: reload the page and try again")
    if is_public:
        return None
    if user is None:
        if request.method in SAFE_METHODS and not request.path.startswith("/api/") and not request.headers.get("HX-Request"):
            return redirect(url_for("auth.login", next=request.full_path.rstrip("?")))
        abort(401, "sign in first")
    needed = getattr(view, "_skiplock_role", None) or ("viewer" if request.method in SAFE_METHODS else "operator")
    if not has_role(user.role, needed):
        abort(403, f"this needs the {needed} role; you are {user.role}")
    return None


def install(app: Flask) -> None:
    app.before_request(_guard)


def _safe_next(target: str | None) -> str:
    """Only a path on this site (no scheme, no host, no //evil.example)."""
    if not target:
        return url_for("core.home")
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return url_for("core.home")
    return target


@bp.route("/login", methods=["GET", "POST"])
@public
def login():
    next_url = _safe_next(request.values.get("next"))
    if request.method == "GET":
        if session.get("user"):
            return redirect(next_url)
        return render_template("login.html", next=next_url, error=None, name="")
    name = (request.form.get("name") or "").strip()
    password = request.form.get("password") or ""
    if not name or not password:
        return render_template("login.html", next=next_url, error="enter a user name and a password", name=name), 400
    conn = get_conn()
    limits = _state().limits
    ip = request.remote_addr or "unknown"
    blocked = users_mod.login_blocked(conn, ip, name, limits)
    if blocked:
        return render_template("login.html", next=next_url, error=blocked, name=name), 429
    user = users_mod.authenticate(conn, name, password)
    users_mod.record_attempt(conn, ip, name, user is not None, limits)
    if user is None:
        return render_template("login.html", next=next_url, error="wrong user name or password", name=name), 401
    session.clear()
    session.permanent = True
    session["user"] = user.name
    session["csrf"] = secrets.token_urlsafe(32)
    audit.record(conn, actor=user.name, action="login", target=f"user:{user.name}", detail={"ip": ip})
    return redirect(next_url)


@bp.post("/logout")
@requires("viewer")
def logout():
    session.clear()
    return redirect(url_for("auth.login"))
