"""`skiplock serve`: the web console on Werkzeug's development server.

For production run gunicorn (see the Procfile): `gunicorn --no-control-socket 'console.web:create_app()'`.
That runs in production mode (`web.production` defaults to true); this command turns it off
(no Secure cookies, a per-process secret key when none is set, /metrics open without a token)
and says so in its banner.
"""

from __future__ import annotations

import click

from console.cli.common import dsn_option, friendly_errors, main_group


@main_group.command("serve")
@dsn_option
@click.option("--host", default=None, help="Address to listen on [config: web.host].")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port [config: web.port].")
@click.option("--debug", is_flag=True, help="Reload on code changes and show tracebacks (never in production).")
@friendly_errors
@click.pass_obj
def serve_cmd(obj, host: str | None, port: int | None, debug: bool) -> None:
    """Run the web console (development server)."""
    from console.db import resolve_dsn
    from console.web import create_app

    cfg = obj.config
    if cfg.tables.get("databases"):
        # Every database of the list (the first is home); the file's other tables come along.
        from console.config import load_config

        app = create_app(load_config(cfg.path, overrides={"web.production": False}))
    else:
        dsn = resolve_dsn(obj._dsn, cfg)
        app = create_app({**_overrides(cfg), "database.dsn": dsn, "web.production": False})
    host = host or cfg.web.host
    port = port or cfg.web.port
    click.echo(f"Skiplock console on http://{host}:{port}/ (development server, production mode off: cookies "
               "without Secure, /metrics open unless web.metrics_token; use gunicorn in production)")
    app.run(host=host, port=port, debug=debug, use_reloader=debug, threaded=True)


def _overrides(cfg) -> dict:
    """The loaded config as overrides, so create_app sees the --config file too."""
    from console.config import SETTINGS

    return {s.dotted: cfg.get(s.section, s.key) for s in SETTINGS}
