"""The overview's model, built once per collection cycle by the scheduler's leader and read by
every web process (skiplock.cycle_models, sql/migrations/036_cycle_models.sql; issue 31 target 2).

Built in each web process (console/web/cycle.py), the model of a wide fleet cost each gunicorn
process seconds of Python every cycle, and while one was built the process's other threads
waited for the GIL: sixty people polling saw a p95 of 7.6 s. Here the leader builds it once,
right after the cycle's alert evaluation, on the collect job's hooks connection (`refresh`),
and a web process only reads it: one primary-key probe per request (`lookup`), and the body
(tagged JSON, `encode`/`decode`) once per process and cycle.

What keeps a stored model correct:

- It was built after the marks of the request's generation (the newest sample, evaluation,
  audited action and silence; read *before* the build, so the model is never older than they
  say), or after the same audited action and silence and the samples before: while the leader
  builds the new cycle's model, the previous one is shown (as a web process shows its previous
  model while it builds one). An operator's change moves the audited mark: until the next
  cycle the web process builds its own, as before, so the change shows at once.
- It lives in the database it describes and is read on the request's own connection (the
  primary's or its replica's): a model of one database cannot be read for another, and the
  process's cache keys it by database as every model (`CycleCache`).
- It is younger than `cycle.BUCKET_SECONDS` (`fresh`): what it says about time ("the newest
  measurement is 6 min old") is as old as an in-process model may be. When the scheduler
  stops, the stored model ages out and the web process builds its own, which says that
  measurements stopped.
- It was built with the settings the web process has (`settings_of`: the config file's alert
  rules, their hysteresis, the rate window and the redacted keys): a web process configured
  otherwise builds its own.
- Nothing in it depends on who asks: the overview's model is the same for a viewer and an
  operator (the templates, rendered per request, show what a role may do).
- The body is JSON with a closed set of tags, never pickle: a row can name no code to run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

import psycopg
from markupsafe import Markup

from console.sqlfiles import query

log = logging.getLogger(__name__)

TAG = "__t"
T = TypeVar("T")


# --- the body: JSON with a closed set of tags -----------------------------------------------

def _tagged(value: Any) -> Any:
    """`value` as plain JSON values; what JSON cannot say is a dict with TAG (a dict of the
    model that has a TAG key itself is sent as its pairs, so no data can pose as a tag)."""
    from console.web.database import Panel
    from console.web.listing import Page

    if isinstance(value, Markup):  # before str, which it is: a drawn chart stays markup
        return {TAG: "markup", "v": str(value)}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else {TAG: "float", "v": repr(value)}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and TAG not in value:
            return {k: _tagged(v) for k, v in value.items()}
        return {TAG: "dict", "v": [[_tagged(k), _tagged(v)] for k, v in value.items()]}
    if isinstance(value, list | tuple):
        return [_tagged(v) for v in value]
    if isinstance(value, datetime):
        return {TAG: "datetime", "v": value.isoformat()}
    if isinstance(value, date):
        return {TAG: "date", "v": value.isoformat()}
    if isinstance(value, timedelta):
        return {TAG: "timedelta", "v": value.total_seconds()}
    if isinstance(value, Decimal):
        return {TAG: "decimal", "v": str(value)}
    if isinstance(value, Panel):
        return {TAG: "panel", "ok": value.ok, "data": _tagged(value.data), "error": value.error}
    if isinstance(value, Page):
        return {TAG: "page", "v": {k: _tagged(getattr(value, k)) for k in
                                    ("rows", "total", "page", "limit", "query", "overall", "extra")}}
    raise TypeError(f"a stored model cannot hold a {type(value).__name__}")


def encode(model: Any) -> str:
    return json.dumps(_tagged(model), separators=(",", ":"), allow_nan=False)


def _untag(found: dict[str, Any]) -> Any:
    tag = found.get(TAG)
    if tag is None:
        return found
    from console.web.database import Panel
    from console.web.listing import Page

    v = found.get("v")
    if tag == "datetime":
        return datetime.fromisoformat(v)
    if tag == "markup":
        return Markup(v)
    if tag == "panel":
        return Panel(found["ok"], found["data"], found["error"])
    if tag == "page":
        return Page(**v)
    if tag == "dict":
        return {k: item for k, item in v}
    if tag == "date":
        return date.fromisoformat(v)
    if tag == "timedelta":
        return timedelta(seconds=v)
    if tag == "decimal":
        return Decimal(v)
    if tag == "float":
        return float(v)
    raise ValueError(f"a stored model names an unknown tag {tag!r}")


def decode(text: str) -> Any:
    return json.loads(text, object_hook=_untag)


# --- the settings a model was built with ----------------------------------------------------

def settings_of(state: Any) -> str:
    """A fingerprint of what the overview's model reads from the settings (console/web/overview.py):
    the config file's alert rules and their hysteresis, the rate window, the redacted keys."""
    from console import signals

    config = state.config
    tables = getattr(config, "tables", {}) or {}
    alerts = getattr(config, "alerts", None)
    text = json.dumps([tables.get("alerts.rules", []), getattr(alerts, "hysteresis", None),
                       signals.rate_window(config).total_seconds(), sorted(state.redact_keys)],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _marks(marks: tuple) -> dict[str, Any]:
    measured, evaluated, audited, silenced = marks[:4]
    return {"measured": measured, "evaluated": evaluated, "audited": audited, "silenced": silenced}


# --- a web process reads ----------------------------------------------------------------------

def lookup(conn: psycopg.Connection, name: str, marks: tuple, settings: str, fresh: float) -> int | None:
    """The id of the stored model `name` a request of `marks` (a generation's first four) may be
    shown (sql/cycle.sql `stored_model`), built with `settings` less than `fresh` seconds ago;
    None when there is none (or no table yet)."""
    try:
        row = conn.execute(query("cycle", "stored_model"),
                           {"name": name, **_marks(marks), "settings": settings, "fresh": fresh}).fetchone()
    except psycopg.errors.UndefinedTable:  # a database not yet migrated to 036: build in-process
        if not conn.autocommit:
            conn.rollback()
        return None
    return None if row is None else int(row[0])


def load(conn: psycopg.Connection, name: str, model_id: int) -> Any | None:
    """The body of stored model `model_id`; None when the scheduler replaced it since `lookup`."""
    row = conn.execute(query("cycle", "stored_body"), {"name": name, "id": model_id}).fetchone()
    return None if row is None else decode(row[0])


# --- the scheduler's leader builds and stores -----------------------------------------------

_apps: dict[int, Any] = {}


def _bare_app(config: Any):
    """A Flask app holding only what the overview's build reads (`state().config`, the redacted
    keys): no pool, no routes. The build runs on the caller's connection."""
    found = _apps.get(id(config))
    if found is None or found.extensions["skiplock"].config is not config:
        from flask import Flask

        from console.web import WebState

        found = Flask("console.web.cycle_store")
        found.extensions["skiplock"] = WebState(
            config=config, dsn="", pool=None, limits=None, sessions=None,
            redact_keys=frozenset(k.strip().lower() for k in config.web.redact_keys.split(",") if k.strip()))
        _apps.clear()
        _apps[id(config)] = found
    return found


Models = dict[str, tuple[Callable[[], Any], Callable[[Any], bool]]]


def refresh(conn: psycopg.Connection, config: Any, database: str, models: Models) -> dict[str, float]:
    """Build each stored model of `database` on `conn` (autocommit: each read its own short
    transaction) and store it (one statement each); {name: build seconds}. A model with a failed
    panel is not stored: the web processes build their own until the next cycle."""
    from flask import g

    from console.web import cycle
    from console.web.database import ReadFrom

    app = _bare_app(config)
    took: dict[str, float] = {}
    # The marks first: the model built after them is at least as new as they say.
    marks = cycle.marks(conn)
    with app.app_context():
        settings = settings_of(app.extensions["skiplock"])
        g._skiplock_database = database
        g._skiplock_read_from = ReadFrom(database)
        g._skiplock_conn = conn
        try:
            for name, (build, keep) in models.items():
                started = time.perf_counter()
                model = build()
                if not keep(model):
                    log.info("database %s: model %s not stored (a panel failed)", database, name)
                    continue
                body = encode(model)
                took[name] = time.perf_counter() - started
                conn.execute(query("cycle", "store_model"), {
                    "name": name, **_marks(marks), "settings": settings, "build_ms": took[name] * 1000.0,
                    "model": body})
        finally:
            g.pop("_skiplock_conn", None)  # the caller's: never given back to a pool
    return took


def stored(name: str, build: Callable[[], T], *,
           keep: Callable[[T], bool] = lambda _: True) -> tuple[T, Any] | None:
    """(the stored model `name` of the request's generation, the generation it shows), or None
    when the scheduler stored none that fits: then the caller builds its own (`cycle.cached`).
    Read once per process and stored model; `build` (the whole model, as the scheduler builds
    it) only when the row was replaced between probe and read."""
    from console.web import cycle, state
    from console.web.database import get_conn, release

    current = cycle.request_generation()
    extra = state().extra
    settings = extra.get("cycle_settings")
    if settings is None:  # the settings never change while the process runs
        settings = extra.setdefault("cycle_settings", settings_of(state()))
    found = lookup(get_conn(), name, current.marks, settings, cycle.BUCKET_SECONDS)
    if found is None:
        return None
    # The stored row's id (unique in its database) is the generation: polls get 304 until the
    # leader stores the next one, not one clock bucket, and not while it builds that one.
    shown = cycle.Generation(current.database, current.replica, ("stored", found))
    owner = cycle.cache()

    def read() -> T:
        value = load(get_conn(), name, found)
        if value is None:  # replaced since the probe: this request builds (rare: a cycle between two statements)
            value = build()
            with owner._lock:
                owner.built += 1
        return value

    return owner.get((name, "stored"), shown, read, keep=keep, before_wait=release, tally="loaded")
