"""Who is asking, may they, and did the request come from our own page.

Every request passes `_guard` before its view:
1. **Identify**: `Authorization: Bearer <token>` on /api/ (scripts; an expired token gets 401
   "token expired"), else the trusted proxy header when `web.trusted_header` is set (SSO; the
   user must exist and be enabled), else the session cookie. The signed cookie carries only a
   session token and the CSRF token; the session itself is a row of `skiplock.web_sessions`
   (console/users.py) looked up on every request, with the user's role, so sign-out, a new
   password, another role or disabling the user take effect at the next request.
   A session ends after `web.session_idle` without a request and `web.session_max` after
   sign-in. Background polls do not count as activity: static/skiplock.js adds
   `X-Skiplock-Poll: 1` to every request an htmx `poll` trigger sends, and such a request
   does not move last_seen_at (which is written at most once a minute anyway).
2. **Same origin and CSRF**, for POST/PUT/PATCH/DELETE not authenticated by an API token:
   refused with 403 when `Sec-Fetch-Site: cross-site` or an `Origin` header that is not this
   site's (scheme://host as the request saw it after `web.proxy_count` proxies, or the origin of
   `alerts.console_url`); then the request must carry the session's CSRF token in the
   `csrf_token` form field or the `X-CSRF-Token` header (htmx sends it from <body
   hx-headers>). Token-authenticated API calls are exempt (no cookie, so no cross-site
   forgery), but a read-only token gets 403 on every unsafe method.
0. **Read-only console** (`web.read_only`): every unsafe method is refused with 403 "the console
   is read-only" before anything else (no identification, no view), API and tokens included;
   only `READ_ONLY_EXEMPT` (sign-in, sign-out) still accept a POST. The check is here, on the
   URL map's endpoints, so a route added tomorrow is covered without knowing about it. In
   templates `can(role)` is then false for every role above viewer (`may_act` in Python), so
   action buttons are not drawn, and base.html shows a banner.
3. **Role**: the view's `@requires(role)`, by default viewer for GET/HEAD and operator for
   anything else; `@public` views skip 1 and 3. No user: pages redirect to /login, the API and
   htmx get 401. Too small a role: 403.

Sign-in throttling lives in the database (`skiplock.login_throttle`, console/users.py), so it
holds across every gunicorn worker, and is checked and counted before the password is verified:
per (user name, address) exponential backoff after `web.login_free_failures` failures, and at
most `web.login_max_per_ip` failed attempts per address (IPv6: per /64) per `web.login_window`.
A stranger guessing `admin` never locks out the real admin signing in from elsewhere, and a
crowd of people with right passwords behind one NAT address is never refused by the address's
ceiling: an attempt whose password is being checked holds a place until it is settled, and one
that finds every place held by such checks waits for them (at most `LoginLimits.busy_wait`).
The password is checked (argon2id, slow on purpose) without holding a pooled connection.
"""

from __future__ import annotations

import functools
import hmac
import secrets
import time
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    Flask,
    abort,
    current_app,
    g,
    make_response,
    redirect,
    render_template,
    request,
    session,
    url_for,
)

from console import audit
from console import users as users_mod
from console.users import User, has_role
from console.web.database import home_conn, release

