"""The web console: a Flask app factory, its blueprints, and the conventions pages follow.

`create_app(config=None)` takes a `Config`, a test mapping (`{"database.dsn": ..., "web.secret_key":
...}`; keys with a dot are settings, UPPERCASE keys go to Flask's `app.config`), or nothing (then
`load_config()` reads SKIPLOCK_CONFIG and the environment). It opens one connection pool
(application_name `skiplock-web`), registers the blueprints listed in `BLUEPRINTS`, and never
starts a scheduler or any thread of its own.

How to add a page
-----------------
1. **Blueprint.** A module `console/web/<area>.py` with `bp = Blueprint("<area>", __name__)`;
   add `"console.web.<area>:bp"` to `BLUEPRINTS` below (one line). Templates go in
   `templates/<area>/`; they `{% extends "base.html" %}` and fill `title` and `content`.
2. **Nav entry.** One line in `console/web/nav.py` (`NavEntry("<area>.index", "Label", order=..)`).
   Entries whose endpoint is not registered are skipped, and a role hides it from lesser users.
3. **Roles.** (A read-only console, `web.read_only`, refuses every unsafe method before any
   of this; `can()` is then false for actions: console/web/auth.py.) Every route needs a signed-in user: by default a viewer for GET and an operator
   for POST/PUT/PATCH/DELETE. Say so explicitly with `@requires("viewer"|"operator"|"admin")`
   from `console.web.auth`; `@public` (no sign-in) is for /healthz-like routes only. The user
   is `g.user` (a `console.users.User`; `g.user.can("operator")`); in templates `user` and
   `can("operator")` (hide buttons a user may not press; the server refuses anyway).
4. **CSRF.** Every state change is a POST. Forms include `{{ csrf_field() }}`; htmx requests
   send the `X-CSRF-Token` header by themselves (hx-headers on <body>). A POST without a valid
   token gets 403 before the view runs. Requests authenticated by an API token skip CSRF.
   Every state change also writes `console.audit.record(conn, actor=actor(), reason=..., ...)`
   in the same transaction as the change: `actor()` and `reason_for(action)` come from
   console.web.actor (an API token is named with its label; an action console.actions.ACTIONS
   says needs a reason gets 422 without one).
5. **Database and panels.** `get_conn()` (console.web.database) gives the request's pooled
   connection (autocommit). Read through `run_panel(fn, *args)`: it runs `fn(conn, *args)`
   under `console.db.time_limited` and returns a `Panel` whose `.ok`, `.data`, `.error` the
   template shows with the `panel` macro (`{% from "_macros.html" import panel %}`) — a timeout
   makes that panel say "not available" and the rest of the page renders. SQL lives in
   `sql/<concern>.sql`. An unreachable database is handled for you: every page says so (503).
   A GET route names where it reads in console/web/database.py: `REPLICA_READS` (it shows
   replicated tables and may read the database's `replica_dsn`) or `PRIMARY_READS` (with why:
   it reads what only the primary has, or binds an action); a test fails until it does. Writes
   always go to the primary; `primary_conn()` is the primary whatever the route.
6. **Fragments and polling.** A live part of a page is a partial `templates/<area>/_thing.html`
   that the page `{% include %}`s and a route returns alone (`render_template` of the partial)
   for htmx. Make it poll with `hx-get="<fragment url>" hx-trigger="poll" data-poll
   hx-swap="outerHTML"` on its root element: `static/skiplock.js` fires `poll` every
   `web.poll_fast` while the tab is visible (or every N ms with `data-poll="N"`), never while
   it is hidden, and at once when it is shown again. Do not use `hx-trigger="every 1s"`: it
   polls a hidden tab. A fragment may carry `<span hidden
   data-tab-state="2 firing"></span>`; the tab title becomes "2 firing · <page> · Skiplock".
   Times: `{{ ts|utc }}`, `{{ ts|ago }}`, or the `when(ts)` macro (both).
7. **Errors.** Raise `BadRequest("what is wrong")` / `abort(400|403|404|409, "message")`; a
   `ValueError` from the domain becomes a 400 with its message. HTML gets a message page,
   /api/ and `Accept: application/json` get `{"error": ...}`, htmx gets the text (shown as a
   toast). Never let bad input become a 500.
8. **API route.** Every page has a JSON twin under `/api/v1/...` in the same blueprint,
   decorated with `@api_doc("summary", params=[Param(...)], ...)` from `console.web.api`; the
   OpenAPI document at /api/v1/openapi.json is generated from those. Compute the data once in
   a plain function and have both routes call it (`jsonify(data)` / `render_template(..., **data)`).
   Scripts authenticate with `Authorization: Bearer <token>` (`skiplock users token NAME`).

9. **Browser-side rules.** Every response carries `CONTENT_SECURITY_POLICY` (below): no inline
   `<script>`, `on…=""` handler, `javascript:` link, `<style>` or `style=""` in a template.
   Behaviour goes in `static/skiplock.js` behind a `data-` attribute (`data-confirm`,
   `data-select-all`), styles in `static/*.css`. Never `tojson` inside an attribute (use
   `json_text`); never `|safe` on data. docs/security.md says why.

Production mode
---------------
`web.production` is true unless something turns it off, so gunicorn (the Procfile) and any other
WSGI server run the console in production mode: it refuses to start without `web.secret_key`,
session cookies are `Secure`, an HTTPS request gets `Strict-Transport-Security` (behind a
proxy, set `web.proxy_count` so X-Forwarded-Proto is believed), and /metrics needs
`web.metrics_token` unless `web.metrics_public`. `skiplock serve` (the development server)
turns it off and says so; tests turn it off in their settings.

What this package will not do: start schedulers or threads, cache query results across requests,
or run a query without a statement timeout.
"""

