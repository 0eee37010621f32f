"""The home redirect, /healthz (no sign-in: load balancers probe it) and /favicon.ico (no
sign-in: browsers ask for it on every page, the login page included)."""

from __future__ import annotations

import logging

import psycopg
from flask import Blueprint, current_app, jsonify, redirect, render_template, url_for
from psycopg_pool import PoolTimeout

from console.db import time_limited
from console.web.api import STR, api_doc, obj
from console.web.auth import public, requires
from console.web.database import DatabaseUnreachable, get_conn
from console.web.errors import failure_reason

log = logging.getLogger(__name__)

bp = Blueprint("core", __name__)


@bp.get("/")
@requires("viewer")
def home():
    for endpoint in ("overview.index", "queues.index", "jobs.index"):
        if endpoint in current_app.view_functions:
            return redirect(url_for(endpoint))
    return render_template("home.html")


@bp.get("/favicon.ico")
@public
def favicon():
    """Browsers ask for /favicon.ico whatever the page links: the one in static/ (base.html
    links it too), rather than a 404 in every log."""
    return current_app.send_static_file("favicon.svg")


@bp.get("/healthz")
@public
@api_doc("Liveness: does the database answer?", tag="health", auth=False,
         responses={"200": "database answers",
                    "503": ("database unreachable or schema missing",
                            obj({"status": {"enum": ["unavailable"]}, "database": STR, "error": STR},
                                optional=("error",)))},
         response=obj({"status": {"enum": ["ok"]}, "database": STR}))
def healthz():
    try:
        conn = get_conn()
        with time_limited(conn, 1000) as cur:
            cur.execute("SELECT to_regclass('skiplock.jobs') IS NOT NULL AS schema")
            schema = cur.fetchone()["schema"]
    except (DatabaseUnreachable, PoolTimeout, psycopg.Error) as exc:
        # Anonymous callers learn "unreachable", not the host, user or server message: those go to the log.
        log.warning("healthz: database unreachable: %s", failure_reason(exc))
        return jsonify(status="unavailable", database="unreachable"), 503
    if not schema:
        return jsonify(status="unavailable", database="schema missing: run `skiplock migrate`"), 503
    return jsonify(status="ok", database="ok")