bp = Blueprint("auth", __name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The only endpoints that take an unsafe method in read-only mode: signing in and out change
# nothing the console watches.
READ_ONLY_EXEMPT = frozenset({"auth.login", "auth.logout"})
READ_ONLY_MESSAGE = "the console is read-only (web.read_only): actions are switched off"
POLL_HEADER = "X-Skiplock-Poll"  # set by static/skiplock.js on htmx poll requests


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


def read_only() -> bool:
    """Whether the whole console is read-only (`web.read_only`)."""
    return bool(_state().config.web.read_only)


def may_act(role: str = "operator") -> bool:
    """Whether the signed-in user may press a button that needs `role`: their role, and not a
    read-only console (reading needs only a viewer, so `may_act("viewer")` ignores the mode)."""
    user = g.get("user")
    return bool(user) and user.can(role) and (role == "viewer" or not read_only())


def _is_poll() -> bool:
    return request.headers.get(POLL_HEADER) == "1"


def _session_user(touch: bool) -> User | None:
    token = session.get("sid")
    if not token:
        return None
    user = users_mod.session_user(home_conn(), token, _state().sessions, touch=touch)
    if user is None:
        session.pop("sid", None)  # ended, idle, expired or unknown: the cookie forgets it
    return user


def _identify() -> User | None:
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and request.path.startswith("/api/"):
            try:
                user = users_mod.user_for_token(home_conn(), token.strip())
            except users_mod.TokenExpired:
                abort(401, "token expired")
            if user is None:
                abort(401, "invalid or revoked API token")
            return user
    trusted = _state().config.web.trusted_header
    if trusted and request.headers.get(trusted):
        name = request.headers[trusted].strip()
        user = users_mod.active_user(home_conn(), name, via="header")
        if user is None:
            abort(403, f"user {name!r} (from the SSO proxy) is not a console user or is disabled")
        return user
    return _session_user(touch=not _is_poll())


def _origin_refusal() -> str | None:
    """Why an unsafe request carried by the browser's cookie looks cross-site, or None."""
    site = (request.headers.get("Sec-Fetch-Site") or "").lower()
    if site == "cross-site":
        return "cross-site request refused (Sec-Fetch-Site: cross-site)"
    origin = request.headers.get("Origin")
    if origin is None:
        return None  # no Origin (older browsers, some same-origin requests): the CSRF token decides
    ours = f"{request.scheme}://{request.host}".lower()
    allowed = {ours}
    console_url = _state().config.alerts.console_url
    if console_url:
        parts = urlsplit(console_url)
        allowed.add(f"{parts.scheme}://{parts.netloc}".lower())
    if origin.strip().lower().rstrip("/") not in allowed:
        return (f"cross-origin request refused: Origin {origin[:100]} is not this site ({ours}); "
                "behind a reverse proxy set web.proxy_count so the console sees the public scheme and host")
    return None


def _guard():
    endpoint = request.endpoint
    if endpoint is None or endpoint == "static":
        return None  # 404/405 handled by Flask; static files are public
    if request.method not in SAFE_METHODS and endpoint not in READ_ONLY_EXEMPT and read_only():
        abort(403, READ_ONLY_MESSAGE)
    view = current_app.view_functions[endpoint]
    is_public = getattr(view, "_skiplock_public", False)
    # Public views never touch the database for identity: /healthz must answer even when
    # the sessions' users cannot be looked up.
    g.user = None if is_public else _identify()
    user: User | None = g.user
    if request.method not in SAFE_METHODS:
        if user and user.via == "token":
            if user.read_only:
                abort(403, "this API token is read-only: it may only read (GET, HEAD)")
        else:
            refusal = _origin_refusal()
            if refusal:
                abort(403, refusal)
            if not _csrf_ok():
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
        if _session_user(touch=False):
            return redirect(next_url)
        return render_template("login.html", next=next_url, error=None, name="")
    name = (request.form.get("name") or "").strip()
    password = request.form.get("password") or ""
    if not name or not password:
        return render_template("login.html", next=next_url, error="enter a user name and a password", name=name), 400
    state = _state()
    ip = request.remote_addr or "unknown"
    address = users_mod.client_key(ip)
    # Counted before the (slow, on purpose) password check, in one statement per counter, so
    # parallel guesses cannot overshoot; a right password gives the count back.
    refused = _throttle(address, name, state.limits)
    if refused:
        response = make_response(render_template("login.html", next=next_url, error=refused.message, name=name), 429)
        response.headers["Retry-After"] = str(refused.retry_after)
        return response
    row = users_mod.password_row(home_conn(), name)
    # The check costs tens of milliseconds of CPU, and seconds when sixty people queue for two
    # cores: it holds no pooled connection (and so no transaction) meanwhile, or the pool runs
    # dry and every other page answers 503.
    release()
    user, rehashed = users_mod.check_password(row, password)
    conn = home_conn()
    if user is None:
        users_mod.login_failed(conn, address)
        return render_template("login.html", next=next_url, error="wrong user name or password", name=name), 401
    users_mod.login_succeeded(conn, address, name)
    if rehashed:
        users_mod.save_rehash(conn, row, rehashed)
    token = users_mod.start_session(conn, user.name, ip, request.user_agent.string or "", state.sessions)
    session.clear()
    session.permanent = True
    session["sid"] = token
    session["csrf"] = secrets.token_urlsafe(32)
    audit.record(conn, actor=user.name, action="login", target=f"user:{user.name}", detail={"ip": ip})
    return redirect(next_url)


BUSY_POLL_S = 0.05  # first pause while an address's pending checks hold its places; doubles to 0.4 s


def _throttle(address: str, name: str, limits: users_mod.LoginLimits) -> users_mod.Throttled | None:
    """users.throttle, asked again while only the address's pending checks stand in the way
    (sixty people behind one NAT address), at most `limits.busy_wait` seconds; the connection is
    given back during each pause, so the waiting attempts do not starve the checks they wait for."""
    deadline = time.monotonic() + limits.busy_wait
    pause = BUSY_POLL_S
    while True:
        refused = users_mod.throttle(home_conn(), address, name, limits)
        if refused is None or not refused.busy or time.monotonic() + pause > deadline:
            return refused
        release()
        time.sleep(pause)
        pause = min(pause * 2, 0.4)


@bp.post("/logout")
@requires("viewer")
def logout():
    """Ends every session of this user on the server: a copy of any of its cookies saved before
    no longer works. One click ends a session someone else may have picked up (a stolen cookie,
    a forgotten kiosk), which is what an operator who signs out on suspicion expects."""
    users_mod.end_session(home_conn(), session.get("sid"))
    users_mod.end_user_sessions(home_conn(), g.user.name)
    session.clear()
    return redirect(url_for("auth.login"))