from __future__ import annotations

import importlib
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, request
from werkzeug.middleware.proxy_fix import ProxyFix

from console.config import Config, ConfigError, load_config
from console.databases import Registry, load_databases
from console.db import (
    DatabaseError,
    MigrationChanged,
    MigrationsPending,
    connect,
    migration_state,
    verify_migrations,
)
from console.jsonbounds import MAX_BODY_DEPTH, check_text
from console.resources import resource_dir
from console.users import LoginLimits, SessionLimits

log = logging.getLogger(__name__)

# Sent with every response. Scripts, styles and images come from the console itself only: no
# inline <script>, no on*="" handler, no javascript: link, no style="" attribute, no <style>
# element (htmx is told not to inject one, nor to evaluate hx-on or js: code: see base.html).
# An HTML-injection bug that slips past autoescape then cannot run script. docs/security.md.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)

# Registered in this order. One line per blueprint: "module:attribute".
BLUEPRINTS: tuple[str, ...] = (
    "console.web.core:bp",        # /, /healthz
    "console.web.auth:bp",        # /login, /logout
    "console.web.api:bp",         # /api/v1/openapi.json
    "console.web.jobs:bp",        # /jobs, /jobs/<id>, exports, job actions
    "console.web.queues:bp",      # /queues, pause/resume
    "console.web.workers:bp",     # /workers
    "console.web.advisor:bp",     # /advisor, /api/v1/advisor
    "console.web.auditlog:bp",    # /audit
    "console.web.admin:bp",       # /admin/users (admin)
    "console.web.metrics:bp",     # /metrics (Prometheus; no session, optional bearer token)
    "console.web.alerts:bp",      # /alerts, rules, destinations, delivery log (+ /api/v1/alerts)
    "console.web.overview:bp",    # /overview: verdict, figures, queues
    "console.web.deadletters:bp",  # /deadletters: error groups, previewed bulk replay/purge
    "console.web.brokerdead:bp",   # /deadletters/broker/<queue>: a NATS queue's dead-letter stream, replay/purge
    "console.web.external:bp",    # /external/<name>: a watched queue's dead letters and its library's actions
    "console.web.maintenance:bp",  # /maintenance: runs, run now, settings, scheduler
    "console.web.health:bp",       # /health: vacuum, horizon holders, locks, wraparound, WAL
    "console.web.periodic:bp",     # /periodic: cron schedules, pause/resume, run now (+ /api/v1/periodic)
    "console.web.search:bp",       # /search: a job id, a queue or an error text (top-bar box, "/" key)
    "console.web.fleet:bp",        # /databases, /api/v1/databases: one row per configured database
    "console.web.docs:bp",         # /docs/: the operator docs (runbooks), rendered from docs/*.md
    "console.web.why:bp",          # /jobs/<id>/_why, /queues/<name>/_why (+ /api/v1/.../why): why it is not running
    "console.web.editreplay:bp",   # /jobs/<id>/edit-replay (+ /api/v1): an admin fixes a dead letter and replays it
    "console.web.exitplan:bp",     # /queues/<name>/exit-plan, /queues/<name>/move (+ /api/v1): the exit plan and the move
    "console.web.timeline:bp",     # /timeline, /timeline.md (+ /api/v1/timeline): the incident timeline, the postmortem draft
)


@dataclass
class WebState:
    """What the app keeps for its lifetime: `current_app.extensions["skiplock"]`."""

    config: Config
    dsn: str
    pool: Any  # the home database's pool (the first of `databases`)
    limits: LoginLimits
    sessions: SessionLimits
    redact_keys: frozenset[str]
    redact_hook: Any = None
    redact_text_hook: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    databases: Any = None  # console.databases.Registry: every database's pool, opened on first use
    in_flight: Any = None  # console.web.inflight.InFlight: this process's exports and webhook tests

    def close(self) -> None:
        if self.databases is not None:
            self.databases.close()  # the home pool is one of its pools
        else:
            self.pool.close()


def _load_config(config: Config | Mapping[str, Any] | None) -> tuple[Config, dict[str, Any], str | None]:
    if isinstance(config, Config):
        return config, {}, None
    mapping = dict(config or {})
    flask_keys = {k: v for k, v in mapping.items() if "." not in k}
    settings = {k: v for k, v in mapping.items() if "." in k}
    loaded = load_config(overrides=settings) if config is not None else load_config()
    explicit_dsn = settings.get("database.dsn") or None  # a test mapping's DSN beats DATABASE_URL
    return loaded, flask_keys, explicit_dsn


def _load_hook(spec: str, setting: str = "web.redact_hook"):
    if not spec:
        return None
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ConfigError(f"{setting}: {spec!r} must look like module:function")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{setting}: cannot load {spec!r}: {exc}") from None


def _check_migrations_at_start(dsn: str, wait: float) -> None:
    """Refuse to start on a database whose applied migrations differ from this version's files,
    or that an earlier release migrated and this one's migrations were not applied to yet (its
    pages would fail on the columns they add): `skiplock migrate` first.

    An unreachable database or a missing schema does not stop the start: every page says so
    (503) and the console works as soon as the database does.
    """
    try:
        with connect(dsn, application_name="skiplock-web", connect_timeout=max(1, round(wait))) as conn:
            verify_migrations(conn)
            state = migration_state(conn)
            if state.applied and state.pending:
                raise MigrationsPending(state.pending)
    except (MigrationChanged, MigrationsPending):
        raise
    except DatabaseError as exc:
        log.warning("migrations not checked at start-up: %s", exc)


def create_app(config: Config | Mapping[str, Any] | None = None) -> Flask:
    cfg, flask_keys, explicit_dsn = _load_config(config)
    from console.queue.periodic import load_entries

    load_entries(cfg, import_tasks=False)  # a bad [[periodic]] entry stops start-up here too
    from console.config import external_queues

    external_queues(cfg)  # and a bad [[external_queues]] entry (the advisor page runs their checks)
    web = cfg.web
    secret = web.secret_key
    if not secret:
        if web.production:
            raise ConfigError(
                "web.secret_key: required in production mode (set SKIPLOCK_WEB_SECRET_KEY to a long random string, "
                "e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`); `skiplock serve`, the "
                "development server, runs without one"
            )
        secret = secrets.token_hex(32)
        log.warning("web.secret_key is not set: using a random key; sessions end when the process restarts")

    app = Flask(
        "console.web",
        template_folder=str(resource_dir("templates")),
        static_folder=str(resource_dir("static")),
        static_url_path="/static",
    )
    app.config.update(
        SECRET_KEY=secret,
        SESSION_COOKIE_NAME="skiplock_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=bool(web.production),
        # The cookie lives as long as a session may; the server-side row decides (console.users).
        PERMANENT_SESSION_LIFETIME=web.session_max,
        MAX_CONTENT_LENGTH=1 << 20,
        JSON_SORT_KEYS=False,
    )
    app.config.update(flask_keys)
    from console.web.inflight import InFlight
    from console.web.routing import LazyBuildRule

    app.url_rule_class = LazyBuildRule  # URL builders compiled on first url_for (console/web/routing.py)
    from console.web.database import DatabasePrefix

    # /db/<name>/... is every page scoped to one database (inside ProxyFix, which sees the real path).
    app.wsgi_app = DatabasePrefix(app.wsgi_app)
    if web.proxy_count:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=web.proxy_count, x_proto=web.proxy_count, x_host=web.proxy_count)

    # Hooks load before the pool opens: a bad one refuses to start without leaving connections.
    redact_hook = _load_hook(web.redact_hook)
    redact_text_hook = _load_hook(web.redact_text_hook, "web.redact_text_hook")
    databases = load_databases(cfg, explicit_dsn)
    dsn = databases[0].dsn
    for database in databases:
        _check_migrations_at_start(database.dsn, web.db_wait)
    registry = Registry(databases, application_name="skiplock-web", size=cfg.database.pool_size,
                        statement_timeout_ms=cfg.database.statement_timeout_ms)
    pool = registry.pool(databases[0].name)
    app.extensions["skiplock"] = WebState(
        config=cfg,
        dsn=dsn,
        pool=pool,
        limits=LoginLimits(web.login_window, web.login_max_per_ip, web.login_free_failures, web.login_backoff_cap),
        sessions=SessionLimits(web.session_idle.total_seconds(), web.session_max.total_seconds(),
                               cfg.caps.sessions_per_user),
        redact_keys=frozenset(k.strip().lower() for k in web.redact_keys.split(",") if k.strip()),
        redact_hook=redact_hook,
        redact_text_hook=redact_text_hook,
        databases=registry,
        in_flight=InFlight(),
    )

    from console.web import auth, database, errors, templating

    templating.install(app)
    errors.install(app)
    database.install(app)
    auth.install(app)

    @app.before_request
    def bounded_json_body():
        # After the guard (auth.install): every JSON body nests at most MAX_BODY_DEPTH levels,
        # checked with a loop before any view parses it (json.loads recurses per level, and a
        # RecursionError would be a 500). MAX_CONTENT_LENGTH bounds the bytes looked at.
        if request.is_json and request.content_length:
            check_text(request.get_data(cache=True), "body", MAX_BODY_DEPTH)
    for spec in BLUEPRINTS:
        module_name, _, attr = spec.partition(":")
        app.register_blueprint(getattr(importlib.import_module(module_name), attr))

    @app.after_request
    def no_store(response):
        # Dashboards show live state: never serve a cached copy (static files may be cached).
        if request.endpoint != "static":
            response.headers["Cache-Control"] = "no-store"
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        if web.production and request.is_secure:
            # Only over HTTPS (RFC 6797 §7.2); request.is_secure believes X-Forwarded-Proto only
            # from the web.proxy_count proxies ProxyFix trusts.
            response.headers.setdefault("Strict-Transport-Security", "max-age=31536000")
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response

    return app


def state(app: Flask | None = None) -> WebState:
    from flask import current_app

    return (app or current_app).extensions["skiplock"]
